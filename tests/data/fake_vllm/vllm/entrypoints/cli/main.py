"""A fake `vllm` CLI for CPU tests: `vllm serve` answers /health, /speed (the variant's speed factor) and
/metrics (Prometheus text whose counters grow by a fixed step per scrape)."""
import argparse
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer


def serve(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    a, rest = ap.parse_known_args(argv)
    speed = os.environ.get("FAKE_VLLM_SPEED", "1")
    print("INFO fake vllm serve " + " ".join(argv), flush=True)
    if os.environ.get("FAKE_INPROCESS") == "1":
        print("ValueError: vllm serve was given an in-process engine environment", flush=True)
        sys.exit(6)
    if speed == "crash":
        print("RuntimeError: fake start failure", flush=True)
        sys.exit(3)
    for flag in ("--max-num-seqs", "--max-num-batched-tokens", "--reasoning-parser", "--load-format"):
        if flag not in rest:
            print(f"missing {flag}", flush=True)
            sys.exit(4)
    if not os.path.exists(os.path.join(a.model, "tokenizer.json")):
        print("no tokenizer.json in model dir", flush=True)
        sys.exit(5)
    print("INFO Available KV cache memory: 1.77 GiB", flush=True)
    print("INFO GPU KV cache size: 116,424 tokens", flush=True)

    scrapes = [0]

    def metrics() -> bytes:
        scrapes[0] += 1
        n = scrapes[0]
        labels = '{engine="0",model_name="Qwen3.5-27B"}'
        return (f"# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.\n"
                f"# TYPE vllm:num_preemptions_total counter\n"
                f"vllm:num_preemptions_total{labels} {3.0 * n}\n"
                f"vllm:prompt_tokens_total{labels} {1000.0 * n}\n"
                f"vllm:num_requests_running{labels} 1.0\n").encode()

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            body = {"/health": b"", "/speed": speed.encode()}.get(self.path)
            if self.path == "/metrics":
                body = metrics()
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args):
            pass

    time.sleep(float(os.environ.get("FAKE_VLLM_START_S", "0.3")))
    HTTPServer((a.host, a.port), H).serve_forever()


def main():
    argv = sys.argv[1:]
    if argv[:1] == ["serve"]:
        serve(argv[1:])
    else:
        sys.exit(f"fake vllm: unsupported {argv[:2]}")


if __name__ == "__main__":
    main()
