"""Paged causal attention for prefill chunks and mixed batches (query tiles of tokens x GQA heads)."""
from .prefill_attention import MAX_GROUP, prefill_attention

__all__ = ["MAX_GROUP", "prefill_attention"]
