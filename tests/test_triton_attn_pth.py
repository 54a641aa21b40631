"""TRITON_ATTN with fp8/int8_per_token_head caches (patch 0002), through the backend, on the CPU.

TritonAttentionImpl.do_kv_cache_update writes with the per-(token, head) kernel, and forward runs the
patched unified attention (Triton interpreter, small shapes) on the code + scale views: mixed
prefill/decode batches (2D kernel), decode-only batches (3D kernel), bf16 (scales on S and P) and
fp16 (dequantized tiles), against the float64 reference over the same quantized cache.
"""
import importlib.util
import math
import os
import types

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")
import triton_interp_compat  # noqa: E402,F401

from kernels.kv_quant import split_kv_cache  # noqa: E402
from kernels.kv_quant.layout import kv_cache_shape  # noqa: E402
from kernels.kv_quant.reference import (  # noqa: E402
    paged_attention_reference,
    relative_error,
    reshape_and_cache_reference,
)

HQ, HKV, D, BS = 4, 2, 64, 16
SEGMENTS = 4


@pytest.fixture(scope="module")
def triton_attn(vllm_tree):
    from typing import get_args

    from vllm.config.cache import CacheDType

    if "fp8_per_token_head" not in get_args(CacheDType):
        pytest.fail("per-token-head dtypes missing from the vLLM tree: is 0002-kv-cache-per-token-head.patch in "
                    "patches/series?")
    from vllm.v1.attention.backends import triton_attn

    return triton_attn


@pytest.fixture(scope="module")
def unified_attention(triton_attn):
    """The patched unified_attention compiled with real Triton: without a GPU driver vllm.triton_utils hands
    out a placeholder, so load a private copy of the module with the real triton (interpreter mode)."""
    import triton
    import triton.language as tl

    import vllm.triton_utils as tu

    path = importlib.util.find_spec("vllm.v1.attention.ops.triton_unified_attention").origin
    saved = tu.triton, tu.tl
    tu.triton, tu.tl = triton, tl
    try:
        spec = importlib.util.spec_from_file_location("pth_unified_attention_under_test", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        tu.triton, tu.tl = saved
    # with patch 0006 launches with prefill go to its kernel: these tests are about 0002's path in 0.18.1's kernels
    return getattr(mod.unified_attention, "dcu_upstream", mod.unified_attention)


def make_impl(triton_attn, cache_dtype):
    return triton_attn.TritonAttentionImpl(
        num_heads=HQ, head_size=D, scale=D**-0.5, num_kv_heads=HKV, alibi_slopes=None, sliding_window=None,
        kv_cache_dtype=cache_dtype)


def make_batch(query_lens, context_lens, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in zip(context_lens, query_lens)]
    nblk = [math.ceil(s / BS) for s in seq_lens]
    num_blocks = sum(nblk) + 2
    order = torch.randperm(num_blocks, generator=g)
    table = torch.zeros(len(seq_lens), max(nblk) + 1, dtype=torch.int32)
    used = 0
    for i, n in enumerate(nblk):
        table[i, :n] = order[used : used + n]
        used += n
    keys = [(torch.randn(s, HKV, D, generator=g) * 2).to(dtype) for s in seq_lens]
    values = [torch.randn(s, HKV, D, generator=g).to(dtype) for s in seq_lens]
    slots = [table[i, torch.arange(s) // BS].long() * BS + torch.arange(s) % BS for i, s in enumerate(seq_lens)]
    qsl = torch.tensor([0] + list(torch.tensor(query_lens).cumsum(0)), dtype=torch.int32)
    q = torch.randn(int(qsl[-1]), HQ, D, generator=g).to(dtype)
    return dict(seq_lens=seq_lens, table=table, num_blocks=num_blocks, keys=keys, values=values, slots=slots,
                qsl=qsl, q=q, query_lens=query_lens)


def metadata(triton_attn, b, decode_only):
    n = int(b["qsl"][-1])
    return triton_attn.TritonAttentionMetadata(
        num_actual_tokens=n, max_query_len=max(b["query_lens"]), query_start_loc=b["qsl"],
        max_seq_len=max(b["seq_lens"]), seq_lens=torch.tensor(b["seq_lens"], dtype=torch.int32),
        block_table=b["table"], slot_mapping=torch.zeros(n, dtype=torch.int64),
        seq_threshold_3D=8 if decode_only else 0, num_par_softmax_segments=SEGMENTS,
        softmax_segm_output=torch.empty(8, HQ, SEGMENTS, D), softmax_segm_max=torch.empty(8, HQ, SEGMENTS),
        softmax_segm_expsum=torch.empty(8, HQ, SEGMENTS),
        use_cascade=False, common_prefix_len=0, cu_prefix_query_lens=None, prefix_kv_lens=None,
        suffix_kv_lens=None)


def layer():
    one = torch.ones((), dtype=torch.float32)
    return types.SimpleNamespace(_k_scale=one, _v_scale=one, _q_scale_float=1.0)


CASES = [
    # (query lens, context lens, decode-only -> 3D kernel)
    pytest.param([5, 1, 17], [30, 40, 0], False, id="mixed-2d"),
    pytest.param([1, 1, 1], [50, 7, 33], True, id="decode-3d"),
]


@pytest.mark.parametrize("kind", ["fp8", "int8"])
@pytest.mark.parametrize("query_lens, context_lens, decode_only", CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_backend_writes_and_attends_per_token_head_cache(triton_attn, unified_attention, monkeypatch, kind,
                                                         query_lens, context_lens, decode_only, dtype):
    monkeypatch.setattr(triton_attn, "unified_attention", unified_attention)
    impl = make_impl(triton_attn, f"{kind}_per_token_head")
    assert impl.kv_quant == kind and impl.software_fp8 == (kind == "fp8")  # interpreter: software e4m3
    b = make_batch(query_lens, context_lens, dtype, seed=len(query_lens) + decode_only)
    cache = torch.zeros(kv_cache_shape(b["num_blocks"], BS, HKV, D), dtype=torch.uint8)
    want_cache = cache.clone()
    for k, v, s in zip(b["keys"], b["values"], b["slots"]):
        impl.do_kv_cache_update(layer(), k, v, cache, s)
        reshape_and_cache_reference(k, v, want_cache, s, kind)
    assert torch.equal(cache, want_cache)

    out = torch.full_like(b["q"], float("nan"))
    meta = metadata(triton_attn, b, decode_only)
    impl.forward(layer(), b["q"], None, None, cache, meta, output=out)
    want = paged_attention_reference(b["q"].float(), cache, kind, b["table"], meta.seq_lens, b["qsl"], D**-0.5)
    err = relative_error(out.float(), want)
    # bf16 rounds P (and the output) to 8 bits, fp16 to 11
    assert err < (1.5e-2 if dtype == torch.bfloat16 else 2e-3), err


def test_bf16_scales_on_scores_and_dequantized_tiles_agree(triton_attn, unified_attention):
    b = make_batch([3, 1], [40, 20], torch.bfloat16, seed=9)
    cache = torch.zeros(kv_cache_shape(b["num_blocks"], BS, HKV, D), dtype=torch.uint8)
    for k, v, s in zip(b["keys"], b["values"], b["slots"]):
        reshape_and_cache_reference(k, v, cache, s, "int8")
    k_codes, v_codes, k_scales, v_scales = split_kv_cache(cache, D, "int8")
    outs = []
    for tiles in (False, True):
        out = torch.zeros_like(b["q"])
        ones = torch.ones(2, HKV)
        unified_attention(b["q"], k_codes, v_codes, out, b["qsl"], 3, torch.tensor(b["seq_lens"], dtype=torch.int32),
                          max(b["seq_lens"]), D**-0.5, True, (-1, -1), b["table"], 0, None, ones, ones,
                          kv_quant="int8", k_scale_cache=k_scales, v_scale_cache=v_scales, dequant_tiles=tiles)
        outs.append(out.float())
    assert relative_error(outs[0], outs[1]) < 1e-2


def test_cached_views_follow_the_cache_tensor(triton_attn):
    impl = make_impl(triton_attn, "int8_per_token_head")
    a = torch.zeros(kv_cache_shape(2, BS, HKV, D), dtype=torch.uint8)
    b = torch.zeros_like(a)
    va = impl._split_kv_cache(a)
    assert impl._split_kv_cache(a) is va
    vb = impl._split_kv_cache(b)
    assert vb[0].data_ptr() == b.data_ptr() and vb is not va


def test_plain_caches_keep_their_paths(triton_attn):
    impl = make_impl(triton_attn, "auto")
    assert impl.kv_quant is None
    impl = make_impl(triton_attn, "fp8")
    assert impl.kv_quant is None


def test_attention_bench_times_decode_and_prefill_points_for_every_method(unified_attention, monkeypatch):
    """kernels/kv_quant/bench_attention.py's call path at tiny shapes (the GPU run times it): decode points use
    one query token per sequence, a prefill point one sequence's last `chunk` tokens through the 2D kernel."""
    from kernels.kv_quant import bench_attention as ba

    monkeypatch.setattr(ba, "HQ", HQ)
    monkeypatch.setattr(ba, "HKV", HKV)
    monkeypatch.setattr(ba, "D", D)
    monkeypatch.setattr(ba, "SEGMENTS", SEGMENTS)
    monkeypatch.setattr(ba, "THRESHOLD_3D", 4)
    monkeypatch.setattr(ba, "BLOCK", {"bf16": BS, "fp8": 2 * BS, "int8": 2 * BS})
    calls = []

    def time_once(fn):
        fn()
        calls.append(1)
        return 10.0 + len(calls)

    monkeypatch.setattr(ba, "_time_us", time_once)
    rows = ba.bench([2], [48], dev="cpu", unified_attention=unified_attention, prefill_chunks=[16, 64])
    methods = list(ba.METHODS)
    assert [(r["q_tokens"], r["method"]) for r in rows] == [(1, m) for m in methods] + [(16, m) for m in methods]
    assert {r["kernel"] for r in rows if r["q_tokens"] == 1} == {"3D"}
    assert {r["kernel"] for r in rows if r["q_tokens"] == 16} == {"2D"}  # the 64-token chunk exceeds ctx 48
    assert rows[0]["vs_bf16"] == 1.0 and rows[1]["vs_bf16"] == round(12.0 / 11.0, 3)
