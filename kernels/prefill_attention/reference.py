"""Torch reference for paged causal prefill attention, written for clarity, not speed (float64 by default).
Quantized caches are dequantized as value = code * scale of its (token, head) (docs/kv-cache-layout.md)."""
import torch

from ..decode_attention.reference import gather_sequence_kv


def paged_prefill_reference(q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_table, scale, *, k_scales=None,
                            v_scales=None, kv_quant=None, dtype=torch.float64) -> torch.Tensor:
    """Causal attention of each sequence's query chunk over its paged keys, computed in ``dtype``.

    q [num_tokens, q_heads, D]: sequence s owns rows cu_seqlens_q[s]:cu_seqlens_q[s+1]; its chunk is the last
    ``q_len`` of its ``seq_lens[s]`` tokens, so query token i sees keys 0 .. seq_len - q_len + i. Caches
    [num_blocks, block_size, kv_heads, D] (uint8 codes + float32 scales with kv_quant). Rows past
    cu_seqlens_q[num_seqs] stay zero. Returns [num_tokens, q_heads, D] in ``dtype``.
    """
    num_tokens, hq, d = q.shape
    group = hq // k_cache.shape[2]
    out = torch.zeros(num_tokens, hq, d, dtype=dtype, device=q.device)
    for s in range(seq_lens.shape[0]):
        q0, q1 = int(cu_seqlens_q[s]), int(cu_seqlens_q[s + 1])
        n = int(seq_lens[s])
        q_len = q1 - q0
        if q_len == 0:
            continue
        k, v = gather_sequence_kv(k_cache, v_cache, block_table[s], n, k_scales=k_scales, v_scales=v_scales,
                                  kv_quant=kv_quant, dtype=dtype)
        k = k.repeat_interleave(group, dim=1)  # [n, hq, d]
        v = v.repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,nhd->htn", q[q0:q1].to(dtype), k) * scale
        q_pos = torch.arange(n - q_len, n, device=q.device)
        visible = torch.arange(n, device=q.device)[None, :] <= q_pos[:, None]  # [q_len, n]
        scores = scores.masked_fill(~visible[None], float("-inf"))
        out[q0:q1] = torch.einsum("htn,nhd->thd", torch.softmax(scores, dim=-1), v)
    return out
