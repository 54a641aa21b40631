"""Per-(token, head) fp8 / int8 KV cache: page layout helpers, the cache-write kernel, torch references.

Layout contract: docs/kv-cache-layout.md. Public names:

* ``layout.split_kv_cache`` and the page-size helpers;
* ``cache_write.reshape_and_cache_per_token_head`` (Triton launcher);
* ``reference`` (torch, for tests and benchmarks).
"""
from .cache_write import reshape_and_cache_per_token_head
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
