"""python -m vllm.dcu.tune (--model NAME | --model-config PATH/config.json) [--quick | --full] [--out PATH]
    [--sweep-budget-s S]

Measures this device and writes its tuned file (default: tuned_file.default_path of the device's identity, i.e.
VLLM_DCU_TUNED_FILE or <cache>/tuned/<arch>-<device>.json). Phases, one progress line each: decode attention, prefill
attention, the decode GEMV, the 8-bit KV write. --quick (default): the launch tables' entries only (compile, check
against upstream, time beside it); --full: first a sweep of launch candidates around each entry (decode <= 12 per
width, prefill <= 8 per width, GEMV <= 7 per shape and row bucket; --sweep-budget-s caps the sweep's time, candidates
left out are recorded as skipped). The file is written at the end, whole or not at
all: an error or Ctrl-C halfway leaves none. Bad input: one ``error: ...`` line, exit 2.
Triton's CPU interpreter (TRITON_INTERPRET=1) runs the flow at toy sizes (for tests; its times mean nothing).
"""
from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

from . import shapes as shapes_mod

PHASES = ("decode", "prefill", "gemv", "kv_write")


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise shapes_mod.ShapeError(message)


def parse_args(argv):
    ap = _Parser(prog="python -m vllm.dcu.tune", description=__doc__.split("\n\n")[0])
    model = ap.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", help=f"a named shape set: {', '.join(sorted(shapes_mod.NAMED))}")
    model.add_argument("--model-config", help="a Hugging Face config.json of the model")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="the launch tables' entries only (default)")
    mode.add_argument("--full", action="store_true", help="sweep launch candidates around each entry first")
    ap.add_argument("--out", help="write the tuned file here instead of the device's default path")
    ap.add_argument("--sweep-budget-s", type=float, default=None, metavar="S",
                    help="--full: try no further candidate S seconds after the start (the tables' entries are always "
                         "measured; default: no limit)")
    args = ap.parse_args(argv)
    if args.sweep_budget_s is not None and not args.sweep_budget_s > 0:
        ap.error(f"--sweep-budget-s must be a positive number of seconds, got {args.sweep_budget_s:g}")
    return args


def _log(msg):
    print(msg, file=sys.stderr, flush=True)


def _setup(args):
    """(model shapes, cases, device, output path, identity); ShapeError on bad input."""
    model = shapes_mod.named(args.model) if args.model else shapes_mod.from_config(args.model_config)
    if args.out and Path(args.out).is_dir():
        raise shapes_mod.ShapeError(f"--out {args.out} is a folder; give the file's path")
    import os

    import torch

    from .._kernels import emulated_arch, tuned_file

    try:
        emulated_arch()
    except ValueError as e:
        raise shapes_mod.ShapeError(str(e)) from None
    interpreter = os.environ.get("TRITON_INTERPRET") == "1"
    if not interpreter and not torch.cuda.is_available():
        raise shapes_mod.ShapeError("no GPU here (TRITON_INTERPRET=1 runs the flow in Triton's CPU interpreter)")
    from .common import device

    dev = device()
    cases = shapes_mod.TOY_CASES if dev.type == "cpu" else shapes_mod.ENGINE_CASES
    identity = tuned_file.device_identity(dev)
    out = Path(args.out) if args.out else tuned_file.default_path(identity)
    return model, cases, dev, out, identity


def tune(args) -> int:
    model, cases, dev, out, identity = _setup(args)
    from .._kernels import ShapeKey, tuned_file

    from . import attention, gemv, kv_write, report

    from .common import SWEEP_DEADLINE

    mode = "full" if args.full else "quick"
    t_start = time.perf_counter()
    SWEEP_DEADLINE["t"] = time.monotonic() + args.sweep_budget_s if args.sweep_budget_s else None
    _log(f"tune: {model.name} ({model.heads_q} q / {model.heads_kv} kv heads x {model.head_dim}, pages "
         f"{model.pages}, {len(model.gemms)} GEMMs) on {identity['device']} ({identity['arch']}), {mode}; "
         f"writes {out}")
    rows, sides, launch, phases = [], [], {}, {}
    gemv_table = {}
    for phase in PHASES:
        t0 = time.perf_counter()
        if phase in ("decode", "prefill"):
            got, override = attention.run(phase, model, cases, dev, args.full, rows, _log)
            sides += got
            if override:
                launch[phase] = override
            what = f"{len(got)} launch kinds"
        elif phase == "gemv":
            gemv_table, override = gemv.run(model, dev, args.full, rows, _log)
            if override:
                launch["gemv"] = override
            what = f"{len(gemv_table)} shapes x 4 row buckets"
        else:
            got = kv_write.run(model, cases, dev, rows, _log)
            sides += got
            what = f"{len(got)} launch kinds"
        phases[phase] = round(time.perf_counter() - t0, 1)
        _log(f"tune: {phase}: {what} in {phases[phase]:.1f} s")
    paths = {s.path: report.decide(s, "the torch reference" if s.path.startswith("kv_write") else "upstream")
             for s in sides}
    doc = tuned_file.new_doc(identity, {"name": model.name, "attention": model.attention,
                                        "gemv": [ShapeKey(n, k, "bfloat16", False, silu).id
                                                 for _, n, k, silu in model.gemms]}, mode)
    doc["created"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    doc["tune"].update(seconds=round(time.perf_counter() - t_start, 1), phases=phases)
    doc.update(launch=launch, paths={p: paths[p] for p in tuned_file.PATHS if p in paths}, gemv=gemv_table, rows=rows)
    tuned_file.write(out, doc)
    print(report.table(doc["paths"], launch, gemv_table))
    _log(f"tune: wrote {out} (total {doc['tune']['seconds']:.1f} s)")
    return 0


def main(argv=None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        return tune(args)
    except shapes_mod.ShapeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted; no tuned file written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
