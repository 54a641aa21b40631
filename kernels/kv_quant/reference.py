"""Torch references for the per-(token, head) quantized KV cache. Written for clarity, not speed.

Quantization rule (bit-exact with cache_write.py):

* ``absmax`` = max |x| over head_dim, in float32;
* ``scale = absmax / QMAX`` (float32, correctly rounded; QMAX = 448 for fp8 e4m3, 127 for int8);
  a scale below the smallest normal float32 (2^-126) is stored as 0 and the head's codes as 0,
  so scales are always 0 or normal numbers (no target-dependent denormal flushing in readers);
* ``y = x / scale`` (float32, correctly rounded);
* fp8: saturate to +-448, round to nearest even e4m3 (OCP ``float8_e4m3fn``);
  int8: round half to even, clamp to [-127, 127], stored as two's complement in a uint8.

Also here: vLLM 0.18.1's per-tensor fp8 (``x / scale`` cast to e4m3 with saturation, scale 1.0 unless
calibrated) for comparison, and attention over a (dequantized) paged cache in float64.
"""
import math

import torch

from .layout import QMAX, kv_cache_shape, split_kv_cache

MIN_NORMAL_F32 = 2.0**-126


def quantize_per_token_head(x: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., D]`` (any float dtype) -> ``(codes [..., D] uint8, scales [...] float32)``."""
    qmax = QMAX[kind]
    xf = x.float()
    absmax = xf.abs().amax(dim=-1)
    # a tensor divisor: torch on CUDA turns division by a Python scalar into a multiply by its reciprocal,
    # which is not correctly rounded and would differ from the kernel's div_rn in the last bit
    scale = absmax / torch.full_like(absmax, qmax)
    scale = torch.where(scale < MIN_NORMAL_F32, torch.zeros_like(scale), scale)
    nonzero = scale > 0
    y = xf / torch.where(nonzero, scale, torch.ones_like(scale)).unsqueeze(-1)
    if kind == "fp8":
        codes = y.clamp(-qmax, qmax).to(torch.float8_e4m3fn).view(torch.uint8)
    elif kind == "int8":
        codes = torch.round(y).clamp(-qmax, qmax).to(torch.int8).view(torch.uint8)
    else:
        raise ValueError(f"kind must be 'fp8' or 'int8', got {kind!r}")
    codes = torch.where(nonzero.unsqueeze(-1), codes, torch.zeros_like(codes))
    return codes, scale


def quantized_paged_cache(k: torch.Tensor, v: torch.Tensor, kind: str) -> tuple:
    """K and V ``[num_blocks, block_size, H, D]`` quantized per (token, head) into one cache laid out as vLLM's
    (``layout.kv_cache_shape``, on their device); returns its views ``(k_codes, v_codes, k_scales, v_scales)``."""
    num_blocks, block_size, heads, head_dim = k.shape
    cache = torch.zeros(kv_cache_shape(num_blocks, block_size, heads, head_dim), dtype=torch.uint8, device=k.device)
    views = split_kv_cache(cache, head_dim, kind)
    for x, codes, scales in ((k, views[0], views[2]), (v, views[1], views[3])):
        c, sc = quantize_per_token_head(x, kind)
        codes.copy_(c)
        scales.copy_(sc)
    return views


def decode_codes(codes: torch.Tensor, kind: str) -> torch.Tensor:
    """uint8 codes -> their float32 values (before scaling)."""
    if kind == "fp8":
        return codes.view(torch.float8_e4m3fn).float()
    if kind == "int8":
        return codes.view(torch.int8).float()
    raise ValueError(f"kind must be 'fp8' or 'int8', got {kind!r}")


def dequantize_per_token_head(codes: torch.Tensor, scales: torch.Tensor, kind: str) -> torch.Tensor:
    """``(codes [..., D], scales [...])`` -> float32 ``[..., D]``."""
    return decode_codes(codes, kind) * scales.float().unsqueeze(-1)


def quantize_per_tensor_fp8(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """vLLM 0.18.1's fp8 KV cache: ``x / scale`` saturated to +-448 and cast to e4m3 (uint8 codes)."""
    return (x.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)


def dequantize_per_tensor_fp8(codes: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    return codes.view(torch.float8_e4m3fn).float() * scale


KV_MODES = ("bf16", "fp8_per_tensor", "fp8_pth", "int8_pth")


def fake_quantize(x: torch.Tensor, mode: str) -> torch.Tensor:
    """What a reader of the cache sees for ``x [..., D]`` stored in ``mode`` (float32)."""
    if mode == "bf16":
        return x.to(torch.bfloat16).float()
    if mode == "fp8_per_tensor":
        return dequantize_per_tensor_fp8(quantize_per_tensor_fp8(x))
    if mode in ("fp8_pth", "int8_pth"):
        kind = mode.split("_")[0]
        return dequantize_per_token_head(*quantize_per_token_head(x, kind), kind)
    raise ValueError(f"mode must be one of {KV_MODES}, got {mode!r}")


def reshape_and_cache_reference(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kind: str,
) -> None:
    """Torch version of ``cache_write.reshape_and_cache_per_token_head`` on a whole uint8 cache."""
    head_size = key.shape[-1]
    k_codes, v_codes, k_scales, v_scales = split_kv_cache(kv_cache, head_size, kind)
    block_size = k_codes.shape[1]
    slots = slot_mapping.long()
    valid = slots >= 0
    tok = torch.nonzero(valid).flatten()
    blk, off = slots[tok] // block_size, slots[tok] % block_size
    for src, codes, scales in ((key, k_codes, k_scales), (value, v_codes, v_scales)):
        c, s = quantize_per_token_head(src[tok], kind)
        codes[blk, off] = c
        scales[blk, off] = s


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float | None = None,
    causal: bool = True,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """One sequence, computed in ``dtype`` (float64 unless asked otherwise).

    ``q [Tq, Hq, D]``, ``k, v [Tk, Hkv, D]``; query i sits at position Tk - Tq + i.
    """
    tq, hq, d = q.shape
    tk, hkv, _ = k.shape
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)
    group = hq // hkv
    qd = q.to(dtype).reshape(tq, hkv, group, d)
    s = torch.einsum("qhgd,khd->hgqk", qd, k.to(dtype)) * softmax_scale
    if causal:
        pos_q = torch.arange(tk - tq, tk, device=s.device).view(tq, 1)
        s = s.masked_fill(torch.arange(tk, device=s.device).view(1, tk) > pos_q, float("-inf"))
    p = torch.softmax(s, dim=-1)
    o = torch.einsum("hgqk,khd->qhgd", p, v.to(dtype))
    return o.reshape(tq, hq, d)


def gather_sequence(cache_view: torch.Tensor, block_table_row: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Tokens ``[0, seq_len)`` of one sequence from a ``[num_blocks, block_size, ...]`` view."""
    block_size = cache_view.shape[1]
    pos = torch.arange(seq_len, device=block_table_row.device)
    return cache_view[block_table_row[pos // block_size].long(), pos % block_size]


def paged_attention_reference(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    kind: str,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    softmax_scale: float,
) -> torch.Tensor:
    """Causal attention for a mixed batch over a per-token-head quantized paged cache (float64 out).

    ``query [num_tokens, Hq, D]``; sequence i owns query rows ``query_start_loc[i]:query_start_loc[i+1]``
    and attends to its first ``seq_lens[i]`` cached tokens (its queries are the last ones).
    """
    head_size = query.shape[-1]
    k_codes, v_codes, k_scales, v_scales = split_kv_cache(kv_cache, head_size, kind)
    out = torch.zeros(query.shape, dtype=torch.float64, device=query.device)
    for i in range(seq_lens.shape[0]):
        q0, q1, n = int(query_start_loc[i]), int(query_start_loc[i + 1]), int(seq_lens[i])
        if q1 == q0:
            continue
        row = block_table[i]
        k = dequantize_per_token_head(gather_sequence(k_codes, row, n), gather_sequence(k_scales, row, n), kind)
        v = dequantize_per_token_head(gather_sequence(v_codes, row, n), gather_sequence(v_scales, row, n), kind)
        out[q0:q1] = attention_reference(query[q0:q1], k, v, softmax_scale)
    return out


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """``||got - want|| / ||want||`` in float64."""
    got, want = got.double(), want.double().to(got.device)
    return ((got - want).norm() / want.norm()).item()
