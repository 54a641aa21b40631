# Stand-in for vllm/vllm_flash_attn/__init__.py on a runtime without vLLM's compiled flash-attention
# extensions (_vllm_fa2_C/_vllm_fa3_C). The upstream __init__ raises ImportError when they are missing, but
# vllm/v1/attention/backends/fa_utils.py imports it unconditionally on CUDA, and many modules import
# fa_utils. This module imports cleanly, reports every FlashAttention version as unsupported, and its two
# entry points raise, naming themselves, if anything calls them. The package's pure-Python submodules
# (layers/, ops/triton/, flash_attn_interface.py) stay as the wheel ships them.

FA2_AVAILABLE = False
FA3_AVAILABLE = False
_REASON = "the compiled flash-attention extension is not in this runtime (ci/gpu/standins)"


class CompiledOpUnavailable(NotImplementedError):
    """A compiled flash-attention entry point was called on a runtime that only has stand-ins."""


def _unavailable(name):
    def call(*args, **kwargs):
        raise CompiledOpUnavailable(f"vllm.vllm_flash_attn.{name} was called, but {_REASON}; "
                                    f"use attention_backend=TRITON_ATTN")

    call.__name__ = name
    return call


flash_attn_varlen_func = _unavailable("flash_attn_varlen_func")
get_scheduler_metadata = _unavailable("get_scheduler_metadata")


def is_fa_version_supported(fa_version, device=None) -> bool:
    return False


def fa_version_unsupported_reason(fa_version, device=None) -> str:
    return _REASON


__all__ = [
    "fa_version_unsupported_reason",
    "flash_attn_varlen_func",
    "get_scheduler_metadata",
    "is_fa_version_supported",
]
