"""DCU_TRITON_ATTN backend (patch 0003) in the patched vLLM tree, on the CPU.

Registry and platform wiring, the builder's decode-only vs mixed routing, and the Impl sending a
decode-only batch through the split-KV kernel (Triton interpreter) and everything else to
TRITON_ATTN's forward. End-to-end serving runs on the GPU harness.
"""
import os
import types

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")
import dcu_backend_fakes  # noqa: E402
import triton_interp_compat  # noqa: E402,F401

from kernels.decode_attention.reference import paged_decode_reference  # noqa: E402

HQ, HKV, D, BS = 6, 2, 32, 16


@pytest.fixture(scope="module")
def backend_mod(vllm_tree):
    try:
        from vllm.dcu import triton_attn
    except ImportError as e:
        pytest.fail(f"vllm.dcu.triton_attn (dcu/triton_attn.py) is not in the patched tree: {e}")
    return triton_attn


def fake_vllm_config(**kw):
    return dcu_backend_fakes.fake_vllm_config(HQ, HKV, D, **kw)


def make_builder(backend_mod, **kw):
    spec = types.SimpleNamespace(block_size=BS)
    return backend_mod.DcuTritonAttentionMetadataBuilder(spec, ["layer.0"], fake_vllm_config(**kw), torch.device("cpu"))


def common_metadata(query_lens, seq_lens, max_blocks=8):
    table = torch.arange(len(seq_lens) * max_blocks, dtype=torch.int32).view(len(seq_lens), max_blocks)
    return dcu_backend_fakes.common_metadata(query_lens, seq_lens, table)


def make_impl(backend_mod, **kw):
    args = dict(num_heads=HQ, head_size=D, scale=D**-0.5, num_kv_heads=HKV, alibi_slopes=None, sliding_window=None,
                kv_cache_dtype="auto")
    args.update(kw)
    return backend_mod.DcuTritonAttentionImpl(**args)


def test_registry_resolves_the_name_to_a_triton_attn_subclass(backend_mod):
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend, TritonAttentionMetadata

    cls = AttentionBackendEnum["DCU_TRITON_ATTN"].get_class()
    assert cls is backend_mod.DcuTritonAttentionBackend and cls.get_name() == "DCU_TRITON_ATTN"
    assert issubclass(cls, TritonAttentionBackend)
    # eagle / KV connectors check isinstance(..., TritonAttentionMetadata)
    assert issubclass(backend_mod.DcuTritonAttentionMetadata, TritonAttentionMetadata)
    assert cls.get_kv_cache_shape(10, 784, 4, 256) == (10, 2, 784, 4, 256)


def test_selection_validates_qwen35_shapes_and_rejects_what_triton_attn_rejects(backend_mod):
    from vllm.platforms.interface import DeviceCapability

    cls = backend_mod.DcuTritonAttentionBackend
    common = dict(dtype=torch.bfloat16, kv_cache_dtype="auto", use_mla=False, has_sink=False, use_sparse=False,
                  use_mm_prefix=False, use_per_head_quant_scales=False, device_capability=DeviceCapability(9, 0),
                  attn_type="decoder")
    assert cls.validate_configuration(head_size=256, block_size=784, **common) == []
    assert "block_size not supported" in cls.validate_configuration(head_size=256, block_size=40, **common)
    assert "head_size not supported" in cls.validate_configuration(head_size=16, block_size=16, **common)


def test_rocm_prefers_the_backend_over_triton_attn(backend_mod, monkeypatch):
    # import the ROCm platform module on a CPU machine: it asks torch for the GCN arch once
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda *a, **k: types.SimpleNamespace(gcnArchName="gfx936"))
    from vllm.platforms import rocm
    from vllm.v1.attention.backends.registry import AttentionBackendEnum as B

    prio = rocm._get_backend_priorities(use_mla=False, use_sparse=False)
    assert prio.index(B.DCU_TRITON_ATTN) < prio.index(B.TRITON_ATTN)
    assert B.DCU_TRITON_ATTN not in rocm._get_backend_priorities(use_mla=True, use_sparse=False)


def test_full_graphs_only_for_uniform_batches(backend_mod):
    from vllm.v1.attention.backend import AttentionCGSupport

    support = backend_mod.DcuTritonAttentionMetadataBuilder.get_cudagraph_support(None, None)
    assert support == AttentionCGSupport.UNIFORM_BATCH


def test_builder_marks_decode_only_batches_and_shares_one_workspace(backend_mod):
    builder = make_builder(backend_mod, max_num_seqs=8)
    decode = builder.build(0, common_metadata([1, 1, 1], [40, 3, 17]))
    mixed = builder.build(0, common_metadata([1, 5, 1], [40, 9, 17]))
    spec = builder.build(0, common_metadata([3, 3], [40, 9]))  # uniform spec-decode batch
    too_big = make_builder(backend_mod, max_num_seqs=2, capture_sizes=(1, 2)).build(
        0, common_metadata([1, 1, 1], [4, 4, 4]))
    assert decode.decode_only and not mixed.decode_only and not spec.decode_only and not too_big.decode_only
    assert decode.decode_workspace is mixed.decode_workspace is builder.decode_workspace
    # graph capture builds decode metadata with seq_lens 1 and still routes to the decode kernel
    captured = builder.build_for_cudagraph_capture(common_metadata([1] * 4, [9] * 4))
    assert captured.decode_only and torch.equal(captured.seq_lens, torch.ones(4, dtype=torch.int32))


def test_decode_only_batch_runs_the_split_kv_kernel(backend_mod, monkeypatch):
    from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl

    monkeypatch.setattr(TritonAttentionImpl, "forward", lambda *a, **k: pytest.fail("routed to unified attention"))
    lens = [40, 3, 17]
    g = torch.Generator().manual_seed(0)
    kv_cache = torch.randn(24, 2, BS, HKV, D, generator=g).to(torch.bfloat16)
    meta = make_builder(backend_mod).build(0, common_metadata([1] * 3, lens))
    q = torch.randn(4, HQ, D, generator=g).to(torch.bfloat16)  # one padding row past the batch
    out = torch.full_like(q, float("nan"))
    make_impl(backend_mod).forward(None, q, None, None, kv_cache, meta, output=out)
    k, v = kv_cache.unbind(1)
    want = paged_decode_reference(q[:3], k, v, meta.block_table, meta.seq_lens, D**-0.5)
    assert (out[:3].double() - want).abs().max() < 4e-2
    assert out[3].isnan().all()  # rows past the batch are left alone


@pytest.mark.parametrize("failure", ["compile", "wrong"])
def test_a_decode_kernel_failing_its_startup_check_hands_decode_to_triton_attn(backend_mod, monkeypatch, caplog,
                                                                               failure):
    """Issue #43: the builder runs the decode kernel once against its reference; a compile error or a wrong output
    makes every decode batch take TRITON_ATTN's forward (one warning line), and the decision table says why."""
    from vllm.dcu_kernels.tuning import decisions
    from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl

    from vllm.dcu import kernel_checks

    real = kernel_checks._kernels()

    def broken(q, *args, **kw):
        if failure == "compile":
            raise RuntimeError("triton.compiler.errors.CompilationError: at 12:4: unsupported")
        out = real[0](q, *args, **kw)
        return out.add_(1.0)

    monkeypatch.setattr(kernel_checks, "_kernels", lambda: (broken, *real[1:]))
    with caplog.at_level("WARNING", logger="vllm.dcu.tuning"):
        meta = make_builder(backend_mod).build(0, common_metadata([1] * 3, [40, 3, 17]))
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= 30]
    why = "failed to compile or run: RuntimeError" if failure == "compile" else "differs from upstream: batch 1"
    assert line.startswith(f"vllm-dcu: decode.bf16: our kernel {why}") and "unified attention runs instead" in line
    assert not decisions.runs_ours("decode.bf16")
    seen = []
    monkeypatch.setattr(TritonAttentionImpl, "forward", lambda *a, **k: seen.append("triton_attn"))
    q = torch.randn(3, HQ, D).to(torch.bfloat16)
    make_impl(backend_mod).forward(None, q, None, None, torch.zeros(24, 2, BS, HKV, D).bfloat16(), meta,
                                   output=torch.empty_like(q))
    assert seen == ["triton_attn"]
    table = decisions.table_lines()
    assert any(r.startswith("decode.bf16") and f"upstream (unified attention): {why}" in r for r in table)


def test_a_decode_kernel_forced_with_its_variable_fails_the_start_with_one_error(backend_mod, monkeypatch):
    from vllm.dcu import kernel_checks

    real = kernel_checks._kernels()
    monkeypatch.setattr(kernel_checks, "_kernels", lambda: (lambda *a, **k: 1 / 0, *real[1:]))
    monkeypatch.setenv("VLLM_DCU_DECODE_ATTN", "1")
    with pytest.raises(RuntimeError, match=r"decode.bf16 failed to compile or run: ZeroDivisionError.*forced with "
                                           r"VLLM_DCU_DECODE_ATTN=1"):
        make_builder(backend_mod)


def test_builder_splits_the_leading_decode_rows_off_a_mixed_batch(backend_mod, monkeypatch):
    builder = make_builder(backend_mod, max_num_seqs=8)
    cm = common_metadata([1, 1, 5, 1, 3], [40, 3, 17, 9, 30])
    meta = builder.build(0, cm)
    assert not meta.decode_only and meta.num_mixed_decodes == 2
    rest = meta.mixed_rest
    assert rest.num_actual_tokens == 9 and rest.max_query_len == 5
    assert rest.query_start_loc.tolist() == [0, 5, 6, 9]
    assert rest.seq_lens.tolist() == [17, 9, 30]
    assert torch.equal(rest.block_table, cm.block_table_tensor[2:])
    assert torch.equal(rest.slot_mapping, cm.slot_mapping[2:])
    # new tensors, not views 2 rows in (Triton would specialize on the unaligned pointers)
    for t in (rest.seq_lens, rest.block_table):
        assert t.storage_offset() == 0 and t.is_contiguous()
    assert rest.block_table.data_ptr() != cm.block_table_tensor.data_ptr()
    # the decode rows' lengths, sliced once for every layer of the step (at offset 0: aligned as seq_lens is)
    assert meta.mixed_decode_seq_lens.tolist() == [40, 3]
    assert meta.mixed_decode_seq_lens.data_ptr() == meta.seq_lens.data_ptr()
    # nothing to split: a prefill first, a prefill-only batch, decode-only batches
    for qlens in ([5, 1, 1], [4, 6], [1, 1, 1]):
        other = builder.build(0, common_metadata(qlens, [40, 30, 20][: len(qlens)]))
        assert other.num_mixed_decodes == 0 and other.mixed_rest is None and other.mixed_decode_seq_lens is None
    # off by env (read when the builder is made)
    monkeypatch.setenv("VLLM_DCU_MIXED_DECODE_ROWS", "0")
    off = make_builder(backend_mod, max_num_seqs=8).build(0, cm)
    assert off.num_mixed_decodes == 0 and off.mixed_rest is None


def test_bad_mixed_decode_rows_value_fails_when_the_builder_is_made(backend_mod, monkeypatch):
    monkeypatch.setenv("VLLM_DCU_MIXED_DECODE_ROWS", "yes")
    with pytest.raises(ValueError, match="VLLM_DCU_MIXED_DECODE_ROWS='yes': supported values are 1"):
        make_builder(backend_mod)


def test_leading_decode_rows_counts_only_the_first_run_of_one_token_requests(backend_mod):
    f = backend_mod.leading_decode_rows
    qsl = lambda lens: torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)  # noqa: E731
    assert f(qsl([1, 1, 7, 1]), 4) == 2
    assert f(qsl([7, 1, 1]), 3) == 0
    assert f(qsl([1, 1, 1]), 3) == 3
    assert f(torch.tensor([0, 1, 2, 9, 9, 9], dtype=torch.int32), 3) == 2  # entries past num_reqs ignored


def test_mixed_batch_decode_rows_take_the_split_kv_kernel_and_the_rest_goes_to_triton_attn(backend_mod,
                                                                                         monkeypatch):
    from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl

    calls = []

    def fake_forward(self, layer, query, key, value, kv_cache, meta, output=None, *a, **k):
        calls.append((query, meta, output))
        output.fill_(7.0)  # stands for the prefill rows' attention
        return output

    monkeypatch.setattr(TritonAttentionImpl, "forward", fake_forward)
    lens, qlens = [40, 3, 17, 25], [1, 1, 4, 2]
    g = torch.Generator().manual_seed(1)
    kv_cache = torch.randn(40, 2, BS, HKV, D, generator=g).to(torch.bfloat16)
    meta = make_builder(backend_mod).build(0, common_metadata(qlens, lens, max_blocks=8))
    q = torch.randn(8, HQ, D, generator=g).to(torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    assert make_impl(backend_mod).forward(None, q, None, None, kv_cache, meta, output=out) is out
    k, v = kv_cache.unbind(1)
    want = paged_decode_reference(q[:2], k, v, meta.block_table[:2], meta.seq_lens[:2], D**-0.5)
    assert (out[:2].double() - want).abs().max() < 4e-2
    assert (out[2:] == 7.0).all()
    (rq, rmeta, rout), = calls
    assert rmeta is meta.mixed_rest and rq.data_ptr() == q[2:].data_ptr() and rout.data_ptr() == out[2:].data_ptr()
    assert rq.shape[0] == 6 and rout.shape[0] == 6


@pytest.mark.parametrize("impl_kw", [dict(sliding_window=64), dict(kv_cache_dtype="fp8")], ids=["sliding window",
                                                                                          "per-tensor fp8"])
def test_a_split_mixed_batch_goes_whole_to_triton_attn_where_the_decode_kernel_does_not_apply(backend_mod, monkeypatch,
                                                                                            impl_kw):
    from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl

    calls = []
    monkeypatch.setattr(TritonAttentionImpl, "forward", lambda self, *a, **k: calls.append(a) or "unified")
    meta = make_builder(backend_mod).build(0, common_metadata([1, 4], [20, 30]))
    assert meta.num_mixed_decodes == 1  # the builder splits; this layer's impl cannot take the decode rows
    q = torch.zeros(5, HQ, D, dtype=torch.bfloat16)
    kv_cache = torch.zeros(16, 2, BS, HKV, D, dtype=torch.bfloat16)
    assert make_impl(backend_mod, **impl_kw).forward(None, q, None, None, kv_cache, meta, output=q) == "unified"
    (args,) = calls
    assert args[1] is q and args[5] is meta  # (layer, query, key, value, kv_cache, metadata, output, ...)


@pytest.mark.parametrize("case", ["mixed batch", "sliding window", "sinks", "soft cap", "per-tensor fp8",
                                  "profiling run", "fp32 query"])
def test_everything_else_goes_to_triton_attn_forward(backend_mod, monkeypatch, case):
    from vllm.v1.attention.backends.triton_attn import TritonAttentionImpl

    calls = []
    monkeypatch.setattr(TritonAttentionImpl, "forward", lambda self, *a, **k: calls.append(a) or "unified")
    impl_kw = {"sliding window": dict(sliding_window=64), "sinks": dict(sinks=torch.zeros(HQ)),
               "soft cap": dict(logits_soft_cap=30.0), "per-tensor fp8": dict(kv_cache_dtype="fp8")}.get(case, {})
    builder = make_builder(backend_mod)
    # a mixed batch that does not start with a decode row (its decode rows are not split off)
    meta = builder.build(0, common_metadata([4, 1] if case == "mixed batch" else [1, 1], [20, 30]))
    if case == "profiling run":
        meta = None
    q = torch.zeros(5, HQ, D, dtype=torch.float32 if case == "fp32 query" else torch.bfloat16)
    kv_cache = torch.zeros(16, 2, BS, HKV, D, dtype=torch.bfloat16)
    assert make_impl(backend_mod, **impl_kw).forward(None, q, None, None, kv_cache, meta, output=q) == "unified"
    assert len(calls) == 1


@pytest.mark.parametrize("cache_dtype", ["auto", "int8_per_token_head", "fp8_per_token_head"])
def test_mixed_batch_split_matches_the_whole_batch_through_triton_attn(backend_mod, monkeypatch, cache_dtype):
    """The real thing on both sides (Triton interpreter): decode rows on the split-KV kernel and the rest through
    TRITON_ATTN's forward (patch 0006's prefill kernel), against the whole mixed batch through that forward."""
    lens, qlens = [40, 23, 30, 18], [1, 1, 5, 3]  # two decode rows, a chunk after 25 tokens, one after 15
    g = torch.Generator().manual_seed(2)
    kv_cache = dcu_backend_fakes.random_kv_cache(cache_dtype, 24, BS, HKV, D, g)
    q = torch.randn(sum(qlens), HQ, D, generator=g).to(torch.bfloat16)
    layer = dcu_backend_fakes.attention_layer()
    outs = {}
    for split in ("1", "0"):
        monkeypatch.setenv("VLLM_DCU_MIXED_DECODE_ROWS", split)
        builder = make_builder(backend_mod, cache_dtype=cache_dtype)
        meta = builder.build(0, common_metadata(qlens, lens, max_blocks=4))
        assert meta.num_mixed_decodes == (2 if split == "1" else 0)
        out = torch.full_like(q, float("nan"))
        make_impl(backend_mod, kv_cache_dtype=cache_dtype).forward(layer, q, None, None, kv_cache, meta, output=out)
        outs[split] = out.float()
    assert outs["1"].isfinite().all()
    err = (outs["1"] - outs["0"]).abs().max() / outs["0"].abs().max()
    assert err < 2e-2, err
