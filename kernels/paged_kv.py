"""Input checks shared by the paged attention launchers (decode_attention, prefill_attention).

Both read q [tokens or batch, q_heads, head_dim] fp16/bf16 against a vLLM cache of [num_blocks, block_size,
kv_heads, head_dim] in q's dtype, or uint8 codes with float32 per-(token, head) scales (kv_quant "fp8" /
"int8"), and write ``out`` shaped like q. Each launcher adds the checks of its own metadata.
"""
import torch

KV_QUANT_KINDS = (None, "fp8", "int8")


def check_q_and_cache(fail, q, k_cache, v_cache, out, k_scales, v_scales, kv_quant, max_group: int,
                      q_rows: str = "tokens", v_any_dim_stride: bool = False) -> None:
    """Call ``fail(message)`` (which raises) at the first problem; ``q_rows`` names q's first dimension;
    ``v_any_dim_stride``: the launcher reads V through its head_dim stride (V stored by dim, tokens contiguous)."""
    if kv_quant not in KV_QUANT_KINDS:
        fail(f"kv_quant must be one of {list(KV_QUANT_KINDS)}, got {kv_quant!r}")
    if q.dim() != 3 or q.dtype not in (torch.float16, torch.bfloat16):
        fail(f"q must be [{q_rows}, q_heads, head_dim] float16/bfloat16, got {tuple(q.shape)} {q.dtype}")
    _, hq, d = q.shape
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        fail(f"k_cache and v_cache must both be [num_blocks, block_size, kv_heads, head_dim], "
             f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    _, block_size, hkv, dk = k_cache.shape
    if dk != d:
        fail(f"head_dim of q ({d}) and of the cache ({dk}) differ")
    if block_size % 16:
        fail(f"block size must be a multiple of 16, got {block_size}")
    if hkv < 1 or hq % hkv or hq // hkv > max_group:
        fail(f"q heads ({hq}) must be a multiple of kv heads ({hkv}) with at most {max_group} q heads per kv head")
    want_kv = torch.uint8 if kv_quant else q.dtype
    if k_cache.dtype != want_kv or v_cache.dtype != want_kv:
        fail(f"kv_quant={kv_quant!r} needs {want_kv} caches, got {k_cache.dtype}/{v_cache.dtype}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("out", out)):
        if t.stride(-1) != 1 and not (name == "v_cache" and v_any_dim_stride):
            fail(f"{name} must be contiguous in head_dim")
    if kv_quant:
        for name, t in (("k_scales", k_scales), ("v_scales", v_scales)):
            if t is None or t.dtype != torch.float32 or tuple(t.shape) != tuple(k_cache.shape[:3]):
                got = None if t is None else f"{tuple(t.shape)} {t.dtype}"
                fail(f"kv_quant={kv_quant!r} needs {name} float32 {tuple(k_cache.shape[:3])}, got {got}")
    elif k_scales is not None or v_scales is not None:
        fail("k_scales/v_scales are only used with kv_quant='fp8' or 'int8'")
    if out.shape != q.shape or out.dtype != q.dtype:
        fail(f"out must be {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)} {out.dtype}")


def check_block_table(fail, block_table, num_seqs: int) -> None:
    if block_table.dim() != 2 or block_table.shape[0] < num_seqs or block_table.dtype != torch.int32:
        fail(f"block_table must be int32 [>= {num_seqs}, max_blocks], got {tuple(block_table.shape)} "
             f"{block_table.dtype}")
    if block_table.stride(1) != 1:
        fail("block_table rows must be contiguous")


def check_one_device(fail, *tensors) -> None:
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        fail(f"all tensors must be on one device, got {sorted(map(str, devices))}")
