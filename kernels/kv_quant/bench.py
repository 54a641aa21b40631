"""KV cache write throughput at Qwen3.5-27B shapes (4 kv heads x 256): bf16 vs fp8_pth vs int8_pth.

    python -m kernels.kv_quant.bench [--out DIR] [--tokens 1,8,...] [--slots random,prefill]

Methods: ``bf16_upstream`` (vLLM 0.18.1's ``triton_reshape_and_cache_flash``, when vllm imports),
``bf16_torch`` (an index_put copy, always there), ``fp8_pth_hw`` / ``fp8_pth_sw`` (hardware / software
e4m3 encode), ``int8_pth``. Times are CUDA-graph replays (decode runs under graphs), median.
Bytes moved = K and V read (bf16) + cache written (codes + scales). Every cache is laid out as the engine's
(``split_kv_cache``: the int8 rows write V by dim, fp8 by token). Slots (``--slots``): ``random`` (a permutation of
the cache's slots, what every earlier run timed) and ``prefill`` (a chunk's tokens at consecutive slots of
shuffled pages, from a page start, as a prompt's first chunk writes them): V by dim is stored along the tokens,
coalesced only where neighbouring tokens have neighbouring slots. Writes ``<date>-<gpu>-kv-write.json`` and ``.md``
into ``--out`` (default ``$OUT`` or bench/results/) and prints the table last.
"""
import argparse
import datetime
import os
import shlex
import sys
from pathlib import Path

import torch
import triton

from .cache_write import reshape_and_cache_per_token_head
from .layout import kv_cache_shape, split_kv_cache
from ..results_io import write_result_pair

H, D = 4, 256
BLOCK_BF16, BLOCK_PTH = 784, 1552  # the hybrid block sizes vLLM picks for Qwen3.5-27B
SLOT_PATTERNS = ("random", "prefill")


def _time_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    try:
        ms = triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
    except Exception:  # no graph support (e.g. some ROCm builds): plain launches
        ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    return ms * 1e3


def copy_bandwidth_gbps() -> float:
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=20, rep=100, return_mode="median")
    return 2 * n / (ms * 1e-3) / 1e9


def _upstream_writer():
    try:
        from vllm.v1.attention.ops.triton_reshape_and_cache_flash import triton_reshape_and_cache_flash
    except Exception as e:  # vllm not installed on this box, or its import needs compiled ops
        return None, f"{type(e).__name__}: {e}"[:160]
    return triton_reshape_and_cache_flash, None


def _slots(pattern: str, t: int, num_blocks: int, block_size: int, g, dev) -> torch.Tensor:
    """``t`` distinct slots of a cache of ``num_blocks`` pages (at least ``cdiv(t, block_size)``)."""
    if pattern == "random":
        return torch.randperm(num_blocks * block_size, device=dev, generator=g)[:t]
    if pattern == "prefill":
        pages = torch.randperm(num_blocks, device=dev, generator=g)
        i = torch.arange(t, device=dev)
        return pages[i // block_size] * block_size + i % block_size
    raise ValueError(f"slot pattern must be one of {SLOT_PATTERNS}, got {pattern!r}")


def bench(tokens: list[int], dev: str = "cuda", slot_patterns=SLOT_PATTERNS) -> tuple[list[dict], dict]:
    upstream, why = _upstream_writer()
    rows = []
    for pattern, t in ((p, t) for p in slot_patterns for t in tokens):
        g = torch.Generator(device=dev).manual_seed(t)
        key = torch.randn(t, H, D, device=dev, generator=g).bfloat16()
        value = torch.randn(t, H, D, device=dev, generator=g).bfloat16()
        read = 2 * t * H * D * 2

        nb16 = triton.cdiv(t, BLOCK_BF16) + 1
        slots16 = _slots(pattern, t, nb16, BLOCK_BF16, g, dev)
        kv16 = torch.zeros(nb16, 2, BLOCK_BF16, H, D, dtype=torch.bfloat16, device=dev)
        k16, v16 = kv16.unbind(1)
        one = torch.ones((), dtype=torch.float32, device=dev)
        methods = {}
        if upstream is not None:
            methods["bf16_upstream"] = (lambda: upstream(key, value, k16, v16, slots16, "auto", one, one), read)
        where16 = (slots16 // BLOCK_BF16, slots16 % BLOCK_BF16)

        def torch_copy():
            k16.index_put_(where16, key)
            v16.index_put_(where16, value)

        methods["bf16_torch"] = (torch_copy, read)

        nbq = triton.cdiv(t, BLOCK_PTH) + 1
        slotsq = _slots(pattern, t, nbq, BLOCK_PTH, g, dev)
        cache = torch.zeros(kv_cache_shape(nbq, BLOCK_PTH, H, D), dtype=torch.uint8, device=dev)
        written_q = 2 * t * H * (D + 4)
        for name, kind, sw in (("fp8_pth_hw", "fp8", False), ("fp8_pth_sw", "fp8", True), ("int8_pth", "int8", None)):
            views = split_kv_cache(cache, D, kind)  # int8: V by dim (layout.V_BY_DIM)
            methods[name] = (
                (lambda kind=kind, sw=sw, views=views: reshape_and_cache_per_token_head(
                    key, value, *views, slotsq, kind, software_fp8=sw)),
                written_q,
            )
        base_us = None
        for name, (fn, written) in methods.items():
            us = _time_us(fn)
            if name.startswith("bf16") and base_us is None:
                base_us = us
            moved = read + written
            rows.append(dict(tokens=t, slots=pattern, method=name, us=round(us, 2), bytes=moved,
                             GBps=round(moved / (us * 1e-6) / 1e9, 1), vs_bf16=round(us / base_us, 2)))
            print(rows[-1], flush=True)
    return rows, {"bf16_upstream": "used" if upstream is not None else f"not available ({why})"}


def write_results(rows, notes, out: Path, copy_gbps: float) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name(0)
    label = gpu.split()[-1].lower()
    stem = f"{datetime.date.today().isoformat()}-{label}-kv-write"
    command = "python -m kernels.kv_quant.bench " + shlex.join(sys.argv[1:])
    for r in rows:
        r["pct_copy"] = round(100 * r["GBps"] / copy_gbps, 1)
    meta = dict(command=command, gpu=gpu, torch=torch.__version__, triton=triton.__version__,
                copy_GBps=round(copy_gbps), shapes=f"{H} kv heads x {D}, bf16 K/V in", **notes)
    lines = [f"# KV cache write, Qwen3.5-27B shapes ({gpu})", "", f"Command: `{command}`", "",
             f"torch {torch.__version__}, triton {triton.__version__}; device copy {copy_gbps:.0f} GB/s (read+write); "
             f"CUDA-graph replay, median. bf16_upstream: {notes['bf16_upstream']}.", "",
             "| tokens | slots | method | us | bytes moved | GB/s | % of copy | time vs bf16 |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['tokens']} | {r['slots']} | {r['method']} | {r['us']} | {r['bytes']} | {r['GBps']} | "
                     f"{r['pct_copy']} | {r['vs_bf16']} |")
    return write_result_pair(out, stem, dict(meta=meta, rows=rows), lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench/results")
    ap.add_argument("--tokens", default="1,8,32,256,4096,16384")
    ap.add_argument("--slots", default=",".join(SLOT_PATTERNS), help=f"slot patterns, from {list(SLOT_PATTERNS)}")
    args = ap.parse_args(argv)
    patterns = [x for x in args.slots.split(",") if x]
    if not patterns or set(patterns) - set(SLOT_PATTERNS):
        print(f"kv write bench: --slots takes patterns from {list(SLOT_PATTERNS)}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("kv write bench: needs a CUDA/HIP GPU", file=sys.stderr)
        return 2
    tokens = [int(x) for x in args.tokens.split(",")]
    rows, notes = bench(tokens, slot_patterns=patterns)
    md = write_results(rows, notes, Path(args.out), copy_bandwidth_gbps())
    print(md.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
