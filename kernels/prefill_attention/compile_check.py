"""Compile the prefill kernel for a GPU target without a GPU and report its resources.

    python -m kernels.prefill_attention.compile_check [--target sm90|gfx936|...] [--configs '[{"BLOCK_M": 128, ...}]']

For choosing launch parameters before spending device time: registers per thread, spills, shared memory / LDS
per program, async copies (sm90: whether the K/V loads were pipelined) and where the first dot's A operand (q)
lives (sm90: "smem" or "regs") of each configuration, for a bf16 cache, the 16-bit mirror of an 8-bit cache
("mirror": K codes in q's bf16 + float32 scales, V in bf16, page-run key tiles; prefill_attention.py's comment above
MIRROR_MIN_QUERY), and 8-bit caches read directly: "int8" (V by dim, tokens contiguous, as int8 caches hold it:
kv_quant/layout.py V_BY_DIM), "int8 by token" (V contiguous in head_dim) and "fp8" (by token; software e4m3 on
ROCm targets), Qwen3.5-27B's head shape (6 q heads per kv head, 256). "wgmma serialized" (sm90): ptxas's C751x
advisory that it serialized the wgmma pipeline (a large slowdown; the reason, abbreviated, follows). "1-byte loads":
global loads of one byte in the code (bytes gathered one by one; --json also gives ROCm targets' load and 16-byte
load counts).
Default configurations: the target's table entry (kv16 for bf16 and the mirror, which launches with it; kv8 and
kv8_short for the direct path; "int8" at BLOCK_M <= 32 is the int8-product path, prefill_attention.py).
ROCm targets compile for gfx90a, the wave64 target upstream LLVM knows (kernels/compile_tools.py).
The pointer and stride alignment the JIT would see is passed in, so pipelining matches a real launch.
"""
import argparse
import json

import triton

from ..compile_tools import amdgcn_usage, gpu_target, jit_signature, ptx_byte_loads, ptxas_usage
from . import launch_params
from .mirror import MIRROR_PAGE
from .prefill_attention import takes_int8_products
from .prefill_kernel import _prefill_kernel

_PTR = {"q": "*bf16", "k": "*bf16", "v": "*bf16", "ks": "*fp32", "vs": "*fp32", "out": "*bf16", "cu_q": "*i32",
        "seq_lens": "*i32", "block_table": "*i32", "sel": "*i32"}
# ints the JIT sees as multiples of 16 for Qwen3.5-27B's layout (strides in elements); block_size and stride_btb
# are not specialized on (do_not_specialize), the scale views' head stride is 1
_DIV16 = ("stride_qt", "stride_qh", "stride_ot", "stride_oh", "stride_kb", "stride_kt", "stride_kh", "stride_vb",
          "stride_vt", "stride_vh")
# row label -> (launch width, KV_QUANT, over the mirror, V by dim); fp8 runs in software on ROCm targets (no fp8
# hardware on the DCU)
VARIANTS = {"bf16": ("kv16", 0, False, False), "mirror": ("kv16", 2, True, False), "int8": ("kv8", 2, False, True),
            "int8 by token": ("kv8", 2, False, False), "fp8": ("kv8", 1, False, False)}


def _signature(kv8: bool, mirror: bool = False, v_by_dim: bool = False):
    """(signature, attrs, constexprs) of the launch (compile_tools.jit_signature): the mirror's K codes are in q's
    dtype (bf16 here), its V in bf16, an 8-bit cache holds uint8 codes; the 8-bit scale views' head stride is 1; the
    mirror's scales are [pages, MIRROR_PAGE, 4] (page stride 1024). V's head_dim stride is 1 by token; by dim its
    token stride is 1 and its head_dim stride the block size (a multiple of 16)."""
    ones = ("stride_vt",) if v_by_dim else ("stride_vd",)
    if kv8:
        ones += ("stride_ksh", "stride_vsh")
    return jit_signature(
        _prefill_kernel,
        lambda base: "*u8" if kv8 and not mirror and base in ("k", "v") else _PTR[base],
        ones=ones,
        div16=lambda name: name in _DIV16 or name == "stride_vd" or (mirror and name in ("stride_ksb", "stride_vsb")),
        scalars={"s_mult_base": "fp32"})


def _q_operand(ttgir: str) -> str | None:
    """Where the first dot (q x K) reads q on sm90: "smem" (a shared-memory descriptor) or "regs"."""
    for line in ttgir.splitlines():
        if "ttng.warp_group_dot " in line:
            a = line.split("} : ", 1)[1] if "} : " in line else ""  # the operand types, after the attributes
            return "smem" if a.startswith("!ttg.memdesc") else "regs"
    return None


def compile_one(target: str, cfg: dict, variant: str, group=6, head_dim=256, block_size=784) -> dict:
    """``variant``: a VARIANTS label. The mirror's page is MIRROR_PAGE tokens, so block_size is ignored there."""
    _, kv_quant, mirror, v_by_dim = VARIANTS[variant]
    cfg = dict(cfg)
    block_m, block_n = cfg.pop("BLOCK_M"), cfg.pop("BLOCK_N")
    sig, attrs, unit_strides = _signature(kv_quant != 0, mirror, v_by_dim)
    if mirror:
        block_size = MIRROR_PAGE
    cuda = target.startswith("sm")
    consts = dict(GROUP=group, HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_M=block_m,
                  BLOCK_Q=block_m // group, BLOCK_N=block_n, PAGE_GE_TILE=block_size >= block_n,
                  KV_QUANT=kv_quant, FP8_SOFTWARE=kv_quant == 1 and not cuda, PTX=kv_quant != 0 and cuda,
                  SEQ_FILTER=1 if mirror else 0, MIRROR=mirror,
                  INT8_PV=takes_int8_products(kv_quant == 2 and v_by_dim, mirror, block_size, block_m, block_n,
                                              head_dim), **unit_strides)
    gt = gpu_target(target)
    k = triton.compile(triton.compiler.ASTSource(fn=_prefill_kernel, signature=sig, constexprs=consts, attrs=attrs),
                       target=gt, options=cfg)
    report = dict(shared=k.metadata.shared, async_copies=k.asm["ttgir"].count("async_copy_global_to_local"),
                  q_operand=_q_operand(k.asm["ttgir"]))
    if "ptx" in k.asm:
        report.update(ptxas_usage(k.asm["ptx"], gt.arch), loads_1b=ptx_byte_loads(k.asm["ptx"]))
    else:
        usage = amdgcn_usage(k.asm["amdgcn"])
        report.update({k: usage[k] for k in ("regs", "spills", "loads", "loads_16b", "loads_1b", "mfma")})
    return report


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="sm90", help="launch_params target: sm90, gfx936, gfx928, ...")
    ap.add_argument("--configs", default=None, help="JSON list of launch dicts (default: the target's table entry)")
    ap.add_argument("--json", action="store_true", help="print one JSON list of result rows instead of the table")
    a = ap.parse_args()
    if a.configs:
        configs = [(None, c) for c in json.loads(a.configs)]
    else:
        entry = launch_params.get_params(a.target)
        configs = [(w, entry[w]) for w in launch_params.WIDTHS]
    rows = []
    if not a.json:
        print("| target | kv | config | regs | spills | shared / LDS B | async copies | q operand | wgmma serialized "
              "| 1-byte loads |")
        print("|---|---|---|---:|---:|---:|---:|---|---|---:|")
    for width, cfg in configs:
        base = "kv8" if width == "kv8_short" else width  # the direct path's two tiles read the same caches
        for kind in [v for v, spec in VARIANTS.items() if base in (None, spec[0])]:
            row = dict(target=a.target, kv=kind, config=cfg)
            try:
                row.update(compile_one(a.target, cfg, kind))
            except Exception as e:  # a configuration the compiler rejects is a result too
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            rows.append(row)
            if not a.json:
                print(f"| {a.target} | {row['kv']} | {cfg} | {row.get('regs')} | {row.get('spills')} | "
                      f"{row.get('shared')} | {row.get('async_copies')} | {row.get('q_operand')} | "
                      f"{row.get('serialized')} | {row.get('loads_1b')} |" if "error" not in row else
                      f"| {a.target} | {row['kv']} | {cfg} | error: {row['error'][:120]} | | | | | | |", flush=True)
    if a.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
