"""Torch reference for the decode GEMV, in float64, written for clarity, not speed."""
import torch


def gemv_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                   silu_mul: bool = False) -> torch.Tensor:
    """``x @ weight.T + bias`` in float64 (``silu_mul``: then silu(first half) * second half, vLLM's
    SiluAndMul). x [..., K], weight [N, K], bias [N] or None; returns float64 [..., N] or [..., N / 2]."""
    y = x.double() @ weight.double().T
    if bias is not None:
        y = y + bias.double()
    if silu_mul:
        d = y.shape[-1] // 2
        g, u = y[..., :d], y[..., d:]
        y = g * torch.sigmoid(g) * u
    return y
