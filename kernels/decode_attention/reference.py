"""Torch reference for paged decode attention, written for clarity, not speed. Quantized caches are
dequantized per docs/kv-cache-layout.md (value = code * scale of its (token, head)) in float64.
Quantizing and the page-layout views live in kernels/kv_quant/."""
import torch


def dequantize(codes: torch.Tensor, scales: torch.Tensor, kv_quant: str, dtype=torch.float64) -> torch.Tensor:
    """uint8 codes [..., D] and float32 scales [...] -> values [..., D] in ``dtype``."""
    if kv_quant == "fp8":
        vals = codes.view(torch.float8_e4m3fn).to(dtype)
    elif kv_quant == "int8":
        vals = codes.view(torch.int8).to(dtype)
    else:
        raise ValueError(f"kv_quant must be 'fp8' or 'int8', got {kv_quant!r}")
    return vals * scales.to(dtype)[..., None]


def gather_sequence_kv(k_cache, v_cache, block_table_row, n, *, k_scales=None, v_scales=None, kv_quant=None,
                       dtype=torch.float64):
    """The first ``n`` tokens' K and V of one sequence from its pages, in ``dtype``: two [n, kv_heads, D]."""
    block_size, hkv, d = k_cache.shape[1:]
    pages = block_table_row[: (n + block_size - 1) // block_size].long()
    if kv_quant is None:
        k = k_cache[pages].to(dtype)
        v = v_cache[pages].to(dtype)
    else:
        k = dequantize(k_cache[pages], k_scales[pages], kv_quant, dtype)
        v = dequantize(v_cache[pages], v_scales[pages], kv_quant, dtype)
    return k.reshape(-1, hkv, d)[:n], v.reshape(-1, hkv, d)[:n]


def paged_decode_reference(q, k_cache, v_cache, block_table, seq_lens, scale, *, k_scales=None, v_scales=None,
                           kv_quant=None, dtype=torch.float64) -> torch.Tensor:
    """Attention of one query token per sequence over its paged context, computed in ``dtype``.

    q [batch, q_heads, D]; caches [num_blocks, block_size, kv_heads, D] (uint8 codes + float32
    scales [num_blocks, block_size, kv_heads] when kv_quant is "fp8"/"int8"); block_table
    [batch, max_blocks]; seq_lens [batch]. A sequence of length 0 gives zeros. Returns [batch, q_heads, D].
    """
    batch, hq, d = q.shape
    group = hq // k_cache.shape[2]
    out = torch.zeros(batch, hq, d, dtype=dtype, device=q.device)
    for b in range(batch):
        n = int(seq_lens[b])
        if n == 0:
            continue
        k, v = gather_sequence_kv(k_cache, v_cache, block_table[b], n, k_scales=k_scales, v_scales=v_scales,
                                  kv_quant=kv_quant, dtype=dtype)
        k = k.repeat_interleave(group, dim=1)  # [n, hq, d]
        v = v.repeat_interleave(group, dim=1)
        s = torch.einsum("hd,nhd->hn", q[b].to(dtype), k) * scale
        p = torch.softmax(s, dim=-1)
        out[b] = torch.einsum("hn,nhd->hd", p, v)
    return out

