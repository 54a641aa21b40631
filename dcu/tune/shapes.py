"""The shapes a tuning run measures: a model's attention shape, its engine pages per cache kind and its dense
decode GEMMs, plus the batch / context cases each kernel is timed at.

A model comes as a named shape set (``NAMED``: ``qwen3.5-27b``) or a Hugging Face ``config.json`` (top level or its
``text_config``). Pure Python (no torch), so bad input is refused before anything touches a device.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from .._kernels import gemv_params, layout

# a GEMM of the model: (name, N, K, fused SiLU-and-mul), weights [N, K]
GemmShape = tuple


class ShapeError(ValueError):
    """Bad model input (unknown name, unreadable or incomplete config); the CLI prints it as one error line."""


@dataclasses.dataclass(frozen=True)
class ModelShapes:
    name: str
    heads_q: int
    heads_kv: int
    head_dim: int
    pages: dict  # cache kind ("bf16", "fp8", "int8") -> tokens per page, as the engine sizes them
    gemms: tuple  # GemmShape, ...

    @property
    def attention(self) -> dict:
        return {"heads_q": self.heads_q, "heads_kv": self.heads_kv, "head_dim": self.head_dim}


@dataclasses.dataclass(frozen=True)
class Cases:
    """Where each kernel is timed: decode (batch, context), prefill (history, chunk) for the path decisions and
    (history, short chunk) for the 8-bit short-row launch (chunks of 64+ tokens read the 8-bit cache through the 16-bit
    mirror), the KV write's token counts (a decode step's scattered
    slots, a prefill chunk's consecutive ones)."""
    decode: tuple
    prefill: tuple
    prefill_short: tuple
    kv_write: tuple
    mirror: int | None = None  # tokens of the 8-bit prefill's 16-bit mirror (None: the engine's default)


# the engine's scale (GPU): the contest serves 4-32K contexts with 4096-token chunks (--max-num-batched-tokens)
ENGINE_CASES = Cases(decode=((1, 16384), (16, 16384)), prefill=((16384, 4096),), prefill_short=((16384, 16),),
                     kv_write=(64, 4096))
# Triton's CPU interpreter (tests): toy sizes that still cross pages and splits
TOY_CASES = Cases(decode=((2, 40),), prefill=((40, 64),), prefill_short=((40, 2),), kv_write=(3, 20),
                  mirror=512)

# Qwen3.5-27B: the GEMV's and the engine pages' one tables (kernels/gemv/launch_params.py, kernels/kv_quant/layout.py)
QWEN35_27B_GEMMS = gemv_params.QWEN35_27B_GEMMS
NAMED = {
    "qwen3.5-27b": ModelShapes("qwen3.5-27b", 24, 4, 256, dict(layout.QWEN35_27B_PAGE_TOKENS), QWEN35_27B_GEMMS),
}

# vLLM's page rules: 16 tokens without linear-attention layers; with them (Qwen3.5's Gated DeltaNet) the attention
# page is 16 x cdiv(state bytes, 16 x attention bytes per token) (HybridAttentionMambaModelConfig), an 8-bit
# per-token-head token holding D + 4 bytes (codes + float32 scale) per head for K and V, and patch 0002 rounds int8
# pages up to 128 tokens (kv_quant.layout.PAGE_ALIGN_TOKENS)
_DEFAULT_PAGE = 16
_INT8_ALIGN = 128


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def hybrid_pages(heads_kv: int, head_dim: int, state_bytes: int) -> dict:
    """Engine pages of a hybrid (attention + linear-attention) model whose per-sequence state page is
    ``state_bytes``."""
    def page(bytes_per_token):
        return 16 * _cdiv(state_bytes, 16 * bytes_per_token)

    bf16 = page(2 * heads_kv * head_dim * 2)
    pth = page(2 * heads_kv * (head_dim + 4))
    return {"bf16": bf16, "fp8": pth, "int8": _cdiv(pth, _INT8_ALIGN) * _INT8_ALIGN}


def _int(cfg: dict, key: str, where: str, default=None) -> int:
    val = cfg.get(key, default)
    if isinstance(val, bool) or not isinstance(val, int) or val < 1:
        raise ShapeError(f"{where}: {key} must be a positive integer, got {val!r}")
    return val


def from_config(path: str | Path) -> ModelShapes:
    """The shapes of the model a Hugging Face config.json describes (Qwen3.5 style: ``text_config`` when present,
    ``layer_types`` / ``linear_*`` for Gated DeltaNet layers, ``attn_output_gate`` for q's gate)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except OSError as e:
        raise ShapeError(f"cannot read model config {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ShapeError(f"model config {path} is not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ShapeError(f"model config {path} is not a JSON object")
    cfg = doc.get("text_config") if isinstance(doc.get("text_config"), dict) else doc
    where = f"model config {path}"
    hidden = _int(cfg, "hidden_size", where)
    hq = _int(cfg, "num_attention_heads", where)
    hkv = _int(cfg, "num_key_value_heads", where, hq)
    head_dim = _int(cfg, "head_dim", where, hidden // hq if hidden % hq == 0 else None)
    inter = _int(cfg, "intermediate_size", where)
    vocab = _int(cfg, "vocab_size", where)
    if hq % hkv:
        raise ShapeError(f"{where}: num_attention_heads {hq} is not a multiple of num_key_value_heads {hkv}")
    gate = 2 if cfg.get("attn_output_gate") else 1
    gemms = [("attn qkv" + ("+gate" if gate == 2 else ""), gate * hq * head_dim + 2 * hkv * head_dim, hidden, False),
             ("o_proj", hidden, hq * head_dim, False)]
    pages = {kind: _DEFAULT_PAGE for kind in ("bf16", "fp8", "int8")}
    if cfg.get("linear_num_value_heads"):
        kh, vh = _int(cfg, "linear_num_key_heads", where), _int(cfg, "linear_num_value_heads", where)
        kd, vd = _int(cfg, "linear_key_head_dim", where), _int(cfg, "linear_value_head_dim", where)
        conv_k = _int(cfg, "linear_conv_kernel_dim", where, 4)
        key_dim, value_dim = kh * kd, vh * vd
        gemms = [("in_proj_qkvz", 2 * key_dim + 2 * value_dim, hidden, False), ("in_proj_ba", 2 * vh, hidden, False),
                 *gemms, ("out_proj", hidden, value_dim, False)]
        # state: the conv window in bf16 + the recurrent state in float32 (mamba_ssm_dtype float32, as Qwen3.5)
        state = (2 * key_dim + value_dim) * (conv_k - 1) * 2 + vh * kd * vd * 4
        pages = hybrid_pages(hkv, head_dim, state)
    gemms += [("gate_up", 2 * inter, hidden, False), ("down", hidden, inter, False), ("lm_head", vocab, hidden, False),
              ("gate_up + silu_mul", 2 * inter, hidden, True)]
    seen, unique = set(), []
    for g in gemms:  # o_proj and out_proj share a shape: measure it once
        if (g[1], g[2], g[3]) not in seen:
            seen.add((g[1], g[2], g[3]))
            unique.append(g)
    name = str(cfg.get("_name_or_path") or doc.get("_name_or_path") or path.parent.name or path.stem)
    return ModelShapes(name, hq, hkv, head_dim, pages, tuple(unique))


def named(name: str) -> ModelShapes:
    key = name.strip().lower()
    if key not in NAMED:
        raise ShapeError(f"unknown model {name!r}; named shape sets: {', '.join(sorted(NAMED))} "
                         "(or give --model-config PATH/config.json)")
    return NAMED[key]
