"""Page layout of the per-(token, head) quantized KV cache (docs/kv-cache-layout.md).

One attention layer's cache is a uint8 tensor of shape ``(num_blocks, 2, block_size, H, D + 4)``.
For each block and each of K (0) / V (1) the ``block_size * H * (D + 4)`` bytes hold two regions:

    [ codes: block_size x H x D  uint8 ][ scales: block_size x H  float32 ]

except that an int8 cache holds V's codes by dim, ``H x D x block_size`` (tokens contiguous; ``V_BY_DIM``), so the
decode kernel's P x V product reads them as int8 matrix operands with the reduction axis contiguous.
``split_kv_cache`` turns that tensor into four strided views; nothing else here touches memory.
"""
import torch

# bytes of one (token, head) scale (float32)
SCALE_BYTES = 4

# cache dtype name -> quantization kind used by the kernels. The one list of these names: patch 0002's
# CacheDType, dtype table, TRITON_ATTN's supported dtypes and every check in vLLM read it (importing this module
# loads torch only).
KV_QUANT_DTYPES = {
    "fp8_per_token_head": "fp8",
    "int8_per_token_head": "int8",
}

# largest code magnitude of each kind: e4m3 (OCP) max finite value, symmetric int8
QMAX = {"fp8": 448.0, "int8": 127.0}

# kinds whose pages hold V's codes by dim (H x D x block_size, tokens contiguous) instead of by token: int8 codes go
# to int8 x int8 matrix products as they are (decode's P x V, P' as an int8 pair), which want the reduction axis
# (tokens) contiguous. fp8 codes must become fp16 first, which Triton does fastest from rows of dims (H200: an fp8
# V by dim took 1.3-2.0x its by-token time in the decode kernel; docs/kv-cache-layout.md has the int8 numbers)
V_BY_DIM = frozenset({"int8"})

# kinds whose pages should hold a multiple of this many tokens (patch 0002's hybrid attention/GDN block size rounds to
# the larger of it and the backend's 16): an int8 page holds each dim's V codes as a row of block_size bytes, and a
# multiple of 128 tokens starts every row on a 128-byte line. Qwen3.5-27B: 1664-token int8 pages instead of 1552,
# whose rows start 16 x dim bytes off a line; H200 decode kernel, int8 at 1664 against 1552 tokens per page in one
# call: 0.95x the time (the Triton kernel, the DCU's: 0.90x), 0.54-0.55x bf16 at batch 64 and 16-32K against 0.58-0.60x
# (bench/results/2026-12-04-h200-session24.md). The cost: GDN state pages padded to the attention page (7.9% over the
# 3,207,168 B a state needs, against 0.7% at 1552)
PAGE_ALIGN_TOKENS = {"int8": 128}
# Qwen3.5-27B's attention pages per cache kind as patch 0002's hybrid sizing gives them (bf16 "auto", fp8 and int8
# per-token-head; tests/test_kv_cache_dtype_config.py pins them against the engine): the kernel benches page with these
QWEN35_27B_PAGE_TOKENS = {"bf16": 784, "fp8": 1552, "int8": 1664}


def kv_quant_kind(cache_dtype_str: str) -> str | None:
    """``"fp8"`` / ``"int8"`` for the per-token-head dtypes, ``None`` for anything else."""
    return KV_QUANT_DTYPES.get(cache_dtype_str)


def kv_page_alignment_tokens(cache_dtype_str: str) -> int:
    """Tokens a page of this cache dtype should hold a multiple of (PAGE_ALIGN_TOKENS; 1 where it has no wish)."""
    return PAGE_ALIGN_TOKENS.get(kv_quant_kind(cache_dtype_str), 1)


def kv_bytes_per_token(num_kv_heads: int, head_size: int) -> int:
    """Bytes one token takes in one layer, K and V, codes and scales."""
    return 2 * num_kv_heads * (head_size + SCALE_BYTES)


def kv_page_size_bytes(block_size: int, num_kv_heads: int, head_size: int) -> int:
    """Bytes of one page (block) of one layer."""
    return block_size * kv_bytes_per_token(num_kv_heads, head_size)


def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
    """The uint8 cache shape the backend reports for these dtypes."""
    return (num_blocks, 2, block_size, num_kv_heads, head_size + SCALE_BYTES)


def split_kv_cache(
    kv_cache: torch.Tensor, head_size: int, kv_quant: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split a ``(num_blocks, 2, block_size, H, D + 4)`` uint8 cache of kind ``kv_quant`` ("fp8" / "int8") into its
    code and scale views.

    Returns ``(k_codes, v_codes, k_scales, v_scales)``: codes ``[num_blocks, block_size, H, D]`` uint8,
    scales ``[num_blocks, block_size, H]`` float32. The views alias ``kv_cache``; writes through
    them land in the cache. Only each (block, K/V) region has to be contiguous, so the strides of
    the first two dimensions are free (vLLM's hybrid layout re-strides them). The kind is required because it
    decides V's layout (``V_BY_DIM``): an int8 cache's ``v_codes`` has strides (block, 1, D x block_size,
    block_size), tokens contiguous; everything else is by token, head_dim contiguous.
    """
    if kv_quant not in QMAX:
        raise ValueError(f"kv_quant must be one of {sorted(QMAX)}, got {kv_quant!r}")
    if kv_cache.dtype != torch.uint8:
        raise TypeError(f"per-token-head KV cache must be uint8, got {kv_cache.dtype}")
    if head_size % SCALE_BYTES != 0:
        raise ValueError(f"head_size must be a multiple of {SCALE_BYTES}, got {head_size}")
    row = head_size + SCALE_BYTES
    if kv_cache.dim() != 5 or kv_cache.shape[1] != 2 or kv_cache.shape[4] != row:
        raise ValueError(
            f"expected a cache of shape (num_blocks, 2, block_size, H, {row}), got {tuple(kv_cache.shape)}"
        )
    num_blocks, _, block_size, num_heads, _ = kv_cache.shape
    s_block, s_kv, s_tok, s_head, s_byte = kv_cache.stride()
    if (s_byte, s_head, s_tok) != (1, row, num_heads * row) and num_blocks * block_size * num_heads > 0:
        raise ValueError(
            "each (block, K/V) region of the cache must be contiguous; got strides " f"{tuple(kv_cache.stride())}"
        )
    if s_block % SCALE_BYTES or s_kv % SCALE_BYTES or kv_cache.storage_offset() % SCALE_BYTES:
        raise ValueError("cache strides and offset must be multiples of 4 bytes (float32 scales)")

    code_size = (num_blocks, block_size, num_heads, head_size)
    code_stride = (s_block, num_heads * head_size, head_size, 1)
    base = kv_cache.storage_offset()
    k_codes = kv_cache.as_strided(code_size, code_stride, base)
    v_stride = (s_block, 1, head_size * block_size, block_size) if kv_quant in V_BY_DIM else code_stride
    v_codes = kv_cache.as_strided(code_size, v_stride, base + s_kv)

    # float32 alias of the same storage; offsets and strides below are in float32 elements
    as_f32 = kv_cache.view(torch.float32)
    scale_size = (num_blocks, block_size, num_heads)
    scale_stride = (s_block // SCALE_BYTES, num_heads, 1)
    scales_at = (base + block_size * num_heads * head_size) // SCALE_BYTES
    k_scales = as_f32.as_strided(scale_size, scale_stride, scales_at)
    v_scales = as_f32.as_strided(scale_size, scale_stride, scales_at + s_kv // SCALE_BYTES)
    return k_codes, v_codes, k_scales, v_scales
