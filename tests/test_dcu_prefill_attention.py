"""Patch 0006: launches with prefill routed to the prefill kernel (dcu/prefill_attention.py), on the CPU.

The routing rules alone (no vLLM), then through the patched tree: TRITON_ATTN's and DCU_TRITON_ATTN's forward
on a mixed batch reach the kernel and match the float64 reference; what the kernel does not cover reaches
upstream's unified attention; the metadata builder warms the kernel. The kernel's numerics are in
tests/test_prefill_attention.py, the GPU runs in tests/gpu/test_prefill_attention_gpu.py.
"""
import os
import types

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")
import dcu_backend_fakes  # noqa: E402
import triton_interp_compat  # noqa: E402,F401

from dcu import prefill_attention as route  # noqa: E402
from kernels.prefill_attention.reference import paged_prefill_reference  # noqa: E402

HQ, HKV, D, BS = 6, 2, 32, 16


def ua_kwargs(max_seqlen_q=4, **over):
    q = torch.zeros(5, HQ, D, dtype=torch.bfloat16)
    k = torch.zeros(4, BS, HKV, D, dtype=torch.bfloat16)
    kw = dict(q=q, k=k, v=k, out=q, cu_seqlens_q=None, max_seqlen_q=max_seqlen_q, seqused_k=None, max_seqlen_k=9,
              softmax_scale=0.1, causal=True, window_size=(-1, -1), block_table=None, softcap=0, q_descale=None,
              k_descale=None, v_descale=None, alibi_slopes=None, output_scale=None, qq_bias=None, sinks=None,
              mm_prefix_range=None)
    kw.update(over)
    return kw


# --- rules, no vLLM ------------------------------------------------------------------------------

def test_qwen35_prefill_launch_is_supported():
    assert route.unsupported(ua_kwargs()) is None
    assert route.unsupported(ua_kwargs(kv_quant="int8", k_scale_cache=torch.zeros(1),
                                       k=torch.zeros(4, BS, HKV, D, dtype=torch.uint8))) is None


@pytest.mark.parametrize("over,why", [
    (dict(alibi_slopes=torch.zeros(HQ)), "ALiBi"),
    (dict(sinks=torch.zeros(HQ)), "sinks"),
    (dict(softcap=30.0), "soft cap"),
    (dict(window_size=(127, 0)), "sliding window"),
    (dict(output_scale=torch.ones(1)), "fused output quantization"),
    (dict(q=torch.zeros(5, HQ, D)), "query dtype"),
    (dict(k=torch.zeros(4, BS, HKV, D, dtype=torch.float8_e4m3fn)), "per-tensor fp8"),
    (dict(q=torch.zeros(5, HQ, 512, dtype=torch.bfloat16), k=torch.zeros(4, BS, HKV, 512, dtype=torch.bfloat16)),
     "head size"),
    (dict(q=torch.zeros(5, 40, D, dtype=torch.bfloat16)), "q heads"),
    (dict(mm_prefix_range=torch.zeros(1)), "multimodal"),
])
def test_unsupported_features_are_named(over, why):
    assert why in route.unsupported(ua_kwargs(**over))


def test_switch_off_and_bad_values(monkeypatch):
    assert route.enabled({}) and route.enabled({route.ENV_VAR: "1"}) and not route.enabled({route.ENV_VAR: "0"})
    with pytest.raises(ValueError, match="supported values are 1 \\(default\\) and 0"):
        route.enabled({route.ENV_VAR: "yes"})
    calls = []
    monkeypatch.setenv(route.ENV_VAR, "0")
    wrapped = route.route_unified_attention(lambda **kw: calls.append(kw) or "upstream")
    assert wrapped(**ua_kwargs()) == "upstream" and len(calls) == 1
    monkeypatch.setenv(route.ENV_VAR, "maybe")
    with pytest.raises(ValueError, match=route.ENV_VAR):
        route.route_unified_attention(lambda **kw: None)


def test_decode_only_launch_stays_upstream(monkeypatch):
    monkeypatch.delenv(route.ENV_VAR, raising=False)
    wrapped = route.route_unified_attention(lambda **kw: "upstream")
    assert wrapped(**ua_kwargs(max_seqlen_q=1)) == "upstream"
    assert wrapped(**ua_kwargs(sinks=torch.zeros(HQ))) == "upstream"


def test_warmup_is_a_no_op_without_a_gpu():
    assert route.warmup(HQ, HKV, D, torch.bfloat16, "auto", BS, "cpu") is None


@pytest.mark.parametrize("max_model_len,env,tokens", [
    (None, {}, 32768),  # no engine length: the kernel's default
    (8192, {}, 32768),  # never below the default (several prompts in one batch)
    (32768, {}, 32768),
    (40000, {}, 40192),  # one sequence of max_model_len, rounded up to the mirror's 256-token page
    (262144, {}, 262144),
    (262144, {"VLLM_DCU_PREFILL_KV8_MIRROR_TOKENS": "0"}, 0),  # the variable wins: off
    (262144, {"VLLM_DCU_PREFILL_KV8_MIRROR_TOKENS": "50000"}, 50000),
])
def test_engine_mirror_holds_one_sequence_of_max_model_len(max_model_len, env, tokens):
    assert route.engine_mirror_tokens(max_model_len, env) == tokens


def test_engine_mirror_bad_variable_fails_naming_it():
    with pytest.raises(ValueError, match="VLLM_DCU_PREFILL_KV8_MIRROR_TOKENS='lots'"):
        route.engine_mirror_tokens(40000, {"VLLM_DCU_PREFILL_KV8_MIRROR_TOKENS": "lots"})


def test_mirror_bytes_at_qwen35_shape():
    assert route.mirror_bytes(32768, 4, 256) == 32768 * 4 * (4 * 256 + 4)  # ~128.5 MiB


@pytest.fixture
def fake_gpu_mirror(monkeypatch):
    """reserve_mirror on the CPU: torch.cuda reports a device, the kernel module's mirror_buffer records its calls
    (or raises what ``calls.raise_`` holds)."""
    import importlib

    class Calls(list):
        raise_ = None

    mod = importlib.import_module("kernels.prefill_attention.prefill_attention")
    calls = Calls()

    def buffer(device, hkv, d, tokens):
        if calls.raise_ is not None:
            raise calls.raise_
        calls.append((str(device), hkv, d, tokens))

    monkeypatch.setattr(route, "_mirror_api", lambda: mod)
    monkeypatch.setattr(mod, "mirror_buffer", buffer)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(route, "_ENGINE_MIRROR", {})
    monkeypatch.delenv(route.ENV_VAR, raising=False)
    monkeypatch.delenv(mod.MIRROR_ENV, raising=False)
    return calls


def test_reserve_mirror_allocates_one_mirror_of_max_model_len_for_8bit_caches(fake_gpu_mirror, monkeypatch):
    assert route.reserve_mirror(HQ, HKV, D, "auto", max_model_len=40000) is None  # bf16: no mirror
    assert route.reserve_mirror(HQ, HKV, 512, "int8_per_token_head", max_model_len=40000) is None  # not covered
    for _ in range(2):  # every attention layer makes an impl: one size, one buffer (the kernel caches it per shape)
        assert route.reserve_mirror(HQ, HKV, D, "int8_per_token_head", max_model_len=40000) == 40192
    assert fake_gpu_mirror == [("cuda:0", HKV, D, 40192)] * 2 and route._ENGINE_MIRROR == {"tokens": 40192}
    monkeypatch.setenv("VLLM_DCU_PREFILL_KV8_MIRROR_TOKENS", "0")
    assert route.reserve_mirror(HQ, HKV, D, "fp8_per_token_head", max_model_len=40000) == 0  # off: nothing allocated
    assert len(fake_gpu_mirror) == 2 and route._ENGINE_MIRROR == {"tokens": 0}


def test_reserve_mirror_keys_the_buffer_by_the_indexed_device(fake_gpu_mirror):
    # warmup passes the builder's device ("cuda" or "cuda:N"); the kernel looks the buffer up by q.device, "cuda:N"
    for device, want in ((None, "cuda:0"), ("cuda", "cuda:0"), ("cuda:1", "cuda:1")):
        route.reserve_mirror(HQ, HKV, D, "int8_per_token_head", max_model_len=40000, device=device)
        assert fake_gpu_mirror[-1] == (want, HKV, D, 40192)


def test_reserve_mirror_that_does_not_fit_fails_naming_the_knobs(fake_gpu_mirror):
    fake_gpu_mirror.raise_ = torch.OutOfMemoryError("CUDA out of memory")
    with pytest.raises(RuntimeError, match=r"prefill mirror \(1048576 tokens, 4112 MiB, sized from max_model_len "
                                           r"1048576\) does not fit .*--gpu-memory-utilization or --max-model-len"):
        route.reserve_mirror(HQ * 2, 4, 256, "int8_per_token_head", max_model_len=1 << 20)
    assert route._ENGINE_MIRROR == {}


def test_reserve_mirror_reads_max_model_len_from_vllm_config(fake_gpu_mirror, vllm_tree, monkeypatch):
    import vllm.config

    cfg = types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=50000))
    monkeypatch.setattr(vllm.config, "get_current_vllm_config_or_none", lambda: cfg)
    assert route.reserve_mirror(HQ, HKV, D, "int8_per_token_head") == 50176
    monkeypatch.setattr(vllm.config, "get_current_vllm_config_or_none", lambda: None)  # an impl made by hand
    assert route.reserve_mirror(HQ, HKV, D, "int8_per_token_head") == 32768
    monkeypatch.delattr(vllm.config, "get_current_vllm_config_or_none")  # a fork without it: the raising getter

    def outside_context():
        raise AssertionError("Current vLLM config is not set.")

    monkeypatch.setattr(vllm.config, "get_current_vllm_config", outside_context)
    assert route.reserve_mirror(HQ, HKV, D, "int8_per_token_head") == 32768
    monkeypatch.setattr(vllm.config, "get_current_vllm_config", lambda: cfg)
    assert route.reserve_mirror(HQ, HKV, D, "int8_per_token_head") == 50176


def test_router_passes_the_engine_mirror_size_to_the_kernel(monkeypatch):
    seen = []
    fake = lambda *a, **kw: seen.append(kw.get("mirror"))  # noqa: E731
    monkeypatch.setattr(route, "_kernels", lambda: (fake, 8, None))
    monkeypatch.setattr(route, "_ENGINE_MIRROR", {})
    monkeypatch.delenv(route.ENV_VAR, raising=False)
    wrapped = route.route_unified_attention(lambda **kw: "upstream")
    wrapped(**ua_kwargs())
    route._ENGINE_MIRROR["tokens"] = 40192  # what reserve_mirror sets for max_model_len 40000 with an 8-bit cache
    wrapped(**ua_kwargs())
    assert seen == [None, 40192]


# --- through the patched tree ----------------------------------------------------------------------

def fake_vllm_config(cache_dtype="auto"):
    return dcu_backend_fakes.fake_vllm_config(HQ, HKV, D, cache_dtype=cache_dtype, max_model_len=40000)


@pytest.fixture
def kernel_calls(vllm_tree, monkeypatch):
    """Counts calls of the prefill kernel as the patched tree's router reaches it."""
    import vllm.dcu_kernels.prefill_attention as pa

    calls = []
    real = pa.prefill_attention

    def spy(*a, **k):
        calls.append(k.get("kv_quant"))
        return real(*a, **k)

    monkeypatch.setattr(pa, "prefill_attention", spy)
    monkeypatch.delenv(route.ENV_VAR, raising=False)
    return calls


def test_unified_attention_in_the_tree_is_the_router(vllm_tree):
    from vllm.v1.attention.backends import triton_attn
    from vllm.v1.attention.ops import triton_unified_attention as ua

    assert hasattr(ua.unified_attention, "dcu_upstream")
    assert triton_attn.unified_attention is ua.unified_attention  # the backend imported the routed name


@pytest.mark.parametrize("backend", ["TRITON_ATTN", "DCU_TRITON_ATTN"])
def test_mixed_batch_through_the_backend_reaches_the_kernel_and_matches_reference(kernel_calls, backend):
    from vllm.v1.attention.backends import triton_attn

    if backend == "DCU_TRITON_ATTN":
        from vllm.dcu import triton_attn as mod

        builder_cls, impl_cls = mod.DcuTritonAttentionMetadataBuilder, mod.DcuTritonAttentionImpl
    else:
        builder_cls, impl_cls = triton_attn.TritonAttentionMetadataBuilder, triton_attn.TritonAttentionImpl
    g = torch.Generator().manual_seed(0)
    query_lens, seq_lens = [1, 13, 1], [40, 29, 17]  # two decodes beside a chunk of 13 after 16 cached tokens
    kv_cache = torch.randn(12, 2, BS, HKV, D, generator=g).to(torch.bfloat16)
    table = torch.randperm(12, generator=g)[:9].to(torch.int32).view(3, 3)
    builder = builder_cls(types.SimpleNamespace(block_size=BS), ["layer.0"], fake_vllm_config(), torch.device("cpu"))
    meta = builder.build(0, dcu_backend_fakes.common_metadata(query_lens, seq_lens, table))
    q = torch.randn(16, HQ, D, generator=g).to(torch.bfloat16)  # one padding row past the batch
    out = torch.full_like(q, float("nan"))
    layer = dcu_backend_fakes.attention_layer()
    impl = impl_cls(num_heads=HQ, head_size=D, scale=D**-0.5, num_kv_heads=HKV, alibi_slopes=None,
                    sliding_window=None, kv_cache_dtype="auto")
    impl.forward(layer, q, None, None, kv_cache, meta, output=out)
    assert kernel_calls == [None]
    k, v = kv_cache.unbind(1)
    want = paged_prefill_reference(q[:15], k, v, meta.query_start_loc, meta.seq_lens, meta.block_table, D**-0.5)
    assert (out[:15].double() - want).abs().max() < 4e-2
    assert out[15].isnan().all()


def test_sliding_window_layer_keeps_upstream(kernel_calls, monkeypatch):
    # TRITON_ATTN's forward passes its window to the router, which hands the launch to upstream (a stand-in here:
    # without a GPU driver vLLM's own Triton kernels are placeholders)
    import vllm.dcu.prefill_attention as tree_route
    from vllm.v1.attention.backends import triton_attn

    upstream = []
    monkeypatch.setattr(triton_attn, "unified_attention",
                        tree_route.route_unified_attention(lambda **kw: upstream.append(kw["window_size"])))
    g = torch.Generator().manual_seed(1)
    kv_cache = torch.randn(8, 2, BS, HKV, D, generator=g).to(torch.bfloat16)
    table = torch.arange(8, dtype=torch.int32).view(2, 4)
    builder = triton_attn.TritonAttentionMetadataBuilder(types.SimpleNamespace(block_size=BS), ["layer.0"],
                                                         fake_vllm_config(), torch.device("cpu"))
    meta = builder.build(0, dcu_backend_fakes.common_metadata([5, 1], [20, 9], table))
    q = torch.randn(6, HQ, D, generator=g).to(torch.bfloat16)
    layer = dcu_backend_fakes.attention_layer()
    for window in (8, None):  # a sliding-window layer, then a plain one
        impl = triton_attn.TritonAttentionImpl(num_heads=HQ, head_size=D, scale=D**-0.5, num_kv_heads=HKV,
                                               alibi_slopes=None, sliding_window=window, kv_cache_dtype="auto")
        impl.forward(layer, q, None, None, kv_cache, meta, output=torch.empty_like(q))
    assert upstream == [(7, 0)] and kernel_calls == [None]


def test_metadata_builder_warms_the_kernel_with_the_engine_shape(vllm_tree, monkeypatch):
    import vllm.dcu.prefill_attention as tree_route
    from vllm.v1.attention.backends import triton_attn

    seen = []
    monkeypatch.setattr(tree_route, "warmup", lambda *a, **kw: seen.append((a, kw)))
    triton_attn.TritonAttentionMetadataBuilder(types.SimpleNamespace(block_size=BS), ["layer.0"],
                                               fake_vllm_config("int8_per_token_head"), torch.device("cpu"))
    assert seen == [((HQ, HKV, D, torch.bfloat16, "int8_per_token_head", BS, torch.device("cpu")),
                     {"max_model_len": 40000})]


def test_attention_impl_reserves_the_mirror_with_the_layer_shape(vllm_tree, monkeypatch):
    import vllm.dcu.prefill_attention as tree_route
    from vllm.v1.attention.backends import triton_attn

    seen = []
    monkeypatch.setattr(tree_route, "reserve_mirror", lambda *a, **kw: seen.append((a, kw)))
    triton_attn.TritonAttentionImpl(num_heads=HQ, head_size=D, scale=D**-0.5, num_kv_heads=HKV, alibi_slopes=None,
                                    sliding_window=None, kv_cache_dtype="int8_per_token_head")
    assert seen == [((HQ, HKV, D, "int8_per_token_head"), {})]


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_8bit_cache_written_by_the_backend_and_read_by_the_kernel_matches_reference(kernel_calls, kind):
    # TRITON_ATTN writes the per-token-head cache (patch 0002) and a mixed batch with a 70-token chunk (the mirror)
    # and decodes (the direct path) reaches the prefill kernel through the router, with the host max length
    from kernels.kv_quant.layout import kv_cache_shape
    from kernels.kv_quant.reference import paged_attention_reference, reshape_and_cache_reference
    from vllm.v1.attention.backends import triton_attn

    g = torch.Generator().manual_seed(7)
    query_lens, seq_lens = [1, 70, 1], [33, 90, 5]
    nblk = [-(-s // BS) for s in seq_lens]
    table = torch.zeros(3, max(nblk), dtype=torch.int32)
    order, used = torch.randperm(sum(nblk) + 1, generator=g), 0
    for i, n in enumerate(nblk):
        table[i, :n] = order[used : used + n]
        used += n
    cache = torch.zeros(kv_cache_shape(sum(nblk) + 1, BS, HKV, D), dtype=torch.uint8)
    impl = triton_attn.TritonAttentionImpl(num_heads=HQ, head_size=D, scale=D**-0.5, num_kv_heads=HKV,
                                           alibi_slopes=None, sliding_window=None,
                                           kv_cache_dtype=f"{kind}_per_token_head")
    layer = types.SimpleNamespace(_k_scale=torch.ones(()), _v_scale=torch.ones(()), _q_scale_float=1.0)
    want_cache = cache.clone()
    for i, s in enumerate(seq_lens):
        k = (torch.randn(s, HKV, D, generator=g) * 2).to(torch.bfloat16)
        v = torch.randn(s, HKV, D, generator=g).to(torch.bfloat16)
        slots = table[i, torch.arange(s) // BS].long() * BS + torch.arange(s) % BS
        impl.do_kv_cache_update(layer, k, v, cache, slots)
        reshape_and_cache_reference(k, v, want_cache, slots, kind)
    assert torch.equal(cache, want_cache)
    builder = triton_attn.TritonAttentionMetadataBuilder(types.SimpleNamespace(block_size=BS), ["layer.0"],
                                                         fake_vllm_config(f"{kind}_per_token_head"),
                                                         torch.device("cpu"))
    meta = builder.build(0, dcu_backend_fakes.common_metadata(query_lens, seq_lens, table))
    q = torch.randn(72, HQ, D, generator=g).to(torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    impl.forward(layer, q, None, None, cache, meta, output=out)
    assert kernel_calls == [kind]
    want = paged_attention_reference(q.float(), cache, kind, table, meta.seq_lens, meta.query_start_loc, D**-0.5)
    err = ((out.float() - want).norm() / want.norm()).item()
    assert torch.isfinite(out).all() and err < 1.5e-2, err
