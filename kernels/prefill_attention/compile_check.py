"""Compile the prefill kernel for a GPU target without a GPU and report its resources (ptxas -v).

    python -m kernels.prefill_attention.compile_check [--arch 90] [--configs '[{"BLOCK_M":128,...}]']

For choosing launch parameters before spending device time: registers per thread, spills and shared memory
per program of each configuration, bf16 and int8 caches, Qwen3.5-27B's head shape (6 q heads per kv head, 256).
"""
import argparse
import json
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget

from .prefill_attention import _prefill_kernel

_PTR = {"q": "*bf16", "k": "*bf16", "v": "*bf16", "ks": "*fp32", "vs": "*fp32", "out": "*bf16", "cu_q": "*i32",
        "seq_lens": "*i32", "block_table": "*i32", "sel": "*i32"}


def signature(kv8: bool, group=6, head_dim=256):
    sig, consts = {}, {}
    for name in _prefill_kernel.arg_names:
        if name.endswith("_ptr"):
            base = name[:-4]
            t = _PTR[base]
            if kv8 and base in ("k", "v"):
                t = "*u8"
            sig[name] = t
        elif name == "s_mult_base":
            sig[name] = "fp32"
        elif name.isupper() or name[0].isupper():
            sig[name] = "constexpr"
        else:
            sig[name] = "i32"
    return sig


# ints the JIT sees as multiples of 16 for Qwen3.5-27B's layout (strides in elements), and the ones equal to 1
_DIV16 = ("stride_qt", "stride_qh", "stride_ot", "stride_oh", "stride_kb", "stride_kt", "stride_kh", "stride_vb",
          "stride_vt", "stride_vh")  # block_size and stride_btb are not specialized on (do_not_specialize)


def _attrs(kv8: bool) -> tuple[dict, dict]:
    names = _prefill_kernel.arg_names
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n.endswith("_ptr") or n in _DIV16}
    ones = {"stride_ksh": 1, "stride_vsh": 1} if kv8 else {}
    return attrs, ones


def compile_one(cfg: dict, kv8: bool, arch: int, group=6, head_dim=256, block_size=784):
    cfg = dict(cfg)
    block_m, block_n = cfg.pop("BLOCK_M"), cfg.pop("BLOCK_N")
    consts = dict(GROUP=group, HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_M=block_m,
                  BLOCK_Q=block_m // group, BLOCK_N=block_n, PAGE_GE_TILE=block_size >= block_n,
                  KV_QUANT=2 if kv8 else 0, FP8_SOFTWARE=False, PTX=kv8, SEQ_FILTER=0)
    attrs, ones = _attrs(kv8)
    sig = signature(kv8)
    for name in ones:
        sig[name] = "constexpr"
    consts.update(ones)
    src = triton.compiler.ASTSource(fn=_prefill_kernel, signature=sig, constexprs=consts, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=cfg)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    try:
        r = subprocess.run([ptxas, f"-arch=sm_{arch}a", "-v", f.name, "-o", os.devnull], capture_output=True, text=True)
    finally:
        os.unlink(f.name)
    text = r.stderr + r.stdout
    regs = re.findall(r"Used (\d+) registers", text)
    spill = re.findall(r"(\d+) bytes spill stores", text)
    return dict(regs=int(regs[-1]) if regs else None, spill_stores=int(spill[-1]) if spill else None,
                shared=k.metadata.shared, wgmma="wgmma" in k.asm["ptx"],
                async_copies=k.asm["ttgir"].count("async_copy_global_to_local"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--configs", default=None, help="JSON list of launch dicts")
    a = ap.parse_args()
    configs = json.loads(a.configs) if a.configs else [
        dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2),
        dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=3),
        dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2),
        dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2),
    ]
    print("| kv | config | regs | spill stores | shared B | wgmma | async copies |")
    print("|---|---|---:|---:|---:|---|---:|")
    for kv8 in (False, True):
        for cfg in configs:
            try:
                r = compile_one(cfg, kv8, a.arch)
                print(f"| {'8-bit' if kv8 else 'bf16'} | {cfg} | {r['regs']} | {r['spill_stores']} | {r['shared']} | {r['wgmma']} | {r['async_copies']} |",
                      flush=True)
            except Exception as e:  # report and go on: a config the compiler rejects is a result too
                print(f"| {'8-bit' if kv8 else 'bf16'} | {cfg} | error: {type(e).__name__}: {str(e)[:120]} |", flush=True)


if __name__ == "__main__":
    main()
