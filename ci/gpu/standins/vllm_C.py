# Stand-in for vLLM's compiled extension modules (vllm._C and friends) on a runtime they were not
# built for (the H200 test box: torch 2.11 + CUDA 13; the wheel's .so files need torch 2.10 + CUDA 12.9).
#
# The GPU harness (ci/gpu/harness.py) installs this file as `vllm/_C.py` inside each unpacked variant tree,
# next to `_C_standin_ops.json`, the list of compiled op names that variant's Python refers to (made by
# ci/gpu/bundle.py from the wheel). Because it lives in the tree, every process vLLM spawns (API server,
# engine core, tensor-parallel workers) gets it through PYTHONPATH, exactly like the real extension.
#
# What it does, and nothing more:
# - declares every referenced op, so `register_fake("_C::x")`, `torch.ops._C.x.default` and `hasattr` at
#   import time behave as with the real library;
# - capability queries (`*_supports_*`, `*_supported`) answer False: the capability really is absent;
# - `weak_ref_tensor` makes a real non-owning alias (through DLPack), which CUDA-graph capture needs;
# - sets a default Triton scratch allocator (Hopper kernels with tensor descriptors, e.g. FLA's solve_tril,
#   need one; a full vLLM install gets it from FlashInfer's paths);
# - every other op raises CompiledOpUnavailable naming the op when called, and names that were never
#   declared raise AttributeError (so `hasattr` is False) with the same clear message.
import ctypes
import json
import os

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
_OPS_FILE = os.path.join(_HERE, "_C_standin_ops.json")

# Namespaces that the real vllm/_C*.so and vllm/_moe_C*.so register with torch.ops on CUDA.
NAMESPACES = ("_C", "_C_cache_ops", "_C_custom_ar", "_moe_C", "_C_cuda_utils")


class CompiledOpUnavailable(NotImplementedError):
    """A compiled vLLM op was called on a runtime that only has stand-ins for it."""


def _message(qualname: str) -> str:
    return (f"compiled op {qualname} was called, but this runtime has only stand-ins for vLLM's "
            f"compiled extensions (ci/gpu/standins); choose a Triton/torch-native path instead")


def _is_capability_query(name: str) -> bool:
    return "_supports_" in name or name.endswith("_supported")


# ---------------------------------------------------------------------------------------------------------
# weak_ref_tensor: a tensor aliasing the same memory without keeping its storage alive (what the C++ op does
# with torch::from_blob). Built as a DLPack capsule with no deleter over the storage's bytes.
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_KDL_CPU, _KDL_CUDA, _KDL_UINT = 1, 2, 1
# torch keeps a pointer to the struct and reads its deleter field when the alias dies, so the structs must
# live as long as the process (about 100 bytes each; vLLM calls this only while capturing CUDA graphs).
_keepalive: list = []


def weak_ref_tensor(tensor: torch.Tensor) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"_C::weak_ref_tensor expects a tensor, got {type(tensor).__name__}")
    storage = tensor.untyped_storage()
    nbytes = storage.nbytes()
    if tensor.device.type == "cuda":
        device = _DLDevice(_KDL_CUDA, tensor.device.index if tensor.device.index is not None
                           else torch.cuda.current_device())
    elif tensor.device.type == "cpu":
        device = _DLDevice(_KDL_CPU, 0)
    else:
        raise CompiledOpUnavailable(_message(f"_C::weak_ref_tensor on {tensor.device.type}"))
    shape = (ctypes.c_int64 * 1)(nbytes)
    strides = (ctypes.c_int64 * 1)(1)
    managed = _DLManagedTensor()
    managed.dl_tensor = _DLTensor(storage.data_ptr(), device, 1, _DLDataType(_KDL_UINT, 8, 1),
                                  shape, strides, 0)
    managed.manager_ctx = None
    managed.deleter = None
    _keepalive.append((managed, shape, strides))
    capsule = _PyCapsule_New(ctypes.addressof(managed), b"dltensor", None)
    raw = torch.utils.dlpack.from_dlpack(capsule)
    return raw.view(tensor.dtype).as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())


# ---------------------------------------------------------------------------------------------------------
def _load_ops() -> dict:
    try:
        with open(_OPS_FILE) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ImportError(f"stand-in vllm._C: {_OPS_FILE} is missing (the harness writes it when it "
                          f"unpacks a variant)") from None
    return data


_OPS = _load_ops()
_libs = []  # keep the torch.library fragments alive


def _declare(ns: str, names: list[str], overloads: list[str]) -> None:
    lib = torch.library.Library(ns, "FRAGMENT")
    _libs.append(lib)
    for name in names:
        lib.define(f"{name}(...) -> ()")
    for qual in overloads:  # "name.overload"
        lib.define(f"{qual}(...) -> ()")


class _StandInOp:
    """Calling it raises with the op's name; attributes (.default, .out) are the declared overloads."""

    def __init__(self, ns: str, name: str, packet):
        self._qualname = f"{ns}::{name}"
        self._packet = packet
        self.__name__ = name

    def __call__(self, *args, **kwargs):
        raise CompiledOpUnavailable(_message(self._qualname))

    def __getattr__(self, attr):
        return getattr(self._packet, attr)

    def __repr__(self):
        return f"<stand-in for compiled op {self._qualname}>"


def _always_false(*args, **kwargs) -> bool:
    return False


class _StandInNamespace:
    def __init__(self, ns: str, declared: set[str]):
        self._ns = ns
        self._declared = declared
        self._real = torch._ops._OpNamespace(ns)
        self._cache: dict = {}

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in self._cache:
            return self._cache[name]
        if name == "weak_ref_tensor" and self._ns == "_C":
            value = weak_ref_tensor
        elif _is_capability_query(name):
            value = _always_false
        elif name in self._declared:
            value = _StandInOp(self._ns, name, getattr(self._real, name))
        else:
            raise AttributeError(_message(f"{self._ns}::{name}"))
        self._cache[name] = value
        return value

    def __repr__(self):
        return f"<stand-in torch.ops.{self._ns}>"


for _ns in NAMESPACES:
    _entry = _OPS.get(_ns, {})
    _names = sorted(set(_entry.get("ops", [])))
    _declare(_ns, _names, sorted(set(_entry.get("overloads", []))))
    setattr(torch.ops, _ns, _StandInNamespace(_ns, set(_names)))


# ---------------------------------------------------------------------------------------------------------
def _install_triton_allocator() -> None:
    try:
        from contextvars import ContextVar

        import triton.runtime._allocation as alloc
    except Exception:  # no Triton: nothing needs a scratch allocator
        return

    def _scratch(size: int, alignment: int, stream):
        return torch.empty(size, device="cuda", dtype=torch.int8)

    current = alloc._allocator.get()
    if isinstance(current, alloc.NullAllocator):
        # A ContextVar's default is seen by every thread (set() would reach only this one).
        alloc._allocator = ContextVar("_allocator", default=_scratch)


_install_triton_allocator()
