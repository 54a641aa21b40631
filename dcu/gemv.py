"""vLLM side of the decode GEMV (patch 0007-dcu-decode-gemv).

The patch's hook in ``vllm/model_executor/layers/utils.py`` (``dispatch_unquantized_gemm``) returns
``decode_unquantized_gemm`` on CUDA and ROCm unless ``VLLM_DCU_GEMV=off``; the one in
``Qwen2MoeMLP.forward`` (Qwen3.5's dense MLP) asks ``gate_up_silu_mul`` for the gate_up GEMM fused
with SiLU-and-mul. Both run through registered custom ops (``torch.ops.vllm.dcu_decode_gemm`` and
``torch.ops.vllm.dcu_decode_gemm_silu_mul``, with fake implementations), so torch.compile sees one
opaque op and the per-call choice is a Python lookup inside it, made when the op runs (no graph
break, no recompilation by batch size):

* rows <= 8: the side kernels/gemv/dispatch.py measured faster for this (shape, row bucket) on this
  device: the Triton GEMV (vllm.dcu_kernels.gemv) or the platform GEMM (ROCm:
  ``rocm_unquantized_gemm_impl``, i.e. what upstream's ``rocm_unquantized_gemm`` op runs; else
  ``F.linear``);
* more rows, or inputs the GEMV was not compiled for (unaligned, strided): the platform GEMM.

A shape is measured (or read from the device's tuned file, kernels/tuning/tuned_file.py) the first time
the op sees it with any row count, which for a decoder is vLLM's profile run at startup (prefill-size
batches go through the same op); that is before any CUDA/HIP graph is captured. The first capture
freezes the table: a shape first seen later is not measured and runs on the platform GEMM (logged).
Every Triton specialization the decode path uses is compiled during that first sight.
"""
import os

import torch
import torch.nn.functional as F

from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.utils.torch_utils import direct_register_custom_op

from ._kernels import decisions, gemv_dispatch, tuned_file
from ._kernels import gemv_params as launch_params

logger = init_logger(__name__)

MODE = gemv_dispatch.read_mode()  # a bad VLLM_DCU_GEMV fails here, when vLLM imports its layers
SILU_MUL = gemv_dispatch.read_silu_mul()
ENABLED = MODE != "off"
MAX_ROWS = launch_params.MAX_ROWS
_DTYPES = (torch.float16, torch.bfloat16)
# device types the op routes to the GEMV (tests add "cpu" to run it in Triton's interpreter)
DEVICE_TYPES = ("cuda",)

_TABLES: dict = {}


def platform_linear(x, weight, bias=None):
    """What vLLM runs without this patch: on ROCm the body of upstream's rocm_unquantized_gemm op
    (skinny GEMMs, hipBLASLt, ...), elsewhere F.linear."""
    if current_platform.is_rocm():
        from vllm.model_executor.layers.utils import rocm_unquantized_gemm_impl

        return rocm_unquantized_gemm_impl(x, weight, bias)
    return F.linear(x, weight, bias)


def _platform(x, weight, bias, silu_mul):
    y = platform_linear(x, weight, bias)
    if silu_mul:
        from ._kernels import silu_and_mul

        y = silu_and_mul(y)
    return y


def table(device: torch.device) -> gemv_dispatch.DispatchTable:
    """The dispatch table of ``device`` (one per device index), kept in the device's tuned file (read through the
    engine's one loader, kernels/tuning/decisions.active_file); its lines join the decision table logged at start."""
    idx = (device.type, device.index)
    if idx not in _TABLES:
        identity = tuned_file.device_identity(device)
        _TABLES[idx] = gemv_dispatch.DispatchTable(
            MODE, identity, log=logger.info, warn=logger.warning, tuned=decisions.active_file,
            use_file=not os.environ.get(launch_params.ENV_VAR, "").strip())
        decisions.add_table("gemv", lambda: [line for tab in _TABLES.values() for line in tab.summary_lines()])
    return _TABLES[idx]


def _aligned(t) -> bool:
    return t.data_ptr() % 16 == 0


def _weight_ok(weight, bias) -> bool:
    """Weights the GEMV is compiled for: 2-D, contiguous, 16-byte aligned; the bias likewise."""
    if weight.device.type not in DEVICE_TYPES or weight.dim() != 2 or weight.dtype not in _DTYPES:
        return False
    if not weight.is_contiguous() or not _aligned(weight):
        return False
    return bias is None or (bias.dtype == weight.dtype and bias.is_contiguous() and _aligned(bias)
                            and tuple(bias.shape) == (weight.shape[0],))


def _choose(x, weight, bias, silu_mul) -> str:
    """'triton' or 'platform' for this call; measures the shape on first sight (outside graph capture)."""
    if not _weight_ok(weight, bias):
        return "platform"
    device = weight.device
    tab = table(device)
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if capturing:
        freeze()  # the engine's warm-up is over once it captures graphs: log the decision table
    key = gemv_dispatch.ShapeKey(weight.shape[0], weight.shape[1], str(weight.dtype).removeprefix("torch."),
                                 bias is not None, silu_mul)
    if key.id not in tab.entries:
        from ._kernels import gemv

        measure, warm, release = gemv_dispatch.device_measure(
            weight, bias, lambda x, w, b: gemv(x, w, b, silu_mul=silu_mul),
            lambda x, w, b: _platform(x, w, b, silu_mul), log=logger.warning)
        try:
            tab.ensure(key, measure, warm, capturing=capturing)
        except Exception as e:  # noqa: BLE001 - never fail a model over the GEMV: log and use the platform
            tab.fallback(key, f"measuring failed ({type(e).__name__}: {e})")
        finally:
            release()  # drop the weight copies
    rows = x.numel() // weight.shape[1] if weight.shape[1] else 0
    if not 1 <= rows <= MAX_ROWS or x.dtype != weight.dtype or x.device != device or not _aligned(x):
        return "platform"
    return tab.choice(key, rows)


def _run(x, weight, bias, silu_mul):
    if _choose(x, weight, bias, silu_mul) == "triton":
        from ._kernels import gemv

        x2 = x.reshape(-1, x.shape[-1])
        if x2.stride(0) != x2.shape[1] or x2.stride(1) != 1:
            x2 = x2.contiguous()
        y = gemv(x2, weight, bias, silu_mul=silu_mul)
        return y.view(*x.shape[:-1], y.shape[-1])
    return _platform(x, weight, bias, silu_mul)


def _decode_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return _run(x, weight, bias, False)


def _decode_gemm_fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _decode_gemm_silu_mul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return _run(x, weight, bias, True)


def _decode_gemm_silu_mul_fake(x: torch.Tensor, weight: torch.Tensor,
                               bias: torch.Tensor | None = None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0] // 2))


direct_register_custom_op(op_name="dcu_decode_gemm", op_func=_decode_gemm, fake_impl=_decode_gemm_fake)
direct_register_custom_op(op_name="dcu_decode_gemm_silu_mul", op_func=_decode_gemm_silu_mul,
                          fake_impl=_decode_gemm_silu_mul_fake)


def _static_ok(x, weight) -> bool:
    """What is known when torch.compile traces: dtypes and dimensions (rows are decided in the op)."""
    return x.dtype in _DTYPES and weight.dtype == x.dtype and weight.dim() == 2


def decode_unquantized_gemm(layer: torch.nn.Module, x: torch.Tensor, weight: torch.Tensor,
                            bias: torch.Tensor | None = None) -> torch.Tensor:
    """dispatch_unquantized_gemm()'s GEMM with the patch: the measured side for <= 8 rows, else the platform's."""
    if _static_ok(x, weight):
        return torch.ops.vllm.dcu_decode_gemm(x, weight, bias)
    if current_platform.is_rocm():
        return torch.ops.vllm.rocm_unquantized_gemm(x, weight, bias)
    return F.linear(x, weight, bias)


def gate_up_silu_mul(gate_up_proj: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """``SiluAndMul()(gate_up_proj(x)[0])`` through the fused op, or None where it does not apply
    (then the caller runs the two layers as upstream does): the layer must be an unquantized
    MergedColumnParallelLinear (not wrapped, e.g. by LoRA) without gathered output or a separate
    bias, the GEMV on (VLLM_DCU_GEMV auto or triton, VLLM_DCU_GEMV_SILU_MUL=1), not batch-invariant mode."""
    if MODE not in ("auto", "triton") or not SILU_MUL:
        return None
    if type(gate_up_proj).__name__ != "MergedColumnParallelLinear":
        return None
    method = getattr(gate_up_proj, "quant_method", None)
    if type(method).__name__ != "UnquantizedLinearMethod":
        return None
    if gate_up_proj.gather_output or gate_up_proj.skip_bias_add:
        return None
    from vllm.model_executor.layers.batch_invariant import vllm_is_batch_invariant

    if vllm_is_batch_invariant() or not current_platform.is_cuda_alike():
        return None
    weight = gate_up_proj.weight
    if not _static_ok(x, weight) or weight.shape[0] % 2:
        return None
    return torch.ops.vllm.dcu_decode_gemm_silu_mul(x, weight, gate_up_proj.bias)


def freeze():
    """Stop measuring on every device (a shape first seen afterwards runs on the platform GEMM)."""
    for tab in _TABLES.values():
        tab.freeze()
    decisions.log_table_once(logger.info)
