"""Decode attention through TRITON_ATTN's unified attention (patch 0002) at Qwen3.5-27B shapes:
bf16 vs fp8_per_token_head (hardware / software e4m3 decode) vs int8_per_token_head, scales applied to
S and P (the default for bf16) and, for comparison, to dequantized K/V tiles.

    bash ci/gpu/run.sh python -m kernels.kv_quant.bench_attention [--out DIR] [--ctx 4096,16384,32768] [--batch 1,8,32]
        [--prefill 4096]

Needs the patched vLLM on PYTHONPATH (the GPU harness variant). Each point is a CUDA-graph replay of one
layer's decode step (one query token per sequence; with --prefill also one sequence's prefill chunk; 24 q / 4 kv
heads x 256; block 1552 for fp8, 1664 for int8, 784 for bf16, as vLLM picks them for Qwen3.5-27B), median of
triton.testing.do_bench.
Bytes = KV cache bytes read (codes + scales). Writes ``<date>-<gpu>-kv-decode-attention.{json,md}`` into
``--out`` (default ``$OUT`` or bench/results/) and prints the table last.
"""
import argparse
import datetime
import math
import os
import shlex
import sys
from pathlib import Path

import torch
import triton

from .bench import copy_bandwidth_gbps
from .cache_write import reshape_and_cache_per_token_head
from .layout import QWEN35_27B_PAGE_TOKENS, kv_cache_shape, split_kv_cache
from ..results_io import write_result_pair

HQ, HKV, D = 24, 4, 256
SEGMENTS = 16
THRESHOLD_3D = 128 // HKV
BLOCK = dict(QWEN35_27B_PAGE_TOKENS)  # the engine's pages

# name -> (kv quant kind or None, software fp8 decode, dequantize tiles)
METHODS = {
    "bf16": (None, None, None),
    "fp8_pth_hw": ("fp8", False, False),
    "fp8_pth_sw": ("fp8", True, False),
    "int8_pth": ("int8", None, False),
    "fp8_pth_hw_tiles": ("fp8", False, True),
    "int8_pth_tiles": ("int8", None, True),
}


def _case(batch, ctx, kind, dev):
    block = BLOCK[kind or "bf16"]
    per_seq = math.ceil(ctx / block)
    num_blocks = batch * per_seq + 1
    g = torch.Generator(device=dev).manual_seed(batch * 100003 + ctx)
    table = torch.randperm(num_blocks - 1, device=dev, generator=g)[: batch * per_seq].view(batch, per_seq)
    table = table.to(torch.int32)
    if kind is None:
        kv = torch.randn(num_blocks, 2, block, HKV, D, device=dev, generator=g).to(torch.bfloat16)
        k, v = kv.unbind(1)
        return dict(k=k, v=v, table=table, block=block, bytes=batch * ctx * HKV * D * 2 * 2)
    cache = torch.zeros(kv_cache_shape(num_blocks, block, HKV, D), dtype=torch.uint8, device=dev)
    views = split_kv_cache(cache, D, kind)
    n = num_blocks * block
    for start in range(0, n, 1 << 16):  # fill every slot through the write kernel
        t = min(1 << 16, n - start)
        key = torch.randn(t, HKV, D, device=dev, generator=g).to(torch.bfloat16)
        val = torch.randn(t, HKV, D, device=dev, generator=g).to(torch.bfloat16)
        reshape_and_cache_per_token_head(key, val, *views, torch.arange(start, start + t, device=dev), kind)
    return dict(k=views[0], v=views[1], ks=views[2], vs=views[3], table=table, block=block,
                bytes=batch * ctx * HKV * (D + 4) * 2)


def _time_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    ms = triton.testing.do_bench(graph.replay, warmup=25, rep=200, return_mode="median")
    return ms * 1e3


def bench(batches, ctxs, dev="cuda", unified_attention=None, prefill_chunks=()):
    """Rows of decode points (batch x one query token) and, for each chunk in prefill_chunks, a prefill point:
    one sequence whose last `chunk` tokens are the queries (causal), as a chunked prefill step at position
    ctx - chunk runs it (the 2D kernel). The prefill kernel of patch 0006 has its own bench
    (kernels/prefill_attention/bench.py); here the unified attention of 0.18.1 + patch 0002 is timed."""
    if unified_attention is None:
        from vllm.v1.attention.ops import triton_unified_attention as ua

        unified_attention = getattr(ua.unified_attention, "dcu_upstream", ua.unified_attention)
    so = torch.empty(THRESHOLD_3D, HQ, SEGMENTS, D, dtype=torch.float32, device=dev)
    sm = torch.empty(THRESHOLD_3D, HQ, SEGMENTS, dtype=torch.float32, device=dev)
    se = torch.empty_like(sm)
    rows = []
    points = [(ctx, batch, 1) for ctx in ctxs for batch in batches]
    points += [(ctx, 1, chunk) for ctx in ctxs for chunk in prefill_chunks if chunk <= ctx]
    for ctx, batch, qlen in points:
        q = torch.randn(batch * qlen, HQ, D, device=dev).to(torch.bfloat16)
        out = torch.empty_like(q)
        cu_q = torch.arange(batch + 1, device=dev, dtype=torch.int32) * qlen
        seqused = torch.full((batch,), ctx, device=dev, dtype=torch.int32)
        ones = torch.ones(batch, HKV, dtype=torch.float32, device=dev)
        cases = {}
        base_us = None
        for name, (kind, sw, tiles) in METHODS.items():
            if kind not in cases:
                cases[kind] = _case(batch, ctx, kind, dev)
            c = cases[kind]
            extra = {} if kind is None else dict(kv_quant=kind, k_scale_cache=c["ks"], v_scale_cache=c["vs"],
                                                 software_fp8=sw, dequant_tiles=tiles)

            def run(c=c, extra=extra):
                unified_attention(q, c["k"], c["v"], out, cu_q, qlen, seqused, ctx, D**-0.5, True, (-1, -1),
                                  c["table"], 0, None, ones, ones, seq_threshold_3D=THRESHOLD_3D,
                                  num_par_softmax_segments=SEGMENTS, softmax_segm_output=so,
                                  softmax_segm_max=sm, softmax_segm_expsum=se, **extra)

            us = _time_us(run)
            base_us = base_us or us
            kernel = "2D" if qlen > 1 or batch > THRESHOLD_3D else "3D"
            rows.append(dict(ctx=ctx, batch=batch, q_tokens=qlen, method=name, kernel=kernel,
                             us=round(us, 1), bytes=c["bytes"], GBps=round(c["bytes"] / (us * 1e-6) / 1e9),
                             vs_bf16=round(us / base_us, 3)))
            print(rows[-1], flush=True)
        del cases
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench/results")
    ap.add_argument("--ctx", default="4096,16384,32768")
    ap.add_argument("--batch", default="1,8,32")
    ap.add_argument("--prefill", default="", help="also time one-sequence prefill chunks of these sizes (query "
                    "tokens at the end of each ctx), e.g. 4096: the attention share of 8-bit KV's prefill cost")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("kv decode attention bench: needs a CUDA/HIP GPU", file=sys.stderr)
        return 2
    try:
        import vllm.v1.attention.ops.triton_unified_attention as ua
    except Exception as e:
        print(f"kv decode attention bench: needs the patched vLLM on PYTHONPATH ({type(e).__name__}: {e})",
              file=sys.stderr)
        return 2
    upstream = getattr(ua.unified_attention, "dcu_upstream", ua.unified_attention)  # under patch 0006's router
    if "k_scale_cache" not in upstream.__code__.co_varnames:
        print("kv decode attention bench: this vLLM lacks patch 0002 (unified_attention has no k_scale_cache)",
              file=sys.stderr)
        return 2
    try:
        batches, ctxs = [int(x) for x in args.batch.split(",")], [int(x) for x in args.ctx.split(",")]
        chunks = [int(x) for x in args.prefill.split(",") if x]
        if min(batches + ctxs + chunks) < 1:
            raise ValueError
    except ValueError:
        print("kv decode attention bench: --batch, --ctx and --prefill take positive integers, comma separated",
              file=sys.stderr)
        return 2
    try:
        rows = bench(batches, ctxs, unified_attention=upstream, prefill_chunks=chunks)
    except ValueError as e:
        print(f"kv decode attention bench: {e}", file=sys.stderr)
        return 2
    copy = copy_bandwidth_gbps()
    for r in rows:
        r["pct_copy"] = round(100 * r["GBps"] / copy, 1)
    gpu = torch.cuda.get_device_name(0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{datetime.date.today().isoformat()}-{gpu.split()[-1].lower()}-kv-decode-attention"
    command = "python -m kernels.kv_quant.bench_attention " + shlex.join(sys.argv[1:])
    meta = dict(command=command, gpu=gpu, torch=torch.__version__, triton=triton.__version__, copy_GBps=round(copy),
                shapes=f"{HQ} q / {HKV} kv heads x {D}, bf16 queries, {SEGMENTS} segments")
    lines = [f"# Decode attention, unified attention, Qwen3.5-27B shapes ({gpu})", "", f"Command: `{command}`", "",
             f"torch {torch.__version__}, triton {triton.__version__}; device copy {copy:.0f} GB/s; one layer, "
             "CUDA-graph replay, median. `_tiles`: K/V tiles dequantized instead of scaling S and P.", "",
             "| ctx | batch | query tokens | kernel | method | us | KV bytes | GB/s | % of copy | time vs bf16 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['ctx']} | {r['batch']} | {r['q_tokens']} | {r['kernel']} | {r['method']} | {r['us']} | "
                     f"{r['bytes']} | {r['GBps']} | {r['pct_copy']} | {r['vs_bf16']} |")
    md = write_result_pair(out, stem, dict(meta=meta, rows=rows), lines)
    print(md.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
