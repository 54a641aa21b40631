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

Run it on the GPU box through the harness, from the repository root:
  bash ci/gpu/run.sh python -m bench.serve_bench --tiers 4-8K,8-16K,16-32K --requests 10
One command must stay under 10 minutes: split an ablation with --step K/N
(each step runs baseline, its share of the other builds, baseline again).
--dry-run prints the plan without a GPU.

Modules: serve_config (the contest's flags, BenchConfig: the checked, frozen command line), serve_plan (builds,
order, flags, commands), serve_harness (the GPU harness), serve_procs (server and client processes),
serve_metrics (logs, counters, results), serve_run (one step), report (tables and plot).
"""
from __future__ import annotations

import argparse
import os
import sys

from bench import profiles, prompts
from bench.serve_config import PROTOCOLS, BenchConfig, BenchError
from bench.serve_procs import Clock
from bench.serve_run import run
from bench.workdir import scratch_dir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description="Serving benchmark: vllm serve + vllm bench serve per build, tier and protocol.",
        epilog="Example (one step of a 3-step ablation): bash ci/gpu/run.sh python -m bench.serve_bench "
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
    ap.add_argument("--mode", default="graph", help="graph (CUDA graphs + torch.compile, as the contest), "
                         "decode-graph (no torch.compile, full CUDA graphs for decode: starts in about a minute, "
                         "decode kernels as under graphs; eager prefill) or eager")
    ap.add_argument("--step", default="1/1", help="K/N: run the K-th of N shares of the non-baseline builds")
    ap.add_argument("--no-repeat-baseline", action="store_true", help="run the baseline once, not first and last")
    ap.add_argument("--baseline-last", action="store_true",
                    help="run the baseline once, after the other builds (pairs with a run in the usual order to put "
                         "a fresh machine's cold start on each side once); needs every --load-rate given")
    ap.add_argument("--variant-flags", action="append", default=[], metavar="NAME=FLAGS",
                    help="extra `vllm serve` flags for one build, after the harness's (the last occurrence of a "
                         "flag wins), e.g. 'dcu.3.ab12=--attention-backend DCU_TRITON_ATTN'; repeatable; "
                         "NAME '*' = every build, '+' = every build but the baseline")
    ap.add_argument("--variant-env", action="append", default=[], metavar="NAME=KEY=VALUE",
                    help="an environment variable for the `vllm serve` process of one build (over the harness's "
                         "environment), e.g. 'full=VLLM_LOGGING_LEVEL=DEBUG'; repeatable (the last value of a "
                         "KEY wins); NAME '*' = every build, '+' = every build but the baseline")
    ap.add_argument("--no-patch-flags", action="store_true",
                    help="do not add the serve flags a build's patches need on CUDA (PATCH_SERVE_FLAGS)")
    ap.add_argument("--capture-sizes", default=None,
                    help="CUDA-graph capture sizes, e.g. 1,2,4,8,16,32 (shorter starts; default: vLLM's, as the "
                         "contest)")
    ap.add_argument("--seed", type=int, default=prompts.DEFAULT_SEED)
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(REPO, "bench", "results"))
    ap.add_argument("--what", default=None, help="file-name label (default from the arguments)")
    ap.add_argument("--gpu", default=None, help="GPU label for file names (default: from nvidia-smi)")
    ap.add_argument("--work", default=scratch_dir("vllm-dcu-bench"),
                    help="scratch dir for the model dir and prompts (default: $BENCH_WORK, else vllm-dcu-bench in "
                         "the system's temporary folder: %(default)s)")
    ap.add_argument("--deadline-s", type=float, default=480.0,
                    help="seconds after start by which every benchmark must be done: a server that would not "
                         "finish is skipped (recorded), a benchmark is cut at the deadline; the default leaves "
                         "~2 of the device's 10 minutes for harness setup, the last stop and the report")
    ap.add_argument("--start-timeout-s", type=float, default=420.0)
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the commands, run nothing")
    return ap


def config_from_argv(argv: list[str] | None = None) -> BenchConfig:
    """The checked configuration of a command line; BenchError names the bad option."""
    return BenchConfig.from_args(build_parser().parse_args(argv))


def main(argv=None) -> int:
    clock = Clock()
    try:
        return run(config_from_argv(argv), clock)
    except BenchError as e:
        print(f"serve_bench: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
