"""Decode GEMV (1..8 rows): ``gemv`` (optionally fused with SiLU-and-mul), ``silu_and_mul``, and the
dispatch that picks it or the platform GEMM per shape from timings on the device.

``dispatch`` and ``launch_params`` import no Triton, so they (and this package) import on a platform
without it; the launchers are exported where Triton is installed.
"""
import importlib.util

if importlib.util.find_spec("triton") is not None:
    from .gemv import gemv
    from .silu_mul import silu_and_mul

__all__ = ["gemv", "silu_and_mul"]
