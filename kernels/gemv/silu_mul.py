"""SiLU-and-mul over a GEMM's output: ``out = silu(y[..., :d]) * y[..., d:]`` (vLLM's SiluAndMul).

The other side of the fused gate_up GEMV: when the platform GEMM is faster (and for batches over 8
rows) the dispatch runs the GEMM, then this kernel, computed in fp32 and rounded once.
"""
import torch
import triton
import triton.language as tl

_BLOCK = 1024


@triton.jit
def _silu_mul_kernel(y_ptr, out_ptr, D, stride_ym, stride_om, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < D
    g = tl.load(y_ptr + row * stride_ym + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(y_ptr + row * stride_ym + D + offs, mask=mask, other=0.0).to(tl.float32)
    out = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * stride_om + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(y: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """y: [..., 2 * d] float16/bfloat16/float32, unit stride along the last dim; returns [..., d] of y's dtype."""
    if y.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"silu_and_mul: y must be float16, bfloat16 or float32, got {y.dtype}")
    if y.dim() < 1 or y.shape[-1] % 2:
        raise ValueError(f"silu_and_mul: y must be [..., 2 * d], got {tuple(y.shape)}")
    d = y.shape[-1] // 2
    rows = y.numel() // y.shape[-1] if y.shape[-1] else 0
    y2 = y.reshape(rows, 2 * d)
    if y2.stride(-1) != 1:
        y2 = y2.contiguous()
    want = (*y.shape[:-1], d)
    if out is None:
        out = torch.empty(want, dtype=y.dtype, device=y.device)
    elif tuple(out.shape) != want or out.dtype != y.dtype or not out.is_contiguous():
        raise ValueError(f"silu_and_mul: out must be a contiguous {want} tensor of dtype {y.dtype}, "
                         f"got {tuple(out.shape)} {out.dtype}")
    if rows == 0 or d == 0:
        return out
    out2 = out.view(rows, d)
    _silu_mul_kernel[(rows, triton.cdiv(d, _BLOCK))](y2, out2, d, y2.stride(0), out2.stride(0), BLOCK=_BLOCK,
                                                     num_warps=4)
    return out
