"""Mixed batches on DCU_TRITON_ATTN at Qwen3.5-27B shapes (24 q / 4 kv heads x 256) on a GPU: the leading decode
rows on the split-KV kernel and the rest on TRITON_ATTN's forward (patch 0006's prefill kernel), against the whole
batch on that forward (VLLM_DCU_MIXED_DECODE_ROWS=0), for bf16, int8 and fp8 per-token-head caches.

Run through the harness (the variant tree on PYTHONPATH): VARIANT=full bash ci/gpu/run.sh pytest
tests/gpu/test_mixed_decode_rows_gpu.py -rA
"""
import types

import pytest
import torch

from tests.attention_checks import shuffled_block_table
from tests.dcu_backend_fakes import attention_layer, common_metadata, fake_vllm_config, random_kv_cache

pytestmark = pytest.mark.gpu

DEV = "cuda"
HQ, HKV, D = 24, 4, 256
# the engine's page sizes for Qwen3.5's hybrid cache (bf16 / 8-bit)
BLOCK = {"auto": 784, "int8_per_token_head": 1664, "fp8_per_token_head": 1552}
# three decode rows (16K, 3000, 700 tokens), a 512-token chunk after 8000, a 40-token chunk after 200
QUERY_LENS = [1, 1, 1, 512, 40]
SEQ_LENS = [16384, 3000, 700, 8512, 240]


def _cache(cache_dtype, g):
    table, num_blocks = shuffled_block_table(SEQ_LENS, BLOCK[cache_dtype], g)
    return random_kv_cache(cache_dtype, num_blocks, BLOCK[cache_dtype], HKV, D, g), table


@pytest.mark.parametrize("cache_dtype", ["auto", "int8_per_token_head", "fp8_per_token_head"])
def test_mixed_batch_split_matches_the_whole_batch(cache_dtype, monkeypatch, record):
    from vllm.dcu import triton_attn

    g = torch.Generator(device=DEV).manual_seed(0)
    kv_cache, table = _cache(cache_dtype, g)
    q = torch.randn(sum(QUERY_LENS), HQ, D, device=DEV, generator=g).bfloat16()
    layer = attention_layer()
    layer._k_scale, layer._v_scale = layer._k_scale.to(DEV), layer._v_scale.to(DEV)
    impl = triton_attn.DcuTritonAttentionImpl(num_heads=HQ, head_size=D, scale=D**-0.5, num_kv_heads=HKV,
                                              alibi_slopes=None, sliding_window=None, kv_cache_dtype=cache_dtype)
    outs, times = {}, {}
    for split in ("1", "0"):
        monkeypatch.setenv(triton_attn.MIXED_ENV, split)
        config = fake_vllm_config(HQ, HKV, D, max_num_seqs=16, cache_dtype=cache_dtype, max_model_len=32768)
        builder = triton_attn.DcuTritonAttentionMetadataBuilder(
            types.SimpleNamespace(block_size=BLOCK[cache_dtype]), ["layer.0"], config, torch.device(DEV))
        meta = builder.build(0, common_metadata(QUERY_LENS, SEQ_LENS, table, device=DEV))
        assert meta.num_mixed_decodes == (3 if split == "1" else 0)
        out = torch.full_like(q, float("nan"))

        def step():
            impl.forward(layer, q, None, None, kv_cache, meta, output=out)

        step()
        torch.cuda.synchronize()
        outs[split] = out.float().clone()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            step()
        end.record()
        torch.cuda.synchronize()
        times[split] = start.elapsed_time(end) / 5
    assert outs["1"].isfinite().all() and outs["0"].isfinite().all()
    assert float(outs["0"].abs().max()) > 0
    err = float((outs["1"] - outs["0"]).abs().max() / outs["0"].abs().max())
    record(max_err_rel_to_max=err, ms_split=round(times["1"], 3), ms_whole=round(times["0"], 3))
    assert err < 2e-2
