"""Fake `vllm bench serve` for CPU tests: add_cli_args() and main(args) like vllm.benchmarks.serve.

Asks the server for its speed factor and writes a result JSON shaped like `--save-detailed` output.
Latency model per request: ttft = input_len / (20000 * speed) s, tpot = 5 / speed ms.
"""
import json
import os
import sys
import urllib.request


def add_cli_args(ap):
    for k in ("--port", "--num-prompts", "--custom-output-len", "--max-concurrency"):
        ap.add_argument(k, type=int, required=True)
    for k in ("--dataset-path", "--result-dir", "--result-filename", "--backend", "--endpoint", "--request-rate"):
        ap.add_argument(k, required=True)
    ap.add_argument("--ignore-eos", action="store_true")
    ap.add_argument("--metadata", nargs="*", default=[])
    for k in ("--dataset-name", "--temperature", "--num-warmups", "--extra-body", "--percentile-metrics",
              "--metric-percentiles", "--seed", "--host"):
        ap.add_argument(k)
    for k in ("--no-oversample", "--disable-shuffle", "--save-detailed", "--save-result", "--disable-tqdm"):
        ap.add_argument(k, action="store_true")


def main(a):
    if not a.ignore_eos or a.backend != "openai-chat" or a.endpoint != "/v1/chat/completions":
        sys.exit("bench flags are not the contest's")
    speed = float(urllib.request.urlopen(f"http://127.0.0.1:{a.port}/speed").read())
    rows = [json.loads(line) for line in open(a.dataset_path)][: a.num_prompts]
    ins = [r["target_tokens"] for r in rows]
    n, out = len(rows), a.custom_output_len
    ttfts = [i / (20000 * speed) for i in ins]
    tpot = 0.005 / speed
    itls = [[tpot] * (out - 1) for _ in rows]
    e2el = [t + tpot * (out - 1) for t in ttfts]
    dur = sum(e2el) / min(a.max_concurrency, n)

    def pct(xs, q):
        xs = sorted(xs)
        pos = (len(xs) - 1) * q / 100
        lo = int(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    res = {"completed": n, "failed": 0, "duration": dur, "total_input_tokens": sum(ins),
           "total_output_tokens": n * out, "request_throughput": n / dur, "output_throughput": n * out / dur,
           "total_token_throughput": (sum(ins) + n * out) / dur, "max_concurrency": a.max_concurrency,
           "request_rate": a.request_rate, "input_lens": ins, "output_lens": [out] * n, "ttfts": ttfts,
           "itls": itls, "errors": [""] * n, "generated_texts": [""] * n}
    for name, xs in (("ttft", ttfts), ("tpot", [tpot] * n), ("itl", [tpot] * n), ("e2el", e2el)):
        ms = [x * 1000 for x in xs]
        res[f"mean_{name}_ms"] = sum(ms) / n
        res[f"median_{name}_ms"] = pct(ms, 50)
        for q in (50, 95, 99):
            res[f"p{q}_{name}_ms"] = pct(ms, q)
    for kv in a.metadata:
        k, v = kv.split("=", 1)
        res[k] = v
    os.makedirs(a.result_dir, exist_ok=True)
    with open(os.path.join(a.result_dir, a.result_filename), "w") as f:
        json.dump(res, f)
    print("Output token throughput (tok/s): %.2f" % res["output_throughput"])
