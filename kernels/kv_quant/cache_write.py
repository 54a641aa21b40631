"""KV cache write with per-(token, head) dynamic scales (fp8 e4m3 or int8), Triton.

One program quantizes ``BLOCK_H`` kv heads of one token, for K and V: absmax over head_dim in
float32, ``scale = absmax / QMAX``, codes ``= round(x / scale)``; the rule (and its torch twin) is
in reference.py, the page layout in layout.py / docs/kv-cache-layout.md. Tokens whose slot is
negative (padding) are skipped. ``reshape_and_cache_per_token_head`` is the only public name.
"""
import torch
import triton
import triton.language as tl

from ..fp8_e4m3 import f32_to_e4m3_bits, use_software_fp8
from .layout import QMAX

# launch parameters per target; the kernel is memory bound, small programs keep many in flight
_LAUNCH = {
    "cuda": dict(elems_per_program=1024, num_warps=4),
    "hip": dict(elems_per_program=1024, num_warps=4),
    "cpu": dict(elems_per_program=1024, num_warps=1),
}


@triton.jit
def _quantize_heads(x, mask, QUANT_INT8: tl.constexpr, SOFTWARE: tl.constexpr, QMAX_: tl.constexpr):
    """x [BLOCK_H, BLOCK_D] float32 -> (codes uint8 [BLOCK_H, BLOCK_D], scales float32 [BLOCK_H])."""
    absmax = tl.max(tl.where(mask, tl.abs(x), 0.0), axis=1)
    scale = tl.math.div_rn(absmax, tl.full(absmax.shape, QMAX_, tl.float32))
    # scales are 0 or normal float32: a head whose scale would be subnormal is stored as zeros
    scale = tl.where(scale < 1.1754943508222875e-38, 0.0, scale)
    nonzero = scale > 0.0
    safe = tl.where(nonzero, scale, 1.0)
    y = tl.math.div_rn(x, safe[:, None])
    if QUANT_INT8:
        # round half to even: adding 1.5 * 2^23 leaves no fraction bits in float32 (|y| <= ~127)
        r = (y + 12582912.0) - 12582912.0
        r = tl.minimum(tl.maximum(r, -127.0), 127.0)
        codes = r.to(tl.int32).to(tl.int8).to(tl.uint8, bitcast=True)
    else:
        codes = f32_to_e4m3_bits(y, SOFTWARE)
    codes = tl.where(nonzero[:, None], codes, 0).to(tl.uint8)
    return codes, scale


@triton.jit
def _reshape_and_cache_pth_kernel(
    key_ptr,
    value_ptr,
    k_codes_ptr,
    v_codes_ptr,
    k_scales_ptr,
    v_scales_ptr,
    slot_mapping_ptr,
    stride_key_tok,
    stride_key_head,
    stride_value_tok,
    stride_value_head,
    stride_codes_blk,
    stride_codes_tok,
    stride_codes_head,
    stride_vcodes_blk,
    stride_vcodes_tok,
    stride_vcodes_head,
    stride_vcodes_dim,
    stride_scales_blk,
    stride_scales_tok,
    stride_scales_head,
    num_heads,
    head_size,
    block_size,
    QUANT_INT8: tl.constexpr,
    SOFTWARE: tl.constexpr,
    QMAX_: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    tok = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    if slot < 0:
        return
    blk = slot // block_size
    off = slot % block_size

    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    mask = (heads < num_heads)[:, None] & (dims < head_size)[None, :]
    tok64 = tok.to(tl.int64)

    codes_off = blk * stride_codes_blk + off * stride_codes_tok + heads[:, None] * stride_codes_head + dims[None, :]
    scales_off = blk * stride_scales_blk + off * stride_scales_tok + heads * stride_scales_head
    head_mask = heads < num_heads

    k = tl.load(key_ptr + tok64 * stride_key_tok + heads[:, None] * stride_key_head + dims[None, :], mask=mask)
    k_codes, k_scale = _quantize_heads(k.to(tl.float32), mask, QUANT_INT8, SOFTWARE, QMAX_)
    tl.store(k_codes_ptr + codes_off, k_codes, mask=mask)
    tl.store(k_scales_ptr + scales_off, k_scale, mask=head_mask)

    v = tl.load(value_ptr + tok64 * stride_value_tok + heads[:, None] * stride_value_head + dims[None, :], mask=mask)
    v_codes, v_scale = _quantize_heads(v.to(tl.float32), mask, QUANT_INT8, SOFTWARE, QMAX_)
    # V's codes through all four strides: int8 caches hold them by dim (layout.V_BY_DIM), so this token's bytes go
    # block_size apart (one byte per store; a decode step writes one token per sequence, a prefill chunk's tokens
    # fill the same lines, which merge in L2)
    v_codes_off = (blk * stride_vcodes_blk + off * stride_vcodes_tok + heads[:, None] * stride_vcodes_head
                   + dims[None, :] * stride_vcodes_dim)
    tl.store(v_codes_ptr + v_codes_off, v_codes, mask=mask)
    tl.store(v_scales_ptr + scales_off, v_scale, mask=head_mask)


def _target(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    return "hip" if torch.version.hip else "cuda"


def reshape_and_cache_per_token_head(
    key: torch.Tensor,
    value: torch.Tensor,
    k_codes: torch.Tensor,
    v_codes: torch.Tensor,
    k_scales: torch.Tensor,
    v_scales: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_quant: str,
    software_fp8: bool | None = None,
) -> None:
    """Quantize ``key``/``value`` ``[num_tokens, H, D]`` and write them into the cache views.

    ``k_codes``/``v_codes`` ``[num_blocks, block_size, H, D]`` uint8 and ``k_scales``/``v_scales``
    ``[num_blocks, block_size, H]`` float32 are the views from ``layout.split_kv_cache`` (K by token, head_dim
    contiguous; V by token or, for int8 caches, by dim: it is written through its own strides).
    Token i goes to slot ``slot_mapping[i]`` (block ``slot // block_size``, row ``slot % block_size``);
    negative slots are skipped. Only the first ``slot_mapping.shape[0]`` rows of key/value are read.
    ``kv_quant`` is ``"fp8"`` or ``"int8"``; ``software_fp8=None`` picks the fp8 decode path for the
    device (``fp8_e4m3.use_software_fp8``); both paths write identical codes.
    """
    if kv_quant not in QMAX:
        raise ValueError(f"kv_quant must be 'fp8' or 'int8', got {kv_quant!r}")
    if key.dim() != 3 or value.shape != key.shape:
        raise ValueError(f"key/value must both be [num_tokens, H, D], got {tuple(key.shape)} / {tuple(value.shape)}")
    if key.stride(-1) != 1 or value.stride(-1) != 1:
        raise ValueError("key/value must be contiguous along head_dim")
    num_tokens = slot_mapping.shape[0]
    _, num_heads, head_size = key.shape
    if key.shape[0] < num_tokens:
        raise ValueError(f"slot_mapping has {num_tokens} entries but key has only {key.shape[0]} tokens")
    if k_codes.dtype != torch.uint8 or v_codes.dtype != torch.uint8:
        raise TypeError("k_codes/v_codes must be uint8")
    if k_scales.dtype != torch.float32 or v_scales.dtype != torch.float32:
        raise TypeError("k_scales/v_scales must be float32")
    if k_codes.shape[2:] != (num_heads, head_size) or v_codes.shape != k_codes.shape:
        raise ValueError(f"cache codes {tuple(k_codes.shape)} do not match key heads/head_size {num_heads}/{head_size}")
    if k_scales.stride() != v_scales.stride():
        raise ValueError("K and V scale views must share strides (take them from split_kv_cache)")
    if k_codes.stride(-1) != 1:
        raise ValueError("cache codes must be contiguous along head_dim")
    if num_tokens == 0:
        return
    if software_fp8 is None:
        software_fp8 = use_software_fp8()

    launch = _LAUNCH[_target(key.device)]
    block_d = triton.next_power_of_2(head_size)
    block_h = min(triton.next_power_of_2(num_heads), max(1, launch["elems_per_program"] // block_d))
    grid = (num_tokens, triton.cdiv(num_heads, block_h))
    _reshape_and_cache_pth_kernel[grid](
        key,
        value,
        k_codes,
        v_codes,
        k_scales,
        v_scales,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_codes.stride(0),
        k_codes.stride(1),
        k_codes.stride(2),
        *v_codes.stride(),
        k_scales.stride(0),
        k_scales.stride(1),
        k_scales.stride(2),
        num_heads,
        head_size,
        k_codes.shape[1],
        QUANT_INT8=kv_quant == "int8",
        SOFTWARE=bool(software_fp8),
        QMAX_=QMAX[kv_quant],
        BLOCK_H=block_h,
        BLOCK_D=block_d,
        num_warps=launch["num_warps"],
    )
