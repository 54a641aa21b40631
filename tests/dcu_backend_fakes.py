"""The vLLM objects DCU_TRITON_ATTN's builder and impl need, made without an engine (tests on the CPU with the
Triton interpreter, and on the GPU through the harness's variant tree)."""
import types

import torch


def fake_vllm_config(hq, hkv, d, max_num_seqs=8, capture_sizes=(1, 2, 4), cache_dtype="auto", max_model_len=4096):
    from vllm.config import CUDAGraphMode

    # dtype and max_model_len: the builder's prefill warmup (patch 0006) reads them (a no-op on the CPU)
    model = types.SimpleNamespace(
        get_num_attention_heads=lambda pc: hq, get_num_kv_heads=lambda pc: hkv, get_head_size=lambda: d,
        dtype=torch.bfloat16, max_model_len=max_model_len)
    return types.SimpleNamespace(
        model_config=model,
        parallel_config=types.SimpleNamespace(decode_context_parallel_size=1),
        compilation_config=types.SimpleNamespace(
            cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE, cudagraph_capture_sizes=list(capture_sizes)),
        scheduler_config=types.SimpleNamespace(max_num_seqs=max_num_seqs),
        cache_config=types.SimpleNamespace(cache_dtype=cache_dtype),
        speculative_config=None,
    )


def common_metadata(query_lens, seq_lens, block_table, device="cpu"):
    """vLLM's CommonAttentionMetadata of a batch (query lengths, sequence lengths, its block table)."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    qsl = torch.tensor([0] + list(torch.tensor(query_lens).cumsum(0)), dtype=torch.int32)
    n_tok = int(qsl[-1])
    return CommonAttentionMetadata(
        query_start_loc=qsl.to(device), query_start_loc_cpu=qsl,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        num_reqs=len(seq_lens), num_actual_tokens=n_tok, max_query_len=max(query_lens), max_seq_len=max(seq_lens),
        block_table_tensor=block_table, slot_mapping=torch.zeros(n_tok, dtype=torch.int64, device=device))


def attention_layer():
    """The layer attributes TRITON_ATTN's forward reads (per-tensor scales of 1)."""
    return types.SimpleNamespace(_k_scale=torch.ones(1), _v_scale=torch.ones(1), _q_scale_float=1.0)


def random_kv_cache(cache_dtype, num_blocks, block_size, num_kv_heads, head_size, g):
    """A cache of ``cache_dtype`` as vLLM lays it out, random contents on generator g's device: bf16 values, or
    8-bit codes (int8 in [-127, 127], e4m3 without NaN codes) with scales in [0.005, 0.025)."""
    from vllm.dcu_kernels.kv_quant import layout

    dev = g.device
    if cache_dtype == "auto":
        return torch.randn(num_blocks, 2, block_size, num_kv_heads, head_size, device=dev, generator=g).bfloat16()
    kind = layout.kv_quant_kind(cache_dtype)
    cache = torch.randint(0, 256, layout.kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size),
                          device=dev, generator=g, dtype=torch.uint8)
    k, v, ks, vs = layout.split_kv_cache(cache, head_size, kind)
    for codes in (k, v):
        if kind == "int8":
            codes[codes == 128] = 0
        else:
            codes[(codes & 0x7F) == 0x7F] = 0
    ks.copy_(torch.rand(ks.shape, device=dev, generator=g) * 0.02 + 0.005)
    vs.copy_(torch.rand(vs.shape, device=dev, generator=g) * 0.02 + 0.005)
    return cache
