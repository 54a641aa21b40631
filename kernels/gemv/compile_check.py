"""Compile the decode GEMV ahead of time for a GPU target, without a GPU, and report its resources.

    python -m kernels.gemv.compile_check [--target sm90|gfx936|gfx928|...] [--sweep] [--variants] [--json]

For each launch configuration of the target's entry in launch_params (every row bucket and shape
override; plain, split-K partial and fused SiLU-mul variants, bf16) the kernel is compiled with
Triton's own compiler for that GPU (CUDA: sm90 via the ptxas Triton ships; DCU: gfx90a, the wave64
target upstream LLVM knows, as a proxy for gfx936/gfx928, which only Hygon's toolchain compiles)
and its registers, spills, shared memory / LDS, 16-byte-load and MMA / MFMA counts and, on CUDA, async-copy
counts are printed. --sweep adds bench.py's sweep grid, --variants the configurations bench.py --variants times
(every shape's one-row entry with the K loop plain or pipelined K_STAGES 2 / 3 / 4 deep). Must run
without TRITON_INTERPRET=1.
"""
import argparse
import json
import os
import re
import sys

from ..compile_tools import amdgcn_usage, gpu_target, run_cuda_tool
from . import launch_params

# Triton signature of _gemv_kernel (bf16 operands); ints that are multiples of 16 at the real shapes
# get the divisibility attribute Triton's launcher would give them
_SIG = {"x_ptr": "*bf16", "w_ptr": "*bf16", "wu_ptr": "*bf16", "b_ptr": "*bf16", "out_ptr": "*bf16", "ws_ptr": "*fp32",
        "M": "i32", "N_OUT": "i32", "K": "i32", "tiles_per_split": "i32",
        "stride_xm": "i32", "stride_wn": "i32", "stride_om": "i32"}
_DIV16 = ("x_ptr", "w_ptr", "wu_ptr", "b_ptr", "out_ptr", "ws_ptr", "N_OUT", "K", "stride_xm", "stride_wn", "stride_om")


def compile_config(cfg: dict, target: str, *, rows_bucket: int, partial=False, silu_mul=False) -> dict:
    """Compile one configuration; returns its resource report."""
    import triton
    from triton.compiler import ASTSource

    from .gemv import _DOT_ROWS, _gemv_kernel

    cfg = dict(cfg)
    cfg.pop("SPLIT_K", None)
    dot = bool(cfg.pop("DOT"))
    consts = dict(BLOCK_M=_DOT_ROWS if dot else rows_bucket, BLOCK_N=cfg.pop("BLOCK_N"), BLOCK_K=cfg.pop("BLOCK_K"),
                  DOT=dot, PARTIAL=partial, HAS_BIAS=False, SILU_MUL=silu_mul, EVEN_K=True,
                  K_STAGES=cfg.pop("K_STAGES", 0))
    sig = dict(_SIG)
    sig.update({k: "constexpr" for k in consts})
    names = list(_SIG)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in _DIV16}
    src = ASTSource(_gemv_kernel, sig, constexprs=consts, attrs=attrs)
    kernel = triton.compile(src, target=gpu_target(target), options=cfg)
    report = dict(shared=kernel.metadata.shared)
    if "cubin" in kernel.asm:
        report.update(_cuda_usage(kernel.asm["cubin"]))
        ptx = kernel.asm["ptx"]
        report.update(cp_async=ptx.count("cp.async.cg") + ptx.count("cp.async.ca"), ld_v4=ptx.count("ld.global.v4"),
                      mma=ptx.count("mma.sync") + ptx.count("wgmma.mma_async"))
    else:
        usage = amdgcn_usage(kernel.asm["amdgcn"])
        report.update({k: usage[k] for k in ("regs", "sgprs", "spills", "scratch")},
                      ld_v4=usage["loads_16b"], mma=usage["mfma"])
    return report


def _cuda_usage(cubin: bytes) -> dict:
    proc = run_cuda_tool("cuobjdump", cubin, ".cubin", ("--dump-resource-usage",))
    proc.check_returncode()
    out = proc.stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+).*?LOCAL:(\d+)", out)
    return dict(regs=int(m.group(1)), stack=int(m.group(2)), spills=int(m.group(3))) if m else {}


def configs(target: str, sweep: bool = False, variants: bool = False):
    """(label, config, rows bucket, partial, silu_mul) for every launch the target's entry can make."""
    entry = launch_params.get_params(target)
    seen = set()
    out = []

    def add(label, cfg, b, silu):
        for partial in (False, True):
            key = (json.dumps(cfg, sort_keys=True), b if not cfg["DOT"] else 16, partial, silu)
            if key not in seen:
                seen.add(key)
                out.append((label, cfg, b, partial, silu))

    for b in launch_params.ROW_BUCKETS:
        for silu in (False, True):
            add(f"rows {b}", launch_params.config_for(target, 1, 1, b, silu, entry=entry), b, silu)
    for name, per_bucket in entry["shapes"].items():
        silu = name.endswith("+silu")
        for b, cfg in per_bucket.items():
            add(f"{name} rows {b}", {**entry["silu_rows" if silu else "rows"][b], **cfg}, int(b), silu)
    if sweep:
        from .bench import sweep_grid

        for b in launch_params.ROW_BUCKETS:
            for cfg in sweep_grid(b, rocm=not target.startswith("sm")):
                add(f"sweep rows {b}", cfg, b, False)
    if variants:
        from .bench import SHAPES, VARIANT_ROWS, variant_grid

        b = VARIANT_ROWS
        for _, n, k, silu in SHAPES:
            for name, cfg in variant_grid(launch_params.config_for(target, n, k, b, silu, entry=entry)).items():
                add(f"variant {launch_params.shape_name(n, k, silu)} {name} rows {b}", cfg, b, silu)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", action="append", help="launch_params target (repeatable; default sm90 and gfx936)")
    ap.add_argument("--sweep", action="store_true", help="also every configuration of bench.py's sweep")
    ap.add_argument("--variants", action="store_true", help="also the configurations of bench.py --variants")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("error: compile_check needs Triton's compiler: unset TRITON_INTERPRET")
    rows = []
    for target in args.target or ["sm90", "gfx936"]:
        for label, cfg, b, partial, silu in configs(target, args.sweep, args.variants):
            try:
                rep = compile_config(cfg, target, rows_bucket=b, partial=partial, silu_mul=silu)
            except Exception as e:  # noqa: BLE001 - report and go on
                rep = dict(error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
            rows.append(dict(target=target, label=label, config=cfg, partial=partial, silu_mul=silu, **rep))
    if args.json:
        print(json.dumps(rows, indent=1))
        return rows
    print("| target | what | config | variant | regs | spills | shared B | cp.async | 16B loads | mma |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        variant = "+".join(v for v, on in (("partial", r["partial"]), ("silu", r["silu_mul"])) if on) or "plain"
        cfg = " ".join(f"{k}={v}" for k, v in r["config"].items())
        if "error" in r:
            print(f"| {r['target']} | {r['label']} | {cfg} | {variant} | error: {r['error']} |||||")
            continue
        print(f"| {r['target']} | {r['label']} | {cfg} | {variant} | {r.get('regs')} | {r.get('spills')} | "
              f"{r['shared']} | {r.get('cp_async', '-')} | {r.get('ld_v4', '-')} | {r.get('mma', '-')} |")
    return rows


if __name__ == "__main__":
    main()
