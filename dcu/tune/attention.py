"""Decode and prefill attention: our kernels against vLLM's unified attention (patch 0002's 8-bit reads included) at
the engine's pages, one launch kind per cache kind (bf16, int8, fp8 per-token-head)."""
from __future__ import annotations

import importlib.util
import math

import torch

from .._kernels import (candidates, decode_attention, decode_params, kv_cache_shape, prefill_attention, prefill_params,
                       split_kv_cache, use_software_fp8)

from .common import DECODE_TOL, PREFILL_TOL, ctx_label, rocm_options
from .sweep import Case, Family, run_family

KINDS = ("bf16", "int8", "fp8")
_UA: dict = {}


def upstream_unified_attention():
    """vLLM's unified attention without patch 0006's router (``dcu_upstream``), with patch 0002's 8-bit reads.
    Where vllm.triton_utils hands out a placeholder (no GPU driver: Triton's CPU interpreter) a private copy of the
    module is loaded with the real Triton, as tests/test_triton_attn_pth.py does."""
    if "fn" not in _UA:
        import triton
        import triton.language as tl

        import vllm.triton_utils as tu

        name = "vllm.v1.attention.ops.triton_unified_attention"
        if tu.triton is triton:
            mod = importlib.import_module(name)
        else:
            saved = tu.triton, tu.tl
            tu.triton, tu.tl = triton, tl
            try:
                spec = importlib.util.spec_from_file_location("dcu_tune_unified_attention",
                                                              importlib.util.find_spec(name).origin)
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
            finally:
                tu.triton, tu.tl = saved
        _UA["fn"] = getattr(mod.unified_attention, "dcu_upstream", mod.unified_attention)
    return _UA["fn"]


def _software(kind):
    return kind == "fp8" and use_software_fp8()


def _paged(shapes, kind, tokens_per_seq, seqs, dev, gen):
    """(block table [seqs, pages], cache views: k, v, k_scales, v_scales) with random contents, pages scattered.
    8-bit caches hold random codes (no fp8 NaN) and scales as the engine lays them out (int8: V by dim)."""
    page = shapes.pages[kind]
    per_seq = math.ceil(tokens_per_seq / page)
    blocks = seqs * per_seq + 1
    table = torch.randperm(blocks, device=dev, generator=gen)[: seqs * per_seq].view(seqs, per_seq).to(torch.int32)
    hkv, d = shapes.heads_kv, shapes.head_dim
    if kind == "bf16":
        kv = torch.randn(blocks, 2, page, hkv, d, device=dev, generator=gen).to(torch.bfloat16)
        return table, (kv[:, 0], kv[:, 1], None, None)
    cache = torch.randint(0, 256, kv_cache_shape(blocks, page, hkv, d), dtype=torch.uint8, device=dev, generator=gen)
    cache &= 0x77
    k, v, ks, vs = split_kv_cache(cache, d, kind)
    ks.copy_(torch.rand(ks.shape, device=dev, generator=gen) * 9e-3 + 1e-3)
    vs.copy_(torch.rand(vs.shape, device=dev, generator=gen) * 9e-3 + 1e-3)
    return table, (k, v, ks, vs)


def _ua_kwargs(kind, ks, vs):
    if kind == "bf16":
        return {}
    return dict(kv_quant=kind, k_scale_cache=ks, v_scale_cache=vs, software_fp8=_software(kind))


def decode_case(shapes, kind, batch, ctx, dev, seed=0) -> Case:
    gen = torch.Generator(device=dev).manual_seed(seed)
    hq, hkv, d = shapes.heads_q, shapes.heads_kv, shapes.head_dim
    table, (k, v, ks, vs) = _paged(shapes, kind, ctx, batch, dev, gen)
    q = torch.randn(batch, hq, d, device=dev, generator=gen).to(torch.bfloat16)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
    scale = d**-0.5
    out_ours, out_up = torch.empty_like(q), torch.empty_like(q)
    kw = {} if kind == "bf16" else dict(k_scales=ks, v_scales=vs, kv_quant=kind, software_fp8=_software(kind))

    def ours():
        return decode_attention(q, k, v, table, seq_lens, scale, out_ours, **kw)

    # TRITON_ATTN's decode launch: a 3D (segmented) softmax for batches up to 128 // kv heads
    thr, seg = 128 // hkv, 16
    so = torch.empty(thr, hq, seg, 1 << (d - 1).bit_length(), dtype=torch.float32, device=dev)
    sm = torch.empty(thr, hq, seg, dtype=torch.float32, device=dev)
    se = torch.empty(thr, hq, seg, dtype=torch.float32, device=dev)
    cu_q = torch.arange(batch + 1, dtype=torch.int32, device=dev)
    ones = torch.ones(batch, hkv, dtype=torch.float32, device=dev)
    ua_kw = _ua_kwargs(kind, ks, vs)

    def upstream():
        upstream_unified_attention()(
            q=q, k=k, v=v, out=out_up, cu_seqlens_q=cu_q, max_seqlen_q=1, seqused_k=seq_lens, max_seqlen_k=ctx,
            softmax_scale=scale, causal=True, window_size=(-1, -1), block_table=table, softcap=0, q_descale=None,
            k_descale=ones, v_descale=ones, seq_threshold_3D=thr, num_par_softmax_segments=seg,
            softmax_segm_output=so, softmax_segm_max=sm, softmax_segm_expsum=se, **ua_kw)
        return out_up

    return Case(f"{batch} x {ctx_label(ctx)}", ours, upstream, DECODE_TOL)


def prefill_case(shapes, kind, history, chunk, dev, mirror=None, seed=0) -> Case:
    gen = torch.Generator(device=dev).manual_seed(seed + history + chunk)
    hq, hkv, d = shapes.heads_q, shapes.heads_kv, shapes.head_dim
    n = history + chunk
    table, (k, v, ks, vs) = _paged(shapes, kind, n, 1, dev, gen)
    q = torch.randn(chunk, hq, d, device=dev, generator=gen).to(torch.bfloat16)
    cu = torch.tensor([0, chunk], dtype=torch.int32, device=dev)
    seq_lens = torch.tensor([n], dtype=torch.int32, device=dev)
    scale = d**-0.5
    out_ours, out_up = torch.empty_like(q), torch.empty_like(q)
    kw = {} if kind == "bf16" else dict(k_scales=ks, v_scales=vs, kv_quant=kind, software_fp8=_software(kind))

    def ours():
        return prefill_attention(q, k, v, out_ours, cu, seq_lens, table, scale, max_seqlen_k=n, mirror=mirror, **kw)

    ones = torch.ones(1, hkv, dtype=torch.float32, device=dev)
    ua_kw = _ua_kwargs(kind, ks, vs)

    def upstream():
        upstream_unified_attention()(
            q=q, k=k, v=v, out=out_up, cu_seqlens_q=cu, max_seqlen_q=chunk, seqused_k=seq_lens, max_seqlen_k=n,
            softmax_scale=scale, causal=True, window_size=(-1, -1), block_table=table, softcap=0, q_descale=None,
            k_descale=ones, v_descale=ones, **ua_kw)
        return out_up

    return Case(f"{chunk} after {ctx_label(history)}", ours, upstream, PREFILL_TOL)


def decode_family(shapes, cases, dev) -> Family:
    target = decode_params.current_target(dev)
    rocm = rocm_options(target)
    built = {f"decode.{kind}": {"main": [decode_case(shapes, kind, b, c, dev, seed=i)
                                         for i, (b, c) in enumerate(cases.decode)]} for kind in KINDS}
    return Family(
        name="decode", env_var=decode_params.ENV_VAR,
        validate=lambda text: decode_params.get_params(target, override=text), cases=built,
        widths={"kv16": (["decode.bf16"], "main"), "kv8": (["decode.int8", "decode.fp8"], "main")},
        candidates=lambda w: candidates.decode_candidates(decode_params.get_params(target, ""), w, rocm))


def prefill_family(shapes, cases, dev) -> Family:
    target = prefill_params.current_target(dev)
    rocm = rocm_options(target)
    built = {}
    for kind in KINDS:
        built[f"prefill.{kind}"] = {
            "main": [prefill_case(shapes, kind, h, c, dev, cases.mirror) for h, c in cases.prefill],
            "short": [prefill_case(shapes, kind, h, c, dev, cases.mirror) for h, c in cases.prefill_short]}
    # kv16: bf16 chunks and the 16-bit mirror of the 8-bit ones; kv8_short: the 8-bit direct launch beside the
    # mirror (short chunks, decode rows). kv8 (the direct launch with the mirror off) is not swept.
    return Family(
        name="prefill", env_var=prefill_params.ENV_VAR,
        validate=lambda text: prefill_params.get_params(target, override=text), cases=built,
        widths={"kv16": (["prefill.bf16", "prefill.int8", "prefill.fp8"], "main"),
                "kv8_short": (["prefill.int8", "prefill.fp8"], "short")},
        candidates=lambda w: candidates.prefill_candidates(prefill_params.get_params(target, ""), w, rocm),
        by_total_time=True)


def run(kind: str, shapes, cases, dev, full: bool, rows: list, log):
    """(sides, launch override) of the decode or prefill family."""
    family = (decode_family if kind == "decode" else prefill_family)(shapes, cases, dev)
    return run_family(family, full, rows, log)
