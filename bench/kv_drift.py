"""How far 8-bit KV caches move the model's logprobs from bf16 KV, per context length, through the engine.

    bash ci/gpu/run.sh python bench/kv_drift.py [CONFIG ...] [--layers 16] [--lengths 1024,4096,8192,16384,32768]
        [--steps 16] [--out DIR] [--deadline-s S]

CONFIG is NAME=VARIANT:BACKEND:KV_DTYPE[:KEY=VALUE,...] as in bench/e2e_offline.py; the first is the reference
(bf16 KV). Default: bf16=full:DCU_TRITON_ATTN:auto int8=full:DCU_TRITON_ATTN:int8_per_token_head
fp8=full:DCU_TRITON_ATTN:fp8_per_token_head (the default variant is the bundle's last one). Each configuration
runs bench/logprob_eq.py's worker in its own process with its variant on PYTHONPATH: a Qwen3.5-27B-shaped model of
--layers layers with the scaled dummy weights of ci/gpu/scaled_weights.py (--scales JSON overrides), one greedy
request per length with the full logprob vector of every sampled position and each prompt token's logprob.

Reported per configuration and prompt length, against the reference: the first generated token's largest logprob
change and KL(ref || other), the worst over the greedy steps compared (while both produce the same tokens, through
the first difference), the prompt tokens' RMS / largest logprob change, where the tokens first differ, and each
number next to the limit bench/logprob_tolerance.py derives from the 8-bit and bf16 rounding (the GPU test's limits).
Writes <date>-<gpu>-kv-drift.{json,md} into --out (default $OUT or bench/results/; the command on top) and prints
the table last. Expected: ~45-60 s per configuration on a warm H200 at the defaults (16 layers, 62K prompt
tokens, 85 full-vocabulary steps), ~3 min for the three.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import shlex
import sys
import time
from pathlib import Path

from bench import logprob_compare, logprob_eq
from bench.workdir import scratch_dir

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIGS = ["bf16=full:DCU_TRITON_ATTN:auto", "int8=full:DCU_TRITON_ATTN:int8_per_token_head",
                   "fp8=full:DCU_TRITON_ATTN:fp8_per_token_head"]


def _load(name: str, path: Path):
    """A repository file as a module, registered in sys.modules (dataclasses look their module up there)."""
    key = f"vllm_dcu_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[key] = mod
    spec.loader.exec_module(mod)
    return mod


def parse_config(spec: str) -> dict:
    """NAME=VARIANT:BACKEND:KV_DTYPE[:KEY=VALUE,...] -> dict; ValueError with the expected form."""
    try:
        name, rest = spec.split("=", 1)
        variant, backend, kv, *extra = rest.split(":", 3)
        env = dict(pair.split("=", 1) for pair in extra[0].split(",")) if extra else {}
        if not name or not variant or not backend or not kv or not all(k.isidentifier() for k in env):
            raise ValueError
    except ValueError:
        raise ValueError(f"bad configuration {spec!r}; expected NAME=VARIANT:BACKEND:KV_DTYPE[:KEY=VALUE,...]") \
            from None
    return dict(name=name, variant=variant, backend=backend, kv=kv, env=env)


def build_report(command: str, gpu: str, args, specs: list[dict], runs: dict, failed: dict) -> tuple[dict, list]:
    """(JSON document, markdown lines) from the loaded runs; failed: {name: reason} for configurations without
    results."""
    ref = specs[0]["name"]
    doc = dict(command=command, gpu=gpu, layers=args.layers, steps=args.steps, lengths=args.lengths,
               configs=specs, failed=failed, pairs={})
    lines = [f"# KV-cache drift through the engine: 8-bit vs bf16 KV ({gpu})", "", f"Command: `{command}`", "",
             f"{args.layers} layers (Qwen3.5-27B shapes, scaled dummy weights, ci/gpu/scaled_weights.py), greedy, "
             f"{args.steps} steps after the first token; reference `{ref}`. Logprob changes in nats; "
             "'x / y' = measured / limit of tests/gpu/test_engine_equivalence.py (bench/logprob_tolerance.py).", ""]
    if ref in runs:
        lines += logprob_compare.REPORT_HEADER
        derivations = []
        for spec in specs[1:]:
            name = spec["name"]
            if name not in runs:
                continue
            metrics = logprob_compare.compare(runs[ref], runs[name])
            tol = logprob_compare.tolerances_for(runs[ref]["meta"], runs[name]["meta"], metrics)
            doc["pairs"][f"{name} vs {ref}"] = dict(
                metrics={str(n): m for n, m in metrics.items()},
                limits={str(n): t.to_dict() for n, t in tol.items()},
                ratios={str(n): r for n, r in logprob_compare.ratios(metrics, tol).items()},
                failures=logprob_compare.check(metrics, tol))
            lines += logprob_compare.report_rows(f"{name} vs {ref}", metrics, tol)
            derivations.append(tol[max(tol)].derivation)
        lines += ["", "Limits (at the longest prompt):", ""] + [f"- {d}" for d in derivations]
        lines += ["", "Engine start and time per prompt (s):", "", "| config | start | " +
                  " | ".join(str(n) for n in args.lengths) + " |", "|---|---:|" + "---:|" * len(args.lengths)]
        for name, run in runs.items():
            m = run["meta"]
            lines.append(f"| {name} | {m['start_s']} | " + " | ".join(
                str(m["lengths"].get(str(n), {}).get("wall_s", "-")) for n in args.lengths) + " |")
    for name, why in failed.items():
        lines += ["", f"{name}: no result ({why.splitlines()[0] if why else 'failed'})"]
    return doc, lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("configs", nargs="*", help="NAME=VARIANT:BACKEND:KV_DTYPE[:KEY=VALUE,...] (first = reference)")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--lengths", default="1024,4096,8192,16384,32768")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scales", default="{}", help="ci/gpu/scaled_weights.py Scales as JSON")
    ap.add_argument("--timeout-s", type=float, default=420.0, help="per configuration")
    ap.add_argument("--deadline-s", type=float, default=None, help="start no configuration that could not end by then")
    ap.add_argument("--work", default=scratch_dir("vllm-dcu-kv-drift"),
                    help="scratch folder (default: $BENCH_WORK, else vllm-dcu-kv-drift in the system's temporary "
                         "folder: %(default)s)")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "bench" / "results"))
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    harness = _load("harness", REPO / "ci" / "gpu" / "harness.py")
    try:
        specs = [parse_config(s) for s in (args.configs or DEFAULT_CONFIGS)]
        args.lengths = sorted(int(x) for x in args.lengths.split(","))
        scales = json.loads(args.scales)
        logprob_eq.scales(scales)
        if len(specs) < 2:
            raise ValueError("give a reference and at least one configuration to compare with it")
        if len({s["name"] for s in specs}) != len(specs):
            raise ValueError("configuration names must differ")
        for s in specs:
            logprob_eq.make_config(s["name"], s["backend"], s["kv"], work=args.work, layers=args.layers,
                                   lengths=args.lengths, steps=args.steps)  # validates
        known = harness.variants()
        for s in specs:
            if s["variant"] not in known:
                raise ValueError(f"unknown variant {s['variant']!r}; the bundle has {known}")
    except (ValueError, json.JSONDecodeError, harness.HarnessError) as e:
        print(f"kv_drift: error: {e}", file=sys.stderr)
        return 2
    runs, failed = {}, {}
    for s in specs:
        cfg = logprob_eq.make_config(s["name"], s["backend"], s["kv"], work=args.work, layers=args.layers,
                                     lengths=args.lengths, steps=args.steps, seed=args.seed, scales_dict=scales,
                                     env=s["env"])
        timeout = args.timeout_s
        if args.deadline_s is not None:
            left = args.deadline_s - (time.monotonic() - t0) - 10
            if left < 60:
                failed[s["name"]] = f"skipped: {left:.0f} s left before the deadline"
                print(f"kv_drift {s['name']}: {failed[s['name']]}", flush=True)
                continue
            timeout = min(timeout, left)
        env = harness.variant_env(s["variant"], inprocess=True)
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        t = time.monotonic()
        ok, text = logprob_eq.launch(cfg, env, timeout, Path(args.work) / f"{s['name']}.log")
        print(f"kv_drift {s['name']}: {'done' if ok else 'FAILED'} in {time.monotonic() - t:.0f} s", flush=True)
        if ok:
            runs[s["name"]] = logprob_eq.load_run(cfg["out_dir"])
        else:
            failed[s["name"]] = text
            print(text, flush=True)
    gpu = "unknown"
    try:
        import torch

        gpu = torch.cuda.get_device_name(0)
    except Exception:
        pass
    command = "bash ci/gpu/run.sh python bench/kv_drift.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    doc, lines = build_report(command, gpu, args, specs, runs, failed)
    from kernels import results_io  # the repository is on the path (pytest, ci/gpu/run.sh)
    stem = f"{datetime.date.today().isoformat()}-{results_io.device_tag(gpu)}-kv-drift"
    md = results_io.write_result_pair(args.out, stem, doc, lines)
    print(md.read_text(), flush=True)
    return 0 if not failed and specs[0]["name"] in runs else 1


if __name__ == "__main__":
    sys.exit(main())
