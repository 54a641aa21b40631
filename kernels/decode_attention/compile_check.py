"""Compile the split-KV decode kernel ahead of time for a GPU target, without a GPU, and report its resources.

    python -m kernels.decode_attention.compile_check [--target sm90|gfx936|gfx928|...] [--json] [--tile-loop]
        [--gluon [JSON]]

For the target's launch_params entry (kv16 for bf16 caches, kv8 for int8 / fp8 with the software and, where the
target has it, hardware e4m3 decode; on CUDA the PTX and the portable code conversions) at Qwen3.5-27B's head
shape (6 q heads per kv head, 256), stage 1 is compiled with Triton's own compiler (CUDA: sm90 through the ptxas
Triton ships; DCU: gfx90a, the wave64 target upstream LLVM knows, as the proxy for gfx936 / gfx928) and its
registers, spills, shared memory / LDS and barriers are printed, and for AMD targets the global load instructions in
the code, with how many of them load 16 bytes per lane and how many one byte (a K / V stream gathered byte by byte
shows there). The CPU interpreter runs the kernels as Python:
this is what finds code the compiler refuses (e.g. a plain Python global inside a kernel). Must run without
TRITON_INTERPRET=1. --tile-loop (CUDA targets) adds stage 1's tile loop as ptxas compiled it: its SASS instructions
per thread per tile and the most frequent opcodes (compile_tools.sass_tile_loop), the count to set against a tile's
measured time. --gluon [JSON] (CUDA targets) adds the Gluon stage 1 (gluon_stage1.py) for int8 (V by dim) and fp8 (V
by token), as their caches hold V, with the kv8 entry's gluon launch and JSON over it.
"""
import argparse
import json
import os
import sys

from ..compile_tools import amdgcn_usage, gpu_target, jit_signature, nvdisasm, ptxas_usage, sass_tile_loop
from ..kv_quant.layout import V_BY_DIM
from . import launch_params

_PTR = {"q": "*bf16", "k": "*u8", "v": "*u8", "ks": "*fp32", "vs": "*fp32", "block_table": "*i32",
        "seq_lens": "*i32", "out": "*bf16", "ws_o": "*fp32", "ws_lse": "*fp32", "ws_plan": "*i32"}
# (label, KV_QUANT, FP8_SOFTWARE, PTX): what each target can run
_VARIANTS_CUDA = [("bf16", 0, False, False), ("int8 ptx", 2, False, True), ("fp8-sw ptx", 1, True, True),
                  ("fp8-hw ptx", 1, False, True), ("int8 portable", 2, False, False),
                  ("fp8-sw portable", 1, True, False), ("fp8-hw portable", 1, False, False)]
_VARIANTS_ROCM = [("bf16", 0, False, False), ("int8", 2, False, False), ("fp8-sw", 1, True, False)]
# integer arguments the JIT does not see as multiples of 16 at Qwen3.5-27B's shapes (compile_tools.jit_signature):
# the scales' token stride (4 heads), the block table's row stride (the longest request's page count) and the split
# plan's counts; the 8-bit scale views' head stride is 1 and the rest are multiples of 16. Without these, the kv8
# launch compiled to 255 registers and 400+ B of spills here; with them, to 146-167 and none.
_NO_DIV16 = {"stride_kst", "stride_vst", "stride_btb", "max_splits", "min_split_tokens", "num_q_heads", "batch",
             "balance_programs"}


def compile_variant(target: str, kv_quant: int, software: bool, ptx: bool, launch: dict, group=6,
                    head_dim=256, block_size=1552, tile_loop=False) -> dict:
    import triton
    from triton.compiler import ASTSource

    from .planning import split_kernel_launch
    from .splits import BLOCK_H
    from .triton_kernels import _decode_split_kernel

    # V as the kind's cache stores it (int8 by dim: the int8 x int8 P x V path)
    v_by_dim = {1: "fp8", 2: "int8"}.get(kv_quant) in V_BY_DIM
    launch_consts, options = split_kernel_launch(launch, block_size, kv_quant, v_by_dim)  # as the launcher does
    sig, attrs, unit_strides = jit_signature(
        _decode_split_kernel,
        lambda base: "*bf16" if kv_quant == 0 and base in ("k", "v") else _PTR[base],
        ones=(("stride_vt",) if v_by_dim else ("stride_vd",)) + (("stride_ksh", "stride_vsh") if kv_quant else ()),
        div16=lambda name: name not in _NO_DIV16, scalars={"scale_log2": "fp32"})
    consts = dict(GROUP=group, HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_H=BLOCK_H,
                  KV_QUANT=kv_quant, FP8_SOFTWARE=software, PTX=ptx, **launch_consts, **unit_strides)
    kernel = triton.compile(ASTSource(_decode_split_kernel, sig, constexprs=consts, attrs=attrs),
                            target=gpu_target(target), options=options)
    return _report(kernel, target, tile_loop)


def _report(kernel, target: str, tile_loop: bool) -> dict:
    """Shared memory / LDS, registers, spills and barriers of a compiled stage 1 (CUDA: and with tile_loop, its tile
    loop in SASS)."""
    report = dict(shared=kernel.metadata.shared)
    if "ptx" in kernel.asm:
        report.update(ptxas_usage(kernel.asm["ptx"], gpu_target(target).arch),
                      barriers=kernel.asm["ptx"].count("bar.sync"))
        if tile_loop:
            report["tile_loop"] = sass_tile_loop(nvdisasm(kernel.asm["cubin"]))
    else:
        usage = amdgcn_usage(kernel.asm["amdgcn"])
        report.update({k: usage[k] for k in ("regs", "spills", "sgprs", "barriers", "loads", "loads_16b", "loads_1b",
                                             "mfma")})
    return report


# (label, KV_QUANT, FP8_SOFTWARE): fp8 caches hold V by token, int8 caches by dim
_VARIANTS_GLUON = [("int8 gluon", 2, False), ("fp8-sw gluon", 1, True), ("fp8-hw gluon", 1, False)]


def compile_gluon_variant(target: str, kv_quant: int, software: bool, launch: dict, group=6, head_dim=256,
                          block_size=1552, tile_loop=False) -> dict:
    """The Gluon stage 1 (launch key gluon; gluon_stage1.py) compiled for a CUDA target as the launcher calls it: V
    with its cache's unit stride (fp8: head_dim, by token; int8: tokens, by dim) and the scale views' head stride 1,
    the ``gluon`` launch's BLOCK_N / num_warps / num_stages."""
    import triton
    from triton.experimental.gluon._runtime import GluonASTSource

    from .gluon_stage1 import _decode_split_kernel_gluon, gluon_constexprs
    from .planning import split_kernel_launch

    v_by_dim = kv_quant == 2
    launch_consts, options = split_kernel_launch(launch, block_size, kv_quant, v_by_dim)  # as the launcher does
    sig, attrs, unit_strides = jit_signature(_decode_split_kernel_gluon, lambda base: _PTR[base],
                                             ones=("stride_vt" if v_by_dim else "stride_vd", "stride_ksh",
                                                   "stride_vsh"),
                                             div16=lambda name: name not in _NO_DIV16, scalars={"scale_log2": "fp32"})
    consts = dict(gluon_constexprs(group=group, head_dim=head_dim, block_n=launch_consts["BLOCK_N"],
                                   num_stages=options["num_stages"], num_warps=options["num_warps"], kv_quant=kv_quant,
                                   fp8_software=software, even_splits=launch_consts["EVEN_SPLITS"],
                                   balance=launch_consts["BALANCE"], batch_chunk=launch_consts["BATCH_CHUNK"]),
                  **unit_strides)
    kernel = triton.compile(GluonASTSource(_decode_split_kernel_gluon, sig, constexprs=consts, attrs=attrs),
                            target=gpu_target(target), options=dict(num_warps=options["num_warps"]))
    return _report(kernel, target, tile_loop)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", action="append", help="launch_params target (repeatable; default sm90 and gfx936)")
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    ap.add_argument("--tile-loop", action="store_true", help="CUDA targets: also stage 1's tile loop in SASS "
                    "(instructions per thread per tile, most frequent opcodes)")
    ap.add_argument("--gluon", metavar="JSON", nargs="?", const="{}", help="CUDA targets: also the Gluon stage 1 "
                    "(int8 and fp8; the kv8 entry's gluon launch) with this JSON over it (BLOCK_N, num_warps, "
                    "num_stages), e.g. '{\"BLOCK_N\": 128, \"num_warps\": 8, \"num_stages\": 2}'")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("error: compile_check needs Triton's compiler: unset TRITON_INTERPRET")
    rows = []
    for target in args.target or ["sm90", "gfx936"]:
        entry = launch_params.get_params(target)
        for label, kv, sw, ptx in (_VARIANTS_CUDA if target.startswith("sm") else _VARIANTS_ROCM):
            launch = {k: v for k, v in entry["kv8" if kv else "kv16"].items() if k != "gluon"}  # the Triton launch
            try:
                rep = compile_variant(target, kv, sw, ptx, launch, tile_loop=args.tile_loop)
            except Exception as e:  # noqa: BLE001 - report and go on
                rep = dict(error=f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}")
            rows.append(dict(target=target, variant=label, launch=launch, **rep))
        if args.gluon and target.startswith("sm"):
            # the kv8 entry's gluon launch over kv8, then the command line's
            launch = {**entry["kv8"], **(entry["kv8"].get("gluon") or {}), **json.loads(args.gluon)}
            for key in ("gluon", "int8"):
                launch.pop(key, None)
            for label, kv, sw in _VARIANTS_GLUON:
                try:
                    rep = compile_gluon_variant(target, kv, sw, launch, tile_loop=args.tile_loop)
                except Exception as e:  # noqa: BLE001 - report and go on
                    rep = dict(error=f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}")
                rows.append(dict(target=target, variant=label, launch=launch, **rep))
    if args.json:
        print(json.dumps(rows, indent=1))
        return rows
    head = "| target | variant | launch | regs | spill | shared / LDS B | barriers | global loads (16 B / 1 B) |"
    print(head + (" tile loop: SASS, top opcodes |" if args.tile_loop else ""))
    print("|---|---|---|---:|---:|---:|---:|---:|" + ("---|" if args.tile_loop else ""))
    for r in rows:
        launch = " ".join(f"{k}={v}" for k, v in r["launch"].items())
        if "error" in r:
            print(f"| {r['target']} | {r['variant']} | {launch} | error: {r['error']} |||||")
        else:
            loop = ""
            if args.tile_loop:
                tile = r.get("tile_loop")  # None on ROCm targets
                loop = (f" {tile['instructions']}: " + ", ".join(f"{op} {n}" for op, n in list(tile["ops"].items())[:6])
                        if tile else " -") + " |"
            loads = f"{r['loads']} ({r['loads_16b']} / {r['loads_1b']})" if "loads" in r else "-"  # AMDGCN only
            print(f"| {r['target']} | {r['variant']} | {launch} | {r['regs']} | {r['spills']} | {r['shared']} | "
                  f"{r['barriers']} | {loads} |{loop}")
    return rows


if __name__ == "__main__":
    main()
