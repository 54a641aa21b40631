"""Split-KV decode attention (flash-decoding) over paged bf16/fp16 or per-token-head 8-bit caches."""
from .decode_attention import decode_attention, workspace_numel

__all__ = ["decode_attention", "workspace_numel"]
