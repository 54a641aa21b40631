"""Serving robustness benchmark (issue #20): `vllm serve` overloaded past its KV cache, mixed with malformed requests
and clients that hang up mid-stream. Not a timed benchmark: it counts what came back and checks that the server kept
its engine, gave its KV cache back and did not grow its GPU memory.

For each configuration (bf16 KV, int8_per_token_head KV; optionally with --scheduler-tpot-target-ms 30) it starts
`vllm serve` on 127.0.0.1 with dummy Qwen3.5-27B weights (--layers of them), the synthetic tokenizer, the official
start_vllm.sh flags (bench/serve_config.py CONTEST_SERVER_FLAGS), the dcu64 KV budget (bench/profiles.py) and
--attention-backend DCU_TRITON_ATTN, then:
  1. reads the KV capacity in tokens from the server log and sizes the client: enough concurrent clients that the
     tokens their requests need (prompt + max_tokens) are --overload (default 2.2) times that capacity;
  2. warm-up burst (128 short requests: full prefill chunks and the largest decode batch), drain, GPU memory "before";
  3. --load-s seconds of load from those clients: token-id completions, chat, streams (55/15/10 %), streams the
     client closes after two events (10 %) and malformed requests (10 %: every case of bench/bad_requests.py in
     turn: broken JSON, unknown model, over-long prompt, bad sampling values, out-of-range ids in every field);
  4. drain (in-flight requests finish), one probe request (so the server publishes fresh stats), then from /metrics
     the KV cache usage (target 0), preemptions and finished requests by reason, and GPU memory "after";
  5. stops the server; an engine death (server gone, /health failing, or a fatal engine error in its log) ends the
     configuration early.
Counts: requests completed, 4xx by kind (each checked against the status and `param` the catalogue expects),
unexpected answers, 5xx, transport errors and timeouts, client disconnects; the verdict per configuration is
PASS when there were no engine deaths, no 5xx, nothing unexpected, no timeouts, KV usage 0 after the drain, GPU
memory growth <= --mem-tolerance-mib and the offered load reached 2x the KV capacity.

Results: <out>/<date>-<gpu>-serve-robustness.{json,md} (kernels/results_io.py: whole files or nothing, rewritten
after every configuration), the command on top; the summary table is printed last. Exit status 0 when every
configuration ran and passed, 1 otherwise, 2 for bad arguments.

On the H200 box (one GPU; ~7-8 minutes from a cold machine, ~5 once Triton's caches are warm):
  bash ci/gpu/run.sh python -m bench.serve_robustness --out $OUT
  bash ci/gpu/run.sh python -m bench.serve_robustness --out $OUT --configs bf16-t30 --load-s 60
--dry-run prints the plan and the server commands.

Modules: robust_requests (the request mix, the HTTP client, the tally), robust_server (server state, the load,
drain, probe, warm-up), robust_report (tables); serving pieces shared with bench/serve_bench.py (serve_*.py).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass

from bench import profiles
from bench.robust_report import ATTN_FLAGS, markdown, summary_table
from bench.robust_requests import MIX, HttpClient, RequestMix, Tally, concurrency_for, parse_range
from bench.robust_server import (
    WARMUP_REQUESTS,
    Load,
    fatal_in_log,
    gpu_memory_used_mib,
    probe,
    server_state,
    wait_idle,
    warmup,
)
from bench.serve_config import CONTEST_SERVER_FLAGS, SERVED_NAME, BenchError
from bench.serve_harness import harness_env, harness_serve_args, harness_write_config, load_harness
from bench.serve_metrics import parse_server_log
from bench.serve_plan import variant_patches
from bench.serve_procs import Clock, Server, free_port, gpu_label
from bench.synth_tokenizer import write_tokenizer
from bench.workdir import scratch_dir
from kernels.results_io import write_result_pair

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VOCAB = profiles.VOCAB
DECODE_PATCH = "dcu-triton-decode-attention"


@dataclass(frozen=True)
class ConfigSpec:
    flags: tuple[str, ...]
    needs: tuple[str, ...]  # patch names (without number) the build must carry
    what: str


CONFIGS = {
    "bf16": ConfigSpec((), (DECODE_PATCH,), "bf16 KV"),
    "int8": ConfigSpec(("--kv-cache-dtype", "int8_per_token_head"), (DECODE_PATCH, "kv-cache-per-token-head"),
                       "int8_per_token_head KV"),
    "bf16-t30": ConfigSpec(("--scheduler-tpot-target-ms", "30"),
                           (DECODE_PATCH, "scheduler-decode-first-adaptive-budget"), "bf16 KV, scheduler target 30 ms"),
    "int8-t30": ConfigSpec(("--kv-cache-dtype", "int8_per_token_head", "--scheduler-tpot-target-ms", "30"),
                           (DECODE_PATCH, "kv-cache-per-token-head", "scheduler-decode-first-adaptive-budget"),
                           "int8_per_token_head KV, scheduler target 30 ms"),
}
CONFIG_OVERHEAD_S = 110.0  # a warm configuration's start (~60 s), warm-up, drain, probe and stop
CAPTURE_SIZES = [1, 2, 4, 8, 16, 32, 64, 128]


def verdict(rec: dict, a) -> tuple[bool, list[str]]:
    """PASS/FAIL of one configuration's record and the reasons it failed."""
    why = []
    if rec.get("engine_deaths"):
        why.append(f"engine died: {rec.get('death')}")
    if rec.get("error"):
        why.append(f"did not finish: {rec['error']}")
    if "tally" not in rec or "load" not in rec:
        return False, why or ["no load phase"]
    t = rec["tally"]
    if t["http_5xx"]:
        why.append(f"{t['http_5xx']} answers 5xx")
    if t["unexpected"]:
        why.append(f"{t['unexpected']} unexpected answers")
    if t["timeouts"] or t["transport_errors"]:
        why.append(f"{t['timeouts']} timeouts, {t['transport_errors']} transport errors")
    if not t["completed"]:
        why.append("no request completed")
    if rec["load"]["unfinished_at_drain"]:
        why.append(f"{rec['load']['unfinished_at_drain']} clients still waiting after the drain")
    kv = rec.get("kv_usage_after_drain")
    if kv is None or kv > 1e-6:
        why.append(f"KV cache usage after the drain {kv!r} (expected 0)")
    growth = rec.get("gpu_memory_growth_mib")
    if growth is not None and growth > a.mem_tolerance_mib:
        why.append(f"GPU memory grew {growth:.0f} MiB (tolerance {a.mem_tolerance_mib:.0f})")
    ratio = rec["load"].get("demand_ratio_mean")
    if ratio is None or ratio < 2.0:
        why.append(f"offered KV demand {ratio}x the capacity (needs >= 2x)")
    return not why, why


def run_config(name: str, a, harness, model_dir: str, log_dir: str, clock) -> dict:
    spec = CONFIGS[name]
    rec: dict = {"config": name, "what": spec.what, "flags": list(spec.flags)}
    port = free_port()
    cmd = server_cmd(a, model_dir, port, a.harness_flags, spec.flags)
    rec["server_command"] = shlex.join(cmd)
    log_path = os.path.join(log_dir, f"{name}.log")
    rec["server_log"] = os.path.relpath(log_path, a.out)
    srv = Server(cmd, harness_env(harness, a.variant, serve=True), log_path)
    client = HttpClient("127.0.0.1", port, timeout_s=a.load_s + a.drain_timeout_s + 60)
    t0 = time.monotonic()
    clock.log(f"[{name}] start vllm serve on port {port} ({spec.what}; log {log_path})")
    try:
        srv.start()
        left = a.deadline_s - clock.elapsed() - a.load_s - 30
        rec["start_s"] = round(srv.wait_healthy(port, max(30.0, min(a.start_timeout_s, left))), 1)
        info = parse_server_log(open(log_path, errors="replace").read())
        rec["server_info"] = info
        kv_tokens = int(info.get("kv_cache_tokens") or 0)
        if kv_tokens <= 0:
            raise RuntimeError("no 'GPU KV cache size: N tokens' line in the server log")
        rec["kv_capacity_tokens"] = kv_tokens
        rec["gpu_memory_idle_mib"] = gpu_memory_used_mib()
        rec["warmup"] = warmup(client, SERVED_NAME, a.warmup_requests)
        wait_idle(client, 30)
        rec["gpu_memory_before_mib"] = gpu_memory_used_mib()
        before = server_state(client) or {}
        mixes = [RequestMix(model=SERVED_NAME, vocab=a.vocab, max_model_len=a.max_model_len,
                            prompt_range=a.prompt_range, output_range=a.output_range, tokenizer=True,
                            seed=a.seed * 100003 + i, start=i) for i in range(a.max_concurrency)]
        n = concurrency_for(kv_tokens, mixes[0], a.overload, a.max_concurrency)
        rec["clients"] = n
        clock.log(f"[{name}] healthy after {rec['start_s']:.0f} s; KV {kv_tokens} tokens; warm-up "
                  f"{rec['warmup']['ok']}/{rec['warmup']['requests']} ok; {n} clients for {a.load_s:.0f} s")
        tally = Tally()
        load = Load(client, mixes[:n], tally, kv_tokens, alive=lambda: srv.proc.poll() is None)
        rec["load"] = load.run(a.load_s, a.drain_timeout_s)
        rec["load"]["sample_series"] = load.samples[:: max(1, len(load.samples) // 60)]
        idle = after = None
        if load.death is None:
            idle = wait_idle(client, max(5.0, a.drain_timeout_s - rec["load"]["client_drain_s"]))
            rec["probe_status"] = probe(client, SERVED_NAME).status
            for _ in range(10):  # the stats of the probe's last step reach /metrics with its output
                time.sleep(0.5)
                after = server_state(client)
                if after and after["kv_usage"] is not None and after["kv_usage"] <= 1e-6:
                    break
        rec["gpu_memory_after_mib"] = gpu_memory_used_mib()
        rec["tally"] = tally.summary()
        rec["idle_after_drain"] = idle
        rec["kv_usage_after_drain"] = after.get("kv_usage") if after else None
        if after and before:
            rec["preemptions"] = int(round((after["preemptions"] or 0) - (before.get("preemptions") or 0)))
            rec["finished_by_reason"] = {k: int(round(v - before.get("finished", {}).get(k, 0.0)))
                                         for k, v in after["finished"].items()}
        b, f = rec["gpu_memory_before_mib"], rec["gpu_memory_after_mib"]
        rec["gpu_memory_growth_mib"] = None if b is None or f is None else round(f - b, 1)
        health = client.get("/health")[0]
        death = load.death or (None if srv.proc.poll() is None else f"server exited ({srv.proc.returncode})")
        death = death or (None if health == 200 else f"/health answered {health}")
        rec["death"] = death
    except Exception as e:  # noqa: BLE001 - recorded; the next configuration still runs
        text = str(e).splitlines()[0][:300] if str(e) else ""
        rec["error"] = text if isinstance(e, (RuntimeError, OSError, BenchError)) else f"{type(e).__name__}: {text}"
        clock.log(f"[{name}] failed: {rec['error']}")
    finally:
        srv.stop()
        fatal = fatal_in_log(log_path)
        if fatal and not rec.get("death"):
            rec["death"] = f"log: {fatal}"
        rec["engine_deaths"] = int(bool(rec.get("death")))
        rec["seconds"] = round(time.monotonic() - t0, 1)
    rec["pass"], rec["why"] = verdict(rec, a)
    clock.log(f"[{name}] {'PASS' if rec['pass'] else 'FAIL'}" + ("" if rec["pass"] else f": {'; '.join(rec['why'])}"))
    return rec


def server_cmd(a, model_dir: str, port: int, harness_flags: list[str], config_flags=()) -> list[str]:
    return ([sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model_dir, "--host", "127.0.0.1",
             "--port", str(port)] + CONTEST_SERVER_FLAGS + a.profile_args
            + ["--max-model-len", str(a.max_model_len), "--load-format", "dummy"]
            + list(harness_flags) + ATTN_FLAGS + list(config_flags) + a.extra_flags)


# ================================================================================================ main
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="Serving robustness: overload + malformed requests + disconnects "
                                             "against vllm serve; counts, engine deaths, KV and GPU memory after.")
    ap.add_argument("--configs", default="bf16,int8", help="comma list of " + ", ".join(CONFIGS))
    ap.add_argument("--variant", default=None, help="harness variant (default: the bundle's default)")
    ap.add_argument("--layers", type=int, default=4, help="dummy model layers, a multiple of 4 in [4, 16]")
    ap.add_argument("--load-s", type=float, default=60.0, help="seconds of load per configuration")
    ap.add_argument("--drain-timeout-s", type=float, default=45.0)
    ap.add_argument("--max-model-len", type=int, default=16384)
    ap.add_argument("--prompt-tokens", default="2048-6144", help="LO-HI prompt tokens of normal requests")
    ap.add_argument("--output-tokens", default="32-160", help="LO-HI max_tokens of normal requests (ignore_eos)")
    ap.add_argument("--overload", type=float, default=2.2,
                    help="KV tokens the in-flight requests may need, as a multiple of the KV capacity (>= 2)")
    ap.add_argument("--max-concurrency", type=int, default=192, help="most client threads")
    ap.add_argument("--warmup-requests", type=int, default=WARMUP_REQUESTS,
                    help="concurrent short requests before GPU memory 'before' (default: max-num-seqs)")
    ap.add_argument("--mem-tolerance-mib", type=float, default=128.0,
                    help="GPU memory growth from after the warm-up to after the drain that still passes")
    ap.add_argument("--kv-gib", type=float, default=None, help="dcu64: KV GiB of the full 64-layer model")
    ap.add_argument("--extra-flags", default="", help="more `vllm serve` flags for every configuration")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deadline-s", type=float, default=float(os.environ.get("LEFT_S") or 510),
                    help="seconds after start by which the run must be done: a configuration that would not "
                         "finish is skipped (recorded); default $LEFT_S or 510")
    ap.add_argument("--start-timeout-s", type=float, default=330.0)
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(REPO, "bench", "results"))
    ap.add_argument("--work", default=os.path.join(scratch_dir("vllm-dcu-bench"), "robustness"),
                    help="scratch dir for the model dir (default: $BENCH_WORK/robustness, else vllm-dcu-bench/"
                         "robustness in the system's temporary folder: %(default)s)")
    ap.add_argument("--gpu", default=None, help="GPU label for file names (default: from nvidia-smi)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the server commands, run nothing")
    return ap


def check_args(a) -> None:
    a.config_list = [c.strip() for c in a.configs.split(",") if c.strip()]
    bad = [c for c in a.config_list if c not in CONFIGS]
    if bad or not a.config_list:
        raise BenchError(f"unknown configuration {','.join(bad) or '(none)'}; supported: {', '.join(CONFIGS)}")
    if len(set(a.config_list)) != len(a.config_list):
        raise BenchError(f"--configs names a configuration twice: {a.configs}")
    if a.layers not in (4, 8, 12, 16):
        raise BenchError(f"--layers must be 4, 8, 12 or 16, got {a.layers}")
    if not 5 <= a.load_s <= 600:
        raise BenchError(f"--load-s must be in [5, 600], got {a.load_s:g}")
    if not 2.0 <= a.overload <= 10.0:
        raise BenchError(f"--overload must be in [2, 10] (the load must reach 2x the KV capacity), got {a.overload:g}")
    if not 4 <= a.max_concurrency <= 512:
        raise BenchError(f"--max-concurrency must be in [4, 512], got {a.max_concurrency}")
    if not 1 <= a.warmup_requests <= 512:
        raise BenchError(f"--warmup-requests must be in [1, 512], got {a.warmup_requests}")
    if a.drain_timeout_s < 5 or a.deadline_s < 60:
        raise BenchError("--drain-timeout-s must be >= 5 and --deadline-s >= 60")
    a.prompt_range = parse_range(a.prompt_tokens, "--prompt-tokens")
    a.output_range = parse_range(a.output_tokens, "--output-tokens")
    if a.prompt_range[1] + a.output_range[1] >= a.max_model_len:
        raise BenchError(f"--prompt-tokens up to {a.prompt_range[1]} plus --output-tokens up to {a.output_range[1]} "
                         f"do not fit --max-model-len {a.max_model_len}")
    try:
        a.profile_args = profiles.profile_server_args("dcu64", a.layers, a.kv_gib)
    except ValueError as e:
        raise BenchError(str(e)) from None
    try:
        a.extra_flags = shlex.split(a.extra_flags)
    except ValueError as e:
        raise BenchError(f"--extra-flags: {e}") from None
    a.vocab = VOCAB


def _patch_key(name: str) -> str:
    return re.sub(r"^\d+-", "", name).removesuffix(".patch")


def run(a, clock: Clock) -> int:
    harness = load_harness()
    names = list(harness.variants())
    if not names:
        raise BenchError("the harness lists no variants; bundle a wheel with python -m ci.gpu.bundle --wheel ...")
    a.variant = a.variant or (harness.default_variant() if hasattr(harness, "default_variant") else names[-1])
    if a.variant not in names:
        raise BenchError(f"unknown variant {a.variant}; available: {', '.join(names)}")
    patches = variant_patches(harness, a.variant)
    keys = None if patches is None else {_patch_key(p) for p in patches}
    a.harness_flags = harness_serve_args(harness, "decode-graph", CAPTURE_SIZES)
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    gpu = a.gpu or ("h200" if a.dry_run else gpu_label())
    stem = f"{date}-{gpu}-serve-robustness"
    model_dir = os.path.join(a.work, f"model-l{a.layers}")
    prefix = "bash ci/gpu/run.sh python" if os.environ.get("VLLM_DCU_VARIANT") else "python"
    command = f"{prefix} -m bench.serve_robustness " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    clock.log(f"plan: variant {a.variant}; configurations {', '.join(a.config_list)}; {a.layers} layers; load "
              f"{a.load_s:g} s each at {a.overload:g}x KV capacity; deadline {a.deadline_s:.0f} s")
    if a.dry_run:
        for name in a.config_list:
            print(f"server {name}: " + shlex.join(server_cmd(a, model_dir, 8001, a.harness_flags,
                                                               CONFIGS[name].flags)))
        return 0
    os.makedirs(a.out, exist_ok=True)
    log_dir = os.path.join(a.out, "raw", stem, "logs")  # under $OUT, so the logs come back from the GPU box
    os.makedirs(log_dir, exist_ok=True)
    harness_write_config(harness, model_dir, a.layers)
    write_tokenizer(model_dir)
    doc = {"command": command, "stem": stem, "date": date, "gpu": gpu, "variant": a.variant,
           "variant_patches": patches, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
           "args": {k: v for k, v in vars(a).items() if isinstance(v, (str, int, float, bool, list, type(None)))},
           "kv_cache_memory_bytes": profiles.dcu64_kv_bytes(a.layers, a.kv_gib), "mix": dict(MIX),
           "server_flags": CONTEST_SERVER_FLAGS + a.profile_args + a.harness_flags + ATTN_FLAGS + a.extra_flags,
           "configs": [], "pass": False}
    doc["args"]["prompt_tokens"], doc["args"]["output_tokens"] = a.prompt_tokens, a.output_tokens

    def save():
        doc["elapsed_s"] = round(clock.elapsed(), 1)
        doc["pass"] = bool(doc["configs"]) and all(r.get("pass") for r in doc["configs"])
        return write_result_pair(a.out, stem, doc, markdown(doc))

    spent: list[float] = []
    for name in a.config_list:
        spec = CONFIGS[name]
        missing = [n for n in spec.needs if keys is not None and n not in keys]
        if missing:
            doc["configs"].append({"config": name, "what": spec.what, "skipped": f"variant {a.variant} lacks "
                                   f"patch(es) {', '.join(missing)}", "pass": False, "why": ["skipped"]})
            clock.log(f"[{name}] skipped: the build lacks {', '.join(missing)}")
            save()
            continue
        # a fresh machine's first start pays the Triton JIT (2-4 min); a later one takes ~1 min, plus warm-up,
        # load, drain and stop: the estimate is the last configuration after the first, or that sum
        need = spent[-1] if len(spent) > 1 else CONFIG_OVERHEAD_S + a.load_s
        left = a.deadline_s - clock.elapsed()
        if spent and need > left:
            doc["configs"].append({"config": name, "what": spec.what, "skipped": f"deadline: ~{need:.0f} s "
                                   f"needed, {left:.0f} s left", "pass": False, "why": ["skipped"]})
            clock.log(f"[{name}] skipped: ~{need:.0f} s needed, {left:.0f} s left before the deadline")
            save()
            continue
        t0 = time.monotonic()
        doc["configs"].append(run_config(name, a, harness, model_dir, log_dir, clock))
        spent.append(time.monotonic() - t0)
        md = save()
    md = save()
    clock.log(f"wrote {os.path.join(a.out, stem)}.json and {md}")
    print("\n".join(summary_table(doc["configs"])), flush=True)
    return 0 if doc["pass"] else 1


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    clock = Clock("robust")
    try:
        check_args(a)
        return run(a, clock)
    except BenchError as e:
        print(f"serve_robustness: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
