"""Work around two bugs of the Triton 3.6 CPU interpreter that kernel tests hit.

* With numpy >= 2.4 a loop bound computed from a loaded scalar fails with "only 0-dimensional
  arrays can be converted to Python scalars" (triton-lang/triton#9171, fixed upstream after 3.6).
* ``tl.dot`` on bfloat16 operands multiplies the raw uint16 bit patterns (the interpreter stores
  bf16 as uint16), so any bf16 dot returns garbage.

Import this module before launching kernels under TRITON_INTERPRET=1; it changes nothing else.
"""
import numpy as np
import triton.language as tl
import triton.runtime.interpreter as _interp

_orig_patch_tensor = _interp._patch_lang_tensor
_orig_create_dot = _interp.InterpreterBuilder.create_dot


def _patch_lang_tensor(tensor, scope):
    _orig_patch_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))


def _bf16_as_f32(handle):
    if handle.dtype == tl.bfloat16:
        return _interp.TensorHandle((handle.data.astype(np.uint32) << 16).view(np.float32), tl.float32)
    return handle


def _create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    return _orig_create_dot(self, _bf16_as_f32(a), _bf16_as_f32(b), d, input_precision, max_num_imprecise_acc)


if not getattr(_interp, "_vllm_dcu_compat", False):
    _interp._patch_lang_tensor = _patch_lang_tensor
    _interp.InterpreterBuilder.create_dot = _create_dot
    _interp._vllm_dcu_compat = True
