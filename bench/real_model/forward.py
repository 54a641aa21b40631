"""A small torch Llama forward whose attention reads K/V back from a chosen KV cache format.

``Model(cfg, tensors)`` runs float32 activations on the given weights (the bench passes them rounded to bf16, as the
converted directory stores them). ``rope="half"`` is HF's rotary layout (pairs d/2 apart, the converted weights);
``rope="interleaved"`` is llama.cpp's (adjacent pairs): with it the GGUF's q/k rows work as stored, which is how the
converter's row permutation is checked against an independent forward.

KV formats (``KV_DTYPES``, named as vLLM's ``--kv-cache-dtype``): ``auto`` (bf16), ``int8_per_token_head``,
``fp8_per_token_head`` and ``fp8`` (0.18.1's per-tensor e4m3 with k_scale = v_scale = 1.0, what the contest flags give:
no calibrated scales in the checkpoint and ``calculate_kv_scales`` off). Every K (after RoPE) and V is rounded to bf16
(the engine's activation dtype), then stored in the format and read back by every later query, the new tokens' own
queries included (vLLM writes the cache before attending).

Two attention routes (``attn``):
* ``torch``: the cache as ``kernels.kv_quant.reference.fake_quantize`` writes and reads it, attention in float32;
* ``kernels``: the project's Triton kernels (``TRITON_INTERPRET=1`` on a CPU): the cache-write kernel
  ``kv_quant.cache_write.reshape_and_cache_per_token_head`` fills a paged uint8 cache laid out as vLLM's
  (``layout.split_kv_cache``), chunks of several tokens attend with ``prefill_attention``, single tokens with
  ``decode_attention``; queries and outputs in bf16 as in the engine. bf16 pages are written by indexing (vLLM's own
  write) and the per-tensor fp8 cache is e4m3 codes with every scale 1.0, which the same kernels read exactly as
  0.18.1 reads its cache.
``float32`` (torch route only) keeps K/V unrounded: the converter check compares with transformers' float32 forward.
"""
from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F

from kernels.kv_quant.reference import fake_quantize, quantize_per_tensor_fp8

KV_DTYPES = ("auto", "int8_per_token_head", "fp8_per_token_head", "fp8")
_FAKE_MODE = {"auto": "bf16", "int8_per_token_head": "int8_pth", "fp8_per_token_head": "fp8_pth",
              "fp8": "fp8_per_tensor", "float32": None}
_KIND = {"int8_per_token_head": "int8", "fp8_per_token_head": "fp8", "fp8": "fp8"}
BLOCK_SIZE = 16


def rope_tables(head_dim: int, theta: float, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    ang = positions.double()[:, None] * inv[None, :]  # [T, d/2]
    return ang.cos().float(), ang.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str) -> torch.Tensor:
    """x [T, H, d]; cos/sin [T, d/2]."""
    c, s = cos[:, None, :], sin[:, None, :]
    if style == "half":
        a, b = x.chunk(2, dim=-1)
        return torch.cat([a * c - b * s, a * s + b * c], dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)


class TorchCache:
    """One layer's cache as its readers see it: the stored values, dequantized (float32)."""

    def __init__(self, kv_dtype: str):
        self.mode = _FAKE_MODE[kv_dtype]
        self.k = self.v = None

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        if self.mode is not None:
            k, v = (fake_quantize(x.to(torch.bfloat16), self.mode) for x in (k, v))
        self.k = k if self.k is None else torch.cat([self.k, k])
        self.v = v if self.v is None else torch.cat([self.v, v])

    def attend(self, q: torch.Tensor, scale: float) -> torch.Tensor:
        """q [T, Hq, d], the last T of the cached tokens -> [T, Hq, d] (causal)."""
        t, hq, _ = q.shape
        n, hkv, _ = self.k.shape
        g = hq // hkv
        # 4-D with a batch of one: torch's fused CPU kernel (3-D takes the math path, ~6x slower at 4K)
        k = self.k.repeat_interleave(g, dim=1).transpose(0, 1)[None]
        v = self.v.repeat_interleave(g, dim=1).transpose(0, 1)[None]
        qh = q.transpose(0, 1)[None]
        if t == n or t == 1:  # a whole window (causal) or one decode step (sees every cached token)
            out = F.scaled_dot_product_attention(qh, k, v, is_causal=t > 1, scale=scale)
        else:
            mask = torch.arange(n)[None, :] <= torch.arange(n - t, n)[:, None]
            out = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, scale=scale)
        return out[0].transpose(0, 1)


class KernelCache:
    """One layer's paged cache written and read by the project's Triton kernels."""

    def __init__(self, kv_dtype: str, max_tokens: int, heads: int, head_dim: int):
        from kernels.kv_quant.layout import kv_cache_shape, split_kv_cache

        if os.environ.get("TRITON_INTERPRET") == "1":
            import tests.triton_interp_compat  # noqa: F401  (two Triton 3.6 interpreter bugs the kernels meet)
        self.kind = _KIND.get(kv_dtype)
        self.per_tensor = kv_dtype == "fp8"
        blocks = -(-max_tokens // BLOCK_SIZE)
        self.table = torch.arange(blocks, dtype=torch.int32)[None, :]
        if self.kind is None:
            self.k_pages = torch.zeros(blocks, BLOCK_SIZE, heads, head_dim, dtype=torch.bfloat16)
            self.v_pages = torch.zeros_like(self.k_pages)
            self.k_scales = self.v_scales = None
        else:
            self.raw = torch.zeros(kv_cache_shape(blocks, BLOCK_SIZE, heads, head_dim), dtype=torch.uint8)
            self.k_pages, self.v_pages, self.k_scales, self.v_scales = split_kv_cache(self.raw, head_dim, self.kind)
        self.n = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        k, v = k.to(torch.bfloat16).contiguous(), v.to(torch.bfloat16).contiguous()
        t = k.shape[0]
        slots = torch.arange(self.n, self.n + t)
        blk, off = slots // BLOCK_SIZE, slots % BLOCK_SIZE
        if self.kind is None:
            self.k_pages[blk, off], self.v_pages[blk, off] = k, v
        elif self.per_tensor:  # 0.18.1's fp8: x / 1.0 cast to e4m3; our readers take code x scale, so scale = 1.0
            self.k_pages[blk, off] = quantize_per_tensor_fp8(k)
            self.v_pages[blk, off] = quantize_per_tensor_fp8(v)
            self.k_scales[blk, off] = 1.0
            self.v_scales[blk, off] = 1.0
        else:
            from kernels.kv_quant.cache_write import reshape_and_cache_per_token_head

            reshape_and_cache_per_token_head(k, v, self.k_pages, self.v_pages, self.k_scales, self.v_scales,
                                             slots.to(torch.int64), self.kind)
        self.n += t

    def attend(self, q: torch.Tensor, scale: float) -> torch.Tensor:
        qb = q.to(torch.bfloat16).contiguous()
        out = torch.empty_like(qb)
        seq_lens = torch.tensor([self.n], dtype=torch.int32)
        quant = dict(k_scales=self.k_scales, v_scales=self.v_scales, kv_quant=self.kind)
        if q.shape[0] == 1:
            from kernels.decode_attention.decode_attention import decode_attention

            decode_attention(qb, self.k_pages, self.v_pages, self.table, seq_lens, scale, out, **quant)
        else:
            from kernels.prefill_attention.prefill_attention import prefill_attention

            cu = torch.tensor([0, q.shape[0]], dtype=torch.int32)
            prefill_attention(qb, self.k_pages, self.v_pages, out, cu, seq_lens, self.table, scale,
                              max_seqlen_k=self.n, **quant)
        return out.float()


class Model:
    """Llama forward on a dict of HF-named float32 tensors."""

    def __init__(self, cfg: dict, tensors: dict[str, torch.Tensor], rope: str = "half"):
        self.cfg, self.w, self.rope = cfg, tensors, rope
        self.hq, self.hkv, self.d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        self.head = tensors.get("lm_head.weight", tensors["model.embed_tokens.weight"])

    def new_caches(self, kv_dtype: str, attn: str = "torch", max_tokens: int = 0) -> list:
        if kv_dtype not in KV_DTYPES and not (kv_dtype == "float32" and attn == "torch"):
            raise ValueError(f"kv dtype must be one of {KV_DTYPES}, got {kv_dtype!r}")
        if attn == "torch":
            return [TorchCache(kv_dtype) for _ in range(self.cfg["num_hidden_layers"])]
        if attn == "kernels":
            return [KernelCache(kv_dtype, max_tokens, self.hkv, self.d) for _ in range(self.cfg["num_hidden_layers"])]
        raise ValueError(f"attention route must be 'torch' or 'kernels', got {attn!r}")

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg["rms_norm_eps"])
        return x * self.w[name]

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, caches: list, start: int = 0, hidden_only: bool = False) -> torch.Tensor:
        """ids [T] at positions start.. -> logits [T, V] (float32); the caches grow by T tokens."""
        w, t = self.w, ids.shape[0]
        x = w["model.embed_tokens.weight"][ids]
        cos, sin = rope_tables(self.d, self.cfg["rope_theta"], torch.arange(start, start + t))
        scale = 1.0 / math.sqrt(self.d)
        for i, cache in enumerate(caches):
            p = f"model.layers.{i}."
            h = self._norm(x, p + "input_layernorm.weight")
            q = (h @ w[p + "self_attn.q_proj.weight"].T).view(t, self.hq, self.d)
            k = (h @ w[p + "self_attn.k_proj.weight"].T).view(t, self.hkv, self.d)
            v = (h @ w[p + "self_attn.v_proj.weight"].T).view(t, self.hkv, self.d)
            q, k = apply_rope(q, cos, sin, self.rope), apply_rope(k, cos, sin, self.rope)
            cache.append(k, v)
            a = cache.attend(q, scale).reshape(t, self.hq * self.d)
            x = x + a @ w[p + "self_attn.o_proj.weight"].T
            h = self._norm(x, p + "post_attention_layernorm.weight")
            g = F.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
            x = x + g @ w[p + "mlp.down_proj.weight"].T
        x = self._norm(x, "model.norm.weight")
        return x if hidden_only else x @ self.head.T


def bf16_weights(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors rounded to bf16 (what the converted directory stores), kept as float32."""
    return {k: v.to(torch.bfloat16).float() for k, v in tensors.items()}
