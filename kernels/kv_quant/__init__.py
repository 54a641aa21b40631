"""Per-(token, head) fp8 / int8 KV cache: page layout helpers, the cache-write kernel, torch references.

Layout contract: docs/kv-cache-layout.md. Public names:

* ``layout.KV_QUANT_DTYPES`` (the cache dtype names, the one list every patch and module reads),
  ``layout.split_kv_cache`` and the page-size helpers;
* ``reshape_and_cache_per_token_head``: the engine's cache write (``cache_write.reshape_and_cache_routed``: the
  Triton launcher ``cache_write.reshape_and_cache_per_token_head``, or its torch fallback where the device decided
  so at start, kernels/tuning);
* ``reference`` (torch, for tests and benchmarks).

The Triton launcher is imported on first use: vLLM's config and dtype tables import ``layout`` at import time
(patch 0002), and that must not load Triton kernels.
"""
from .layout import (
    KV_QUANT_DTYPES,
    SCALE_BYTES,
    kv_bytes_per_token,
    kv_page_size_bytes,
    kv_quant_kind,
    split_kv_cache,
)

__all__ = [
    "KV_QUANT_DTYPES",
    "SCALE_BYTES",
    "kv_bytes_per_token",
    "kv_page_size_bytes",
    "kv_quant_kind",
    "reshape_and_cache_per_token_head",
    "split_kv_cache",
]


def __getattr__(name: str):
    if name == "reshape_and_cache_per_token_head":
        from .cache_write import reshape_and_cache_routed

        globals()[name] = reshape_and_cache_routed
        return reshape_and_cache_routed
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
