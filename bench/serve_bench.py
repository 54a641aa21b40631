"""Serving benchmark driver: `vllm serve` + `vllm bench serve` per build, tier and protocol.

For each build (a variant of the GPU harness; the baseline first and, unless
--no-repeat-baseline, again last) this starts `vllm serve` on 127.0.0.1 at a
fresh port with dummy Qwen3.5-27B weights (--layers of them) and the synthetic
tokenizer, waits for /health, runs `vllm bench serve` once per protocol and
tier with the same prompts and seed, stops the server, and appends the result
to <out>/<date>-<gpu>-<what>.json. At the end it writes the markdown report and
the plot (bench/report.py) and prints the report's tables.

Protocols:
  contest  the official run_throughput.sh flags (chat endpoint, concurrency 1,
           request rate 1, 2 warm-ups, temperature 0, percentiles 50/95/99 of
           TTFT/TPOT/ITL/E2EL), except that the output length is fixed
           (--custom-output-len 250 --ignore-eos; dummy weights never emit EOS).
  load     the same requests at concurrency 16 and a Poisson request rate that
           keeps the baseline busy without queueing without bound.
Memory profiles (bench/profiles.py): h200 (whole card) or dcu64 (the KV budget
of a 64 GB DCU, scaled to --layers).

Run it on the GPU box through the harness:
  bash ci/gpu/run.sh python bench/serve_bench.py --tiers 4-8K,8-16K,16-32K --requests 10
One command must stay under 10 minutes: split an ablation with --step K/N
(each step runs baseline, its share of the other builds, baseline again).
--dry-run prints the plan without a GPU.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import inspect
import json
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench import profiles, prompts  # noqa: E402
from bench.bench_client import MARK  # noqa: E402
from bench.synth_tokenizer import write_tokenizer  # noqa: E402

PROTOCOLS = ("contest", "load")
MODES = ("graph", "decode-graph", "eager")
SERVED_NAME = "Qwen3.5-27B"
MAX_MODEL_LEN = 32768
LOAD_CONCURRENCY = 16
# Fallback load rates (requests/s) at 16 layers when no contest result of the baseline
# is there to size them; scaled by 16/layers.
LOAD_RATE_TABLE = {"4-8K": 4.0, "8-16K": 1.8, "16-32K": 0.6}
# The dcu64 profile caps the KV cache (about four 16-32K requests fit at once), so capacity is far lower than
# the h200 numbers above: the bf16 baseline (16 layers, H200, 2026-11-30 load run) completed ~0.15 req/s at
# 16-32K when offered 0.6 req/s. Upper bounds for auto rates under dcu64 (16-32K measured, the shorter tiers
# scaled by how many more requests fit: estimates), scaled by 16/layers.
LOAD_RATE_CAP_DCU64 = {"4-8K": 0.4, "8-16K": 0.2, "16-32K": 0.1}
LOAD_UTILIZATION = 0.6

# The official start_vllm.sh, minus what the benchmark host decides (model path, port).
CONTEST_SERVER_FLAGS = [
    "--served-model-name", SERVED_NAME, "--trust-remote-code",
    "--dtype", "bfloat16", "--tensor-parallel-size", "1", "--max-num-seqs", "128",
    "--max-num-batched-tokens", "4096",
    "--default-chat-template-kwargs", '{"enable_thinking": false}',
    "--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder",
]
# The official run_throughput.sh `vllm bench serve` flags; output length replaced (see module doc).
CONTEST_BENCH_FLAGS = [
    "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
    "--dataset-name", "custom", "--no-oversample", "--max-concurrency", "1", "--request-rate", "1",
    "--temperature", "0", "--disable-shuffle", "--num-warmups", "2",
    "--save-detailed", "--extra-body", '{"temperature":0.0}',
    "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,95,99", "--save-result",
]
DEVIATIONS = [
    "output length fixed at --custom-output-len {output_len} with --ignore-eos (official: 1024 without "
    "ignore-eos; dummy weights never emit EOS, so every request would run to 1024 tokens; the real mean "
    "output is ~250 tokens)",
    "--load-format dummy and a synthetic word-level tokenizer (bench/synth_tokenizer.py); the chat template, "
    "the qwen3 reasoning parser and the qwen3_coder tool parser run as in the official script",
    "--max-model-len 32768 (the official script leaves it to the model's 262144; other teams report the "
    "contest locks 32768)",
    "the harness's flags for serving without vLLM's compiled ops on the H200: {harness_flags} (with "
    "--language-model-only the vision tower is not loaded; the official server loads it)",
    "--layers {layers} of 64 (per-layer shapes unchanged; 16 keeps 4 full-attention + 12 DeltaNet layers)",
    "prompts are synthetic long documents with needles (bench/prompts.py), not the contest jsonl",
]


# Patches that the DCU (ROCm) turns on by default but CUDA only by a flag: a build that carries one gets the
# flag on the H200 too, so the benchmark measures what the DCU would run. Keyed by the patch name without its
# number; patch authors add their entry here.
PATCH_SERVE_FLAGS = {
    "dcu-triton-decode-attention": ["--attention-backend", "DCU_TRITON_ATTN"],
}


class BenchError(Exception):
    """Bad input or an unsupported combination: one line, exit status 2."""


# ----------------------------------------------------------------------------- harness


def load_harness():
    """The GPU harness (ci/gpu/harness.py), or the module named by VLLM_DCU_BENCH_HARNESS (tests)."""
    path = os.environ.get("VLLM_DCU_BENCH_HARNESS") or os.path.join(REPO, "ci", "gpu", "harness.py")
    if not os.path.exists(path):
        raise BenchError(f"GPU harness not found at {path}; run through `bash ci/gpu/run.sh python "
                         f"bench/serve_bench.py ...` after `python -m ci.gpu.bundle --wheel ...`")
    d = os.path.dirname(os.path.abspath(path))
    if d not in sys.path:
        sys.path.insert(0, d)
    spec = importlib.util.spec_from_file_location("vllm_dcu_bench_harness", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def harness_write_config(harness, model_dir: str, layers: int) -> None:
    fn = getattr(harness, "write_config", None)
    if fn is None:
        path = os.path.join(os.path.dirname(os.path.abspath(harness.__file__)), "dummy_model.py")
        spec = importlib.util.spec_from_file_location("vllm_dcu_bench_dummy_model", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        fn = mod.write_config
    fn(model_dir, layers)


def _accepts(fn, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def harness_env(harness, name: str, serve: bool) -> dict:
    """Environment for a process of variant `name`; a server gets its engine core in a child process."""
    if serve and _accepts(harness.variant_env, "inprocess"):
        return harness.variant_env(name, inprocess=False)
    return harness.variant_env(name)


def harness_serve_args(harness, mode: str, capture_sizes: list[int] | None = None) -> list[str]:
    """The harness's serve flags; eager mode adds --enforce-eager unless the harness takes `eager=`."""
    fn = harness.serve_args
    kw = {}
    cc = {}
    if capture_sizes:
        cc["cudagraph_capture_sizes"] = capture_sizes
    if mode == "decode-graph":  # no torch.compile (fast starts), full CUDA graphs for decode batches
        cc.update({"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"})
    if cc:
        if not _accepts(fn, "compilation_config"):
            raise BenchError("--capture-sizes and --mode decode-graph need a harness serve_args() that takes "
                             "compilation_config")
        kw["compilation_config"] = cc
    if _accepts(fn, "eager"):
        args = list(fn(eager=(mode == "eager"), **kw))
    else:
        args = list(fn(**kw))
        if mode == "eager" and "--enforce-eager" not in args:
            args.append("--enforce-eager")
    if mode in ("graph", "decode-graph") and "--enforce-eager" in args:
        raise BenchError("harness serve_args() forces --enforce-eager; use --mode eager")
    return args


# ----------------------------------------------------------------------------- arguments


def parse_list(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def parse_step(value: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)/(\d+)", value or "")
    if not m or not (1 <= int(m.group(1)) <= int(m.group(2))):
        raise BenchError(f"--step must be K/N with 1 <= K <= N, got {value!r}")
    return int(m.group(1)), int(m.group(2))


def parse_load_rate(value: str, tiers: list[str]) -> dict[str, float] | None:
    """None for auto, else {tier: rate}; accepts one number or tier=rate pairs."""
    if value == "auto":
        return None
    try:
        if "=" not in value:
            r = float(value)
            rates = {t: r for t in tiers}
        else:
            rates = {}
            for kv in parse_list(value):
                k, v = kv.split("=", 1)
                prompts.check_tiers([k])
                rates[k] = float(v)
    except ValueError as e:
        raise BenchError(f"--load-rate must be 'auto', a number or tier=rate pairs: {e}") from None
    if any(r <= 0 for r in rates.values()):
        raise BenchError("--load-rate values must be positive")
    return rates


def parse_variant_flags(items: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in items:
        name, sep, flags = item.partition("=")
        if not sep or not name.strip() or not flags.strip():
            raise BenchError(f"--variant-flags needs NAME=FLAGS, got {item!r}")
        try:
            out.setdefault(name.strip(), []).extend(shlex.split(flags))
        except ValueError as e:
            raise BenchError(f"--variant-flags {item!r}: {e}") from None
    return out


def flags_for(a, variant: str) -> list[str]:
    """Extra serve flags of a build: its patches' (PATCH_SERVE_FLAGS), then --variant-flags '*' (every
    build), '+' (every build but the baseline) and its own."""
    others = [] if variant == a.baseline_name else a.flags_by_variant.get("+", [])
    auto = getattr(a, "auto_flags", {}).get(variant, [])
    return auto + a.flags_by_variant.get("*", []) + others + a.flags_by_variant.get(variant, [])


def variant_patches(harness, name: str) -> list[str] | None:
    """Patch file names the variant was built with (its vllm/dcu_patchset.json), None if unknown."""
    try:
        path = os.path.join(str(harness.variant_dir(name)), "vllm", "dcu_patchset.json")
        with open(path) as f:
            return [p["name"] for p in json.load(f).get("patches", [])]
    except (AttributeError, OSError, ValueError, KeyError, TypeError):
        return None


def patch_flags(patches: list[str] | None) -> list[str]:
    flags: list[str] = []
    for name in patches or []:
        key = re.sub(r"^\d+-", "", name).removesuffix(".patch")
        flags += PATCH_SERVE_FLAGS.get(key, [])
    return flags


def validate_variants(requested: list[str], available: list[str], baseline: str | None) -> tuple[str, list[str]]:
    """(baseline, other builds in order); raises BenchError naming what is available."""
    if not available:
        raise BenchError("the harness lists no variants; bundle wheels with python -m ci.gpu.bundle --wheel ...")
    unknown = [v for v in requested if v not in available]
    if unknown:
        raise BenchError(f"unknown variant {','.join(unknown)}; available: {', '.join(available)}")
    base = baseline or available[0]
    if base not in available:
        raise BenchError(f"unknown baseline {base}; available: {', '.join(available)}")
    others = [v for v in (requested or available) if v != base]
    seen: set[str] = set()
    others = [v for v in others if not (v in seen or seen.add(v))]
    return base, others


def step_chunk(items: list[str], k: int, n: int) -> list[str]:
    """The k-th of n contiguous, near-equal chunks of items (k from 1)."""
    if n > max(1, len(items)):
        raise BenchError(f"--step {k}/{n}: only {len(items)} non-baseline build(s) to split")
    q, r = divmod(len(items), n)
    start = (k - 1) * q + min(k - 1, r)
    return items[start:start + q + (1 if k - 1 < r else 0)]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description="Serving benchmark: vllm serve + vllm bench serve per build, tier and protocol.",
        epilog="Example (one step of a 3-step ablation): bash ci/gpu/run.sh python bench/serve_bench.py "
               "--step 1/3 --tiers 4-8K,8-16K,16-32K --requests 10")
    ap.add_argument("--variants", default="", help="builds to run (default: all harness variants)")
    ap.add_argument("--baseline", default=None, help="baseline variant (default: the harness's first)")
    ap.add_argument("--tiers", default=",".join(prompts.TIERS), help="comma list of " + ", ".join(prompts.TIERS))
    ap.add_argument("--protocols", default="contest", help="comma list of " + ", ".join(PROTOCOLS))
    ap.add_argument("--profile", default="h200", help="memory profile: " + ", ".join(profiles.PROFILES))
    ap.add_argument("--kv-gib", type=float, default=None,
                    help="dcu64: KV GiB of the full 64-layer model (default: bench/profiles.py arithmetic)")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--requests", type=int, default=10, help="contest requests per tier (official sets: 50)")
    ap.add_argument("--load-requests", type=int, default=32, help="load-protocol requests per tier")
    ap.add_argument("--load-rate", default="auto",
                    help="load-protocol request rate: auto (0.6 of the baseline's capacity at concurrency 1, "
                         "capped under dcu64), a number, or tier=rate pairs")
    ap.add_argument("--output-len", type=int, default=250)
    ap.add_argument("--mode", default="graph", help="graph (CUDA graphs + torch.compile, as the contest), decode-graph (no "
                         "torch.compile, full CUDA graphs for decode: starts in about a minute, decode kernels as "
                         "under graphs; eager prefill) or eager")
    ap.add_argument("--step", default="1/1", help="K/N: run the K-th of N shares of the non-baseline builds")
    ap.add_argument("--no-repeat-baseline", action="store_true", help="run the baseline once, not first and last")
    ap.add_argument("--baseline-last", action="store_true",
                    help="run the baseline once, after the other builds (pairs with a run in the usual order to put "
                         "a fresh machine's cold start on each side once); needs every --load-rate given")
    ap.add_argument("--variant-flags", action="append", default=[], metavar="NAME=FLAGS",
                    help="extra `vllm serve` flags for one build, after the harness's (the last occurrence of a "
                         "flag wins), e.g. 'dcu.3.ab12=--attention-backend DCU_TRITON_ATTN'; repeatable; "
                         "NAME '*' = every build, '+' = every build but the baseline")
    ap.add_argument("--no-patch-flags", action="store_true",
                    help="do not add the serve flags a build's patches need on CUDA (PATCH_SERVE_FLAGS)")
    ap.add_argument("--capture-sizes", default=None,
                    help="CUDA-graph capture sizes, e.g. 1,2,4,8,16,32 (shorter starts; default: vLLM's, as the "
                         "contest)")
    ap.add_argument("--seed", type=int, default=prompts.DEFAULT_SEED)
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(REPO, "bench", "results"))
    ap.add_argument("--what", default=None, help="file-name label (default from the arguments)")
    ap.add_argument("--gpu", default=None, help="GPU label for file names (default: from nvidia-smi)")
    ap.add_argument("--work", default=os.environ.get("BENCH_WORK", "/tmp/vllm-dcu-bench"),
                    help="scratch dir for the model dir, prompts and logs")
    ap.add_argument("--deadline-s", type=float, default=480.0,
                    help="seconds after start by which every benchmark must be done: a server that would not "
                         "finish is skipped (recorded), a benchmark is cut at the deadline; the default leaves "
                         "~2 of the device's 10 minutes for harness setup, the last stop and the report")
    ap.add_argument("--start-timeout-s", type=float, default=420.0)
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the commands, run nothing")
    return ap


def check_args(a) -> None:
    try:
        a.tier_list = prompts.check_tiers(parse_list(a.tiers))
    except ValueError as e:
        raise BenchError(str(e)) from None
    if not a.tier_list:
        raise BenchError(f"--tiers is empty; supported: {','.join(prompts.TIERS)}")
    a.protocol_list = parse_list(a.protocols)
    bad = [p for p in a.protocol_list if p not in PROTOCOLS]
    if bad or not a.protocol_list:
        raise BenchError(f"unknown protocol {','.join(bad) or '(none)'}; supported: {', '.join(PROTOCOLS)}")
    if a.profile not in profiles.PROFILES:
        raise BenchError(f"unknown memory profile {a.profile}; supported: {', '.join(profiles.PROFILES)}")
    if a.mode not in MODES:
        raise BenchError(f"unknown --mode {a.mode}; supported: {', '.join(MODES)}")
    try:
        profiles.check_layers(a.layers)
        a.profile_args = profiles.profile_server_args(a.profile, a.layers, a.kv_gib)
    except ValueError as e:
        raise BenchError(str(e)) from None
    if a.kv_gib is not None and a.profile != "dcu64":
        raise BenchError("--kv-gib applies to --profile dcu64 only")
    if not 1 <= a.requests <= prompts.DEFAULT_COUNT or not 1 <= a.load_requests <= prompts.DEFAULT_COUNT:
        raise BenchError(f"--requests and --load-requests must be in [1, {prompts.DEFAULT_COUNT}]")
    if not 1 <= a.output_len <= 1024:
        raise BenchError(f"--output-len must be in [1, 1024], got {a.output_len}")
    a.step_k, a.step_n = parse_step(a.step)
    a.load_rates = parse_load_rate(a.load_rate, a.tier_list)
    if a.baseline_last and "load" in a.protocol_list and any(t not in (a.load_rates or {}) for t in a.tier_list):
        raise BenchError("--baseline-last with the load protocol needs a --load-rate for every tier (the auto rate "
                         "comes from the baseline's contest run)")
    a.flags_by_variant = parse_variant_flags(a.variant_flags)
    a.baseline_name = a.baseline
    try:
        a.capture_list = [int(x) for x in parse_list(a.capture_sizes)] if a.capture_sizes else None
    except ValueError:
        raise BenchError(f"--capture-sizes must be a comma list of integers, got {a.capture_sizes!r}") from None
    if a.capture_list is not None and (not a.capture_list or min(a.capture_list) < 1):
        raise BenchError(f"--capture-sizes must be positive integers, got {a.capture_sizes!r}")


# ----------------------------------------------------------------------------- plan


def make_plan(a, baseline: str, others: list[str]) -> list[dict]:
    """Server runs in order: [{"variant", "repeat"}]; baseline first (and last), or only last (--baseline-last)."""
    chunk = step_chunk(others, a.step_k, a.step_n) if others else []
    if a.baseline_last:
        return [{"variant": v, "repeat": 0} for v in chunk] + [{"variant": baseline, "repeat": 0}]
    plan = [{"variant": baseline, "repeat": 0}]
    plan += [{"variant": v, "repeat": 0} for v in chunk]
    if not a.no_repeat_baseline:
        plan.append({"variant": baseline, "repeat": 1})
    return plan


def server_cmd(a, model_dir: str, port: int, harness_flags: list[str], variant_flags=()) -> list[str]:
    return ([sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model_dir,
             "--host", "127.0.0.1", "--port", str(port)]
            + CONTEST_SERVER_FLAGS + a.profile_args
            + ["--max-model-len", str(MAX_MODEL_LEN), "--load-format", "dummy"]
            + list(harness_flags) + list(variant_flags))


def bench_cmd(a, protocol: str, tier: str, port: int, dataset: str, result_dir: str, result_file: str,
              rate: float | None, meta: dict) -> list[str]:
    """Arguments of one `vllm bench serve` call (run by bench/bench_client.py)."""
    cmd = ["--host", "127.0.0.1", "--port", str(port)] + list(CONTEST_BENCH_FLAGS)
    cmd += ["--dataset-path", dataset, "--custom-output-len", str(a.output_len), "--ignore-eos",
            "--seed", str(a.seed), "--disable-tqdm",
            "--result-dir", result_dir, "--result-filename", result_file]
    if protocol == "contest":
        cmd += ["--num-prompts", str(a.requests)]
    else:
        i = cmd.index("--max-concurrency")
        cmd[i + 1] = str(LOAD_CONCURRENCY)
        i = cmd.index("--request-rate")
        cmd[i + 1] = f"{rate:.4g}"
        cmd += ["--num-prompts", str(a.load_requests)]
    cmd += ["--metadata"] + [f"{k}={v}" for k, v in meta.items()]
    return cmd


def auto_load_rate(contest_bench: dict | None, tier: str, layers: int, profile: str = "h200") -> tuple[float, str]:
    """(rate, how it was chosen): 0.6 x the baseline's capacity estimated from its concurrency-1 run of the tier.

    Capacity is bounded by prefill (one request's TTFT of GPU time each) and by the
    concurrency cap (16 requests in flight, each for about its concurrency-1 E2E latency);
    without such a run, LOAD_RATE_TABLE. Under the dcu64 profile the rate is also capped by
    LOAD_RATE_CAP_DCU64 (the KV cache, not compute, limits it).
    """
    if contest_bench and contest_bench.get("mean_ttft_ms") and contest_bench.get("mean_e2el_ms"):
        by_prefill = 1000.0 / contest_bench["mean_ttft_ms"]
        by_cap = LOAD_CONCURRENCY * 1000.0 / contest_bench["mean_e2el_ms"]
        rate, how = LOAD_UTILIZATION * min(by_prefill, by_cap), "0.6 of the baseline's capacity from its concurrency-1 run"
    else:
        rate, how = LOAD_RATE_TABLE[tier] * 16 / layers, "fixed table, no concurrency-1 run of the baseline"
    if profile == "dcu64" and LOAD_RATE_CAP_DCU64[tier] * 16 / layers < rate:
        rate, how = LOAD_RATE_CAP_DCU64[tier] * 16 / layers, "dcu64 KV-capacity cap"
    return rate, how


def server_estimate(spent: list[float]) -> float | None:
    """Seconds the next build (start + every tier) is expected to take, from the builds run so far (in order).

    The first build of a fresh machine pays the Triton JIT and compile caches for everyone after it (its start
    and first warm-ups took 2-3x a warm build's time on the H200), so alone it counts at half; once a later
    build has run, the largest of the later ones is the estimate.
    """
    if not spent:
        return None
    return max(spent[1:]) if len(spent) > 1 else 0.5 * spent[0]


# ----------------------------------------------------------------------------- running


class Clock:
    def __init__(self):
        self.t0 = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def log(self, msg: str) -> None:
        e = int(self.elapsed())
        print(f"[bench +{e // 60:02d}:{e % 60:02d}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_total_gib() -> float | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        return float(out) / 1024.0
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None


def memory_overhead_gib(info: dict, total_gib: float | None, utilization: float = 0.95) -> float | None:
    """What the server kept outside weights and KV cache (activation peak + non-torch memory), in GiB:
    utilization x card - weights - KV. Measured here, it checks the dcu64 estimate (bench/profiles.py)."""
    if total_gib is None or "weights_gib" not in info or "kv_cache_gib" not in info:
        return None
    return round(utilization * total_gib - info["weights_gib"] - info["kv_cache_gib"], 2)


def gpu_label() -> str:
    try:
        name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "gpu"
    m = re.search(r"\b([A-Z]+\d+[A-Z]*)\b", name.replace("NVIDIA", ""))
    return (m.group(1) if m else name.split()[-1]).lower()


_LOG_PATTERNS = {
    "weights_gib": r"Model loading took ([\d.]+) GiB",
    "kv_cache_gib": r"Available KV cache memory: ([\d.]+) GiB",
    "kv_cache_tokens": r"GPU KV cache size: ([\d,]+) tokens",
    "max_concurrency_x": r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x",
    "engine_init_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
    "compile_s": r"torch\.compile took ([\d.]+) s in total",
    "graph_capture_s": r"Graph capturing finished in ([\d.]+) secs",
    "graph_capture_gib": r"Graph capturing finished in [\d.]+ secs, took ([\d.]+) GiB",
    "vllm_version": r"vLLM (?:API )?server version ([^\s,]+)",
}


def parse_server_log(text: str) -> dict:
    out = {}
    for key, pat in _LOG_PATTERNS.items():
        m = re.findall(pat, text)
        if m:
            v = m[-1].replace(",", "")
            try:
                out[key] = float(v) if key != "vllm_version" else v
            except ValueError:
                out[key] = v
    return out


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# Server-side Prometheus counters recorded around each benchmark (their increase over the run, warm-ups included):
# what the client's latencies cannot show, e.g. requests preempted (and recomputed) when the KV cache runs out.
SERVER_COUNTERS = {"vllm:num_preemptions_total": "preemptions", "vllm:prompt_tokens_total": "prompt_tokens",
                   "vllm:generation_tokens_total": "generation_tokens",
                   "vllm:prefix_cache_queries_total": "prefix_cache_queries",
                   "vllm:prefix_cache_hits_total": "prefix_cache_hits"}


def parse_counters(text: str) -> dict[str, float]:
    """{short name: value summed over label sets} of SERVER_COUNTERS in a Prometheus text exposition."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m and m.group(1) in SERVER_COUNTERS:
            try:
                out[SERVER_COUNTERS[m.group(1)]] = out.get(SERVER_COUNTERS[m.group(1)], 0.0) + float(m.group(3))
            except ValueError:
                continue
    return out


def scrape_counters(port: int) -> dict[str, float] | None:
    """The server's SERVER_COUNTERS now, or None when /metrics cannot be read (informational only)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return parse_counters(r.read().decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None


def counter_increase(before: dict | None, after: dict | None) -> dict | None:
    if before is None or after is None:
        return None
    return {k: int(round(after[k] - before.get(k, 0.0))) for k in after}


class Server:
    def __init__(self, cmd: list[str], env: dict, log_path: str):
        self.cmd, self.env, self.log_path = cmd, env, log_path
        self.proc = None

    def start(self) -> None:
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=REPO)

    def wait_healthy(self, port: int, timeout_s: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with status {self.proc.returncode} while starting: "
                                   f"{last_error(self.log_path)}\n{tail(self.log_path)}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except OSError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"server not healthy after {timeout_s:.0f} s: {last_error(self.log_path)}\n"
                           f"{tail(self.log_path)}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                _kill_group(self.proc.pid)
                self.proc.wait(timeout=20)
        # The API server can exit before its engine-core child has let go of the GPU: wait for the whole
        # process group (ours, from start_new_session) to be gone before the next server asks for memory.
        t0 = time.monotonic()
        while _group_alive(self.proc.pid) and time.monotonic() - t0 < 30:
            time.sleep(0.5)
        if _group_alive(self.proc.pid):
            _kill_group(self.proc.pid)
            time.sleep(2.0)
        self.log.close()


def last_error(path: str) -> str:
    """The log's last line that names an error, else its last non-empty line."""
    try:
        with open(path, errors="replace") as f:
            lines = [x.strip() for x in f if x.strip()]
    except OSError:
        return "(no log)"
    for x in reversed(lines):
        if re.search(r"Error|error:|Exception|Traceback", x):
            return x[:300]
    return lines[-1][:300] if lines else "(empty log)"


class BenchClient:
    """bench/bench_client.py in the client's environment; runs one `vllm bench serve` per call.

    spawn() returns at once, so vLLM's import overlaps the first server's start; the first run()
    waits for it to be ready.
    """

    def __init__(self, env: dict, log_path: str):
        self.env, self.log_path = env, log_path
        self.proc = None
        self.ready = False
        self.ready_wait_s = 0.0  # of the last run(): time spent waiting for vLLM's import
        self.marks: queue.Queue = queue.Queue()
        self.log = open(log_path, "a")

    def spawn(self) -> None:
        self.proc = subprocess.Popen([sys.executable, os.path.join(REPO, "bench", "bench_client.py")],
                                     env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, cwd=REPO, start_new_session=True)
        self.ready = False
        self.marks = queue.Queue()
        threading.Thread(target=self._pump, args=(self.proc, self.marks), daemon=True).start()

    def _pump(self, proc, marks) -> None:
        for line in proc.stdout:
            self.log.write(line)
            self.log.flush()
            if line.startswith(MARK):
                marks.put(json.loads(line[len(MARK):]))
        marks.put({"rc": 1, "error": f"bench client exited ({last_error(self.log_path)})", "eof": True})

    def _wait(self, timeout_s: float) -> dict:
        try:
            return self.marks.get(timeout=max(1.0, timeout_s))
        except queue.Empty:
            raise TimeoutError from None

    def run(self, argv: list[str], timeout_s: float, label: str) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.spawn()
        self.ready_wait_s = 0.0
        if not self.ready:
            t0 = time.monotonic()
            try:
                st = self._wait(timeout_s)
            except TimeoutError:
                self.close()
                raise BenchError(f"bench client not ready after {timeout_s:.0f} s; see {self.log_path}") from None
            if not st.get("ready"):
                raise BenchError(f"bench client failed to start: {st.get('error') or last_error(self.log_path)}")
            self.ready = True
            self.ready_wait_s = time.monotonic() - t0
        self.log.write(f"\n===== {label}: vllm bench serve {shlex.join(argv)}\n")
        self.log.flush()
        self.proc.stdin.write(json.dumps(argv) + "\n")
        self.proc.stdin.flush()
        try:
            return self._wait(timeout_s)
        except TimeoutError:
            self.close()  # a stuck client is replaced for the next call
            raise

    def close(self) -> None:
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=15)
        self.proc = None
        self.ready = False


def tail(path: str, lines: int = 25) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


BENCH_KEYS = ["completed", "failed", "duration", "total_input_tokens", "total_output_tokens",
              "request_throughput", "output_throughput", "total_token_throughput", "request_rate",
              "max_concurrency", "max_concurrent_requests"]


def summarize_bench(raw: dict) -> tuple[dict, dict]:
    """(metrics, per_request) from a `vllm bench serve --save-detailed` result."""
    m = {k: raw.get(k) for k in BENCH_KEYS}
    for k, v in raw.items():
        if re.fullmatch(r"(mean|median|std|p[\d.]+)_(ttft|tpot|itl|e2el)_ms", k):
            m[k] = v
    per = {}
    ttfts, itls, outs = raw.get("ttfts") or [], raw.get("itls") or [], raw.get("output_lens") or []
    errors = raw.get("errors") or [""] * len(ttfts)
    if ttfts:
        per["ttft_ms"] = [round(t * 1000, 3) for t, e in zip(ttfts, errors) if not e]
        tpots = []
        for t_itl, n, e in zip(itls, outs, errors):
            if not e and n and n > 1:
                tpots.append(round(sum(t_itl) * 1000 / (n - 1), 4))
        per["tpot_ms"] = tpots
        per["input_len"] = raw.get("input_lens") or []
        per["output_len"] = outs
    return m, per


class Results:
    """The step's JSON, rewritten after every run so a killed command still leaves it."""

    def __init__(self, path: str, header: dict):
        self.path = path
        self.doc = dict(header, runs=[], skipped=[])

    def add(self, run: dict) -> None:
        self.doc["runs"].append(run)
        self.save()

    def skip(self, what: str, why: str) -> None:
        self.doc["skipped"].append({"what": what, "why": why})
        self.save()

    def save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.doc, f, indent=1)
        os.replace(tmp, self.path)


def default_what(a) -> str:
    parts = ["serve", "-".join(a.protocol_list), a.profile, f"l{a.layers}"]
    if a.mode != "graph":
        parts.append(a.mode)
    if a.step_n > 1:
        parts.append(f"step{a.step_k}of{a.step_n}")
    return "-".join(parts)


def run(a, clock: Clock) -> int:
    harness = load_harness()
    available = list(harness.variants())
    baseline, others = validate_variants(parse_list(a.variants), available, a.baseline)
    plan = make_plan(a, baseline, others)
    a.baseline_name = baseline
    a.patches = {v: variant_patches(harness, v) for v in dict.fromkeys(p["variant"] for p in plan)}
    a.auto_flags = {} if a.no_patch_flags else {v: patch_flags(ps) for v, ps in a.patches.items()}
    stray = [n for n in a.flags_by_variant if n not in ("*", "+") and n not in {p["variant"] for p in plan}]
    if stray:
        raise BenchError(f"--variant-flags names {','.join(stray)}, not in this run's plan "
                         f"({', '.join(dict.fromkeys(p['variant'] for p in plan))})")
    harness_flags = harness_serve_args(harness, a.mode, a.capture_list)
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    gpu = a.gpu or ("h200" if a.dry_run else gpu_label())
    total_gib = None if a.dry_run else gpu_total_gib()
    stem = f"{date}-{gpu}-{a.what or default_what(a)}"
    os.makedirs(a.out, exist_ok=True)
    model_dir = os.path.join(a.work, f"model-l{a.layers}")
    prompt_dir = os.path.join(a.work, "prompts")
    raw_dir = os.path.join(a.out, "raw", stem)
    log_dir = os.path.join(raw_dir, "logs")  # under $OUT, so the logs come back from the GPU box
    # run.sh's `python` target sets VLLM_DCU_VARIANT; record the command the way it was started
    prefix = "bash ci/gpu/run.sh python" if os.environ.get("VLLM_DCU_VARIANT") else "python"
    command = f"{prefix} bench/serve_bench.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])

    clock.log(f"plan: {' -> '.join(p['variant'] + ('(again)' if p['repeat'] else '') for p in plan)}; "
              f"tiers {','.join(a.tier_list)}; protocols {','.join(a.protocol_list)}; profile {a.profile}; "
              f"layers {a.layers}; mode {a.mode}")
    if a.dry_run:
        for v in dict.fromkeys(p["variant"] for p in plan):
            print(f"server {v}: " + shlex.join(server_cmd(a, model_dir, 8001, harness_flags, flags_for(a, v))))
        for proto in a.protocol_list:
            for tier in a.tier_list:
                rate = (a.load_rates or {}).get(tier) or auto_load_rate(None, tier, a.layers, a.profile)[0]
                print(f"bench {proto} {tier}: vllm bench serve " + shlex.join(bench_cmd(
                    a, proto, tier, 8001, os.path.join(prompt_dir, f"{tier}_throughput.jsonl"),
                    raw_dir, "RESULT.json", rate if proto == "load" else None, {"variant": "VARIANT"})))
        return 0

    os.makedirs(raw_dir, exist_ok=True)
    os.makedirs(log_dir, exist_ok=True)
    clock.log(f"model dir {model_dir}: dummy config ({a.layers} layers) + synthetic tokenizer")
    harness_write_config(harness, model_dir, a.layers)
    write_tokenizer(model_dir)
    prompt_info = prompts.write_tier_files(prompt_dir, a.tier_list, prompts.DEFAULT_COUNT, a.seed)
    clock.log("prompts: " + ", ".join(f"{t} sha256 {d['sha256'][:12]}" for t, d in prompt_info.items()))

    header = {
        "schema": 1, "command": command, "date": date, "gpu": gpu, "gpu_total_gib": total_gib, "stem": stem,
        "args": {k: v for k, v in vars(a).items() if isinstance(v, (str, int, float, bool, list, type(None)))},
        "baseline": baseline, "plan": plan, "prompts": prompt_info,
        "server_flags": CONTEST_SERVER_FLAGS + a.profile_args + ["--max-model-len", str(MAX_MODEL_LEN),
                                                                 "--load-format", "dummy"] + harness_flags,
        "variant_patches": a.patches,
        "variant_flags": {v: flags_for(a, v) for v in dict.fromkeys(p["variant"] for p in plan) if flags_for(a, v)},
        "bench_flags": CONTEST_BENCH_FLAGS + ["--custom-output-len", str(a.output_len), "--ignore-eos"],
        "load": {"concurrency": LOAD_CONCURRENCY, "rates": a.load_rates or "auto"},
        "deviations": [d.format(output_len=a.output_len, harness_flags=" ".join(harness_flags) or "(none)",
                                layers=a.layers) for d in DEVIATIONS]
        + ([f"CUDA-graph capture sizes {a.capture_sizes} (vLLM's default, as in the contest, captures up to "
            "256; larger batches run piecewise either way)"] if a.capture_list else [])
        + (["--mode eager: no torch.compile and no CUDA graphs (the contest runs with both)"]
           if a.mode == "eager" else [])
        + (["--mode decode-graph: no torch.compile (prefill runs eager), full CUDA graphs for decode batches "
            "(the contest compiles and captures piecewise graphs for prefill too)"] if a.mode == "decode-graph" else []),
        "profile_detail": ({"kv_cache_memory_bytes": profiles.dcu64_kv_bytes(a.layers, a.kv_gib),
                            **profiles.dcu64_breakdown()} if a.profile == "dcu64"
                           else {"gpu_memory_utilization": 0.95}),
    }
    for fn in ("variant_info", "describe"):
        if hasattr(harness, fn):
            try:
                header["variants"] = {v: getattr(harness, fn)(v) for v in {p["variant"] for p in plan}}
            except Exception as e:  # informational only
                header["variants_error"] = str(e)
            break
    results = Results(os.path.join(a.out, stem + ".json"), header)
    # One client process for every build: the baseline's `vllm bench serve`, imported once.
    client = BenchClient(harness_env(harness, baseline, serve=False), os.path.join(log_dir, "bench-client.log"))
    client.spawn()
    try:
        load_rates = dict(a.load_rates or {})
        spent_by_server: list[float] = []
        last_bench_s = 0.0
        for i, item in enumerate(plan):
            name, rep = item["variant"], item["repeat"]
            label = f"{name}{' (again)' if rep else ''}"
            remaining = a.deadline_s - clock.elapsed()
            est_server_s = server_estimate(spent_by_server)
            if est_server_s is not None and est_server_s > remaining:
                clock.log(f"skip {label}: needs ~{est_server_s:.0f} s, {remaining:.0f} s left before the deadline")
                results.skip(label, f"deadline: ~{est_server_s:.0f} s needed, {remaining:.0f} s left")
                continue
            t_server = time.monotonic()
            port = free_port()
            log_path = os.path.join(log_dir, f"{i:02d}-{name}-{rep}.log")
            srv = Server(server_cmd(a, model_dir, port, harness_flags, flags_for(a, name)),
                         harness_env(harness, name, serve=True), log_path)
            clock.log(f"[{i + 1}/{len(plan)}] start {label} on port {port} (log {log_path})")
            base_run = {"step": stem, "variant": name, "repeat": rep, "order": i, "profile": a.profile,
                        "layers": a.layers, "mode": a.mode}
            try:
                srv.start()
                start_s = srv.wait_healthy(port, min(a.start_timeout_s, max(30.0, remaining)))
                clock.log(f"{label} healthy after {start_s:.0f} s")
                server_info = {"start_s": round(start_s, 1)}
                for proto in a.protocol_list:
                    for tier in a.tier_list:
                        if proto == "load" and tier not in load_rates:
                            contest = next((r["bench"] for r in results.doc["runs"] if r["variant"] == baseline
                                            and r["protocol"] == "contest" and r["tier"] == tier
                                            and r.get("bench")), None)
                            rate, how = auto_load_rate(contest, tier, a.layers, a.profile)
                            load_rates[tier] = round(rate, 3)
                            results.doc["load"]["rates_used"] = load_rates
                            results.doc["load"].setdefault("rates_how", {})[tier] = how
                        rate = load_rates.get(tier) if proto == "load" else None
                        fname = f"{i:02d}-{name}-{rep}-{proto}-{tier}.json"
                        cmd = bench_cmd(a, proto, tier, port, prompt_info[tier]["path"], raw_dir, fname, rate,
                                        {"variant": name, "repeat": rep, "protocol": proto, "tier": tier,
                                         "profile": a.profile, "layers": a.layers})
                        run_rec = dict(base_run, protocol=proto, tier=tier, load_rate=rate,
                                       raw_file=os.path.relpath(os.path.join(raw_dir, fname), a.out))
                        left = a.deadline_s - clock.elapsed()
                        if left < max(5.0, last_bench_s):
                            results.skip(f"{label} {proto} {tier}", "deadline")
                            clock.log(f"skip {label} {proto} {tier}: deadline")
                            continue
                        clock.log(f"{label} {proto} {tier}: {a.requests if proto == 'contest' else a.load_requests} "
                                  f"requests{'' if rate is None else f' at {rate:.3g} req/s, concurrency 16'}")
                        t0 = time.monotonic()
                        counters0 = scrape_counters(port)
                        try:
                            status = client.run(cmd, left, f"{label} {proto} {tier}")
                            if status.get("rc") != 0:
                                raise RuntimeError(f"vllm bench serve failed: {status.get('error')}")
                            with open(os.path.join(raw_dir, fname)) as f:
                                raw = json.load(f)
                            run_rec["bench"], run_rec["per_request"] = summarize_bench(raw)
                            counters = counter_increase(counters0, scrape_counters(port))
                            if counters is not None:
                                run_rec["server_counters"] = counters
                            b = run_rec["bench"]
                            clock.log(f"  {b['output_throughput']:.1f} out tok/s, "
                                      f"TTFT P99 {b.get('p99_ttft_ms', 0):.1f} ms, "
                                      f"TPOT P99 {b.get('p99_tpot_ms', 0):.2f} ms, {b['completed']} ok / "
                                      f"{b['failed']} failed ({time.monotonic() - t0:.0f} s)")
                        except TimeoutError:
                            run_rec["error"] = f"timeout after {left:.0f} s"
                            clock.log(f"  {run_rec['error']}")
                        except (RuntimeError, OSError, ValueError) as e:
                            run_rec["error"] = str(e)
                            clock.log(f"  failed: {e}")
                        last_bench_s = time.monotonic() - t0 - client.ready_wait_s
                        run_rec["server"] = server_info
                        results.add(run_rec)
            except RuntimeError as e:
                clock.log(f"{label} failed: {str(e).splitlines()[0]}")
                results.add(dict(base_run, protocol=None, tier=None, error=str(e)))
            finally:
                srv.stop()
                info = {}
                if os.path.exists(log_path):
                    with open(log_path, errors="replace") as f:
                        info = parse_server_log(f.read())
                if a.profile == "h200" and memory_overhead_gib(info, total_gib) is not None:
                    info["overhead_gib"] = memory_overhead_gib(info, total_gib)
                for r in results.doc["runs"]:
                    if r["order"] == i and "server" in r:
                        r["server"].update(info)
                results.save()
                kv = (f"; KV cache {info['kv_cache_gib']} GiB, {int(info.get('kv_cache_tokens', 0))} tokens"
                      if "kv_cache_gib" in info else "")
                clock.log(f"stopped {label}{kv}")
            spent_by_server.append(time.monotonic() - t_server)
    finally:
        client.close()
    results.doc["elapsed_s"] = round(clock.elapsed(), 1)
    results.save()

    from bench import report
    md_path, png_path = report.write_report([results.path], os.path.join(a.out, stem))
    clock.log(f"wrote {results.path}, {md_path}" + (f", {png_path}" if png_path else ""))
    with open(md_path) as f:  # the tables last (the setup notes stay in the file)
        print(f.read().split("\n## Setup", 1)[0].rstrip() + "\n", flush=True)
    ok = [r for r in results.doc["runs"] if r.get("bench")]
    return 0 if ok else 1


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    clock = Clock()
    try:
        check_args(a)
        return run(a, clock)
    except BenchError as e:
        print(f"serve_bench: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
