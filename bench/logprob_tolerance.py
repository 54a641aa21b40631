"""Tolerances of the engine-level equivalence comparisons (issue #15), derived from bf16 / 8-bit rounding.

``derive`` gives the limits of one comparison; the derivation, with its numbers, is also printed in the reports and
written next to the GPU test (tests/gpu/test_engine_equivalence.py). The engines' logprobs come from
bench/logprob_eq.py, their comparison against these limits from bench/logprob_compare.py; tests/test_logprob_eq.py
checks the derivation against bench/equiv_sim.py's simulation.

1. Attention-level relative error eps (RMS error of a full-attention layer's output / RMS of the output):
   * two bf16-KV kernels (TRITON_ATTN vs DCU_TRITON_ATTN decode): each rounds P to bf16 before P.V and its output
     to bf16 (unit roundoff u = 2^-8; a uniform rounding error has RMS u / sqrt(3)), independently:
     eps = sqrt(2 engines x 2 roundings) x u / sqrt(3) = 2u / sqrt(3) = 4.5e-3;
   * 8-bit KV vs bf16 KV: the 8-bit cache's relative RMS error r of a head vector (measured with the cache's own
     quantizer, kernels/kv_quant/reference.py, on N(0, 1) vectors of head_dim: int8 7.0e-3, fp8 2.6e-2 at 256)
     enters the scores as score_std x r (K; the scores are N(0, score_std^2) by construction) and the output as r
     (V); plus both sides' rounding (bf16 side: P and output bf16; 8-bit side: P fp16 (u = 2^-11), output bf16):
     eps = sqrt((score_std r)^2 + r^2 + rounding^2) (int8 0.022, fp8 0.083 at score_std 3): an upper estimate,
     a score error moves the output by at most its own size relative to it.
2. Propagation to the logits: the change of the logprobs has standard deviation
   sigma = logit_std x sqrt((P x eps)^2 + F^2) over the vocabulary.
   * P: how much of an attention error reaches the final hidden state (linearly). bench/equiv_sim.py (this model
     and these weights at reduced width, the comparisons' error models, float64 elsewhere;
     ``python -m bench.equiv_sim --f64``, 256 and 384 tokens, 3 seeds) measured 0.12-0.21 with one full-attention
     layer, 0.23-0.41 with two, 0.32-0.54 with three, 0.47-0.70 with four; 0.25 per full-attention layer bounds
     it (PROPAGATION_PER_ATTN_LAYER).
   * F: the engine stores every activation in bf16. Once two engines' values differ at all, each later rounding
     turns a difference below one bf16 step into a whole step or none (variance ~ difference x step): the
     difference does not shrink below rounding level and accumulates layer by layer. The simulation with bf16
     everywhere (``python -m bench.equiv_sim``, 256 tokens, 3 seeds) measured F = drift / logit_std = 0.003 /
     0.012 / 0.020 / 0.026 at 4 / 8 / 12 / 16 layers for two bf16 kernels; 0.5 u per layer (u = 2^-8:
     0.0078 / 0.0156 / 0.023 / 0.031) bounds it (FLOOR_PER_LAYER_U). It dominates the bf16-kernel comparison
     (P x eps ~ 2e-3) and is comparable to the 8-bit ones.
   tests/test_logprob_eq.py checks both bounds and the limits below against the simulation.
3. Limits (margin M = 2 on the predicted size): the largest change over the vocabulary of one position's
   logprobs: M x z(vocab) x sigma + one bf16 step of the largest logit (logits are bf16: a change may round a
   logit a whole step; 0.125 at logit_std 3 over 248320 tokens) with z(n) = sqrt(2 ln n) + 1.5 (the largest of n
   Gaussian draws, plus room for the heavier tails near-tied attention gives); KL(ref || other) of one position:
   (M sigma)^2 / 2 (KL ~ the variance of the change / 2); the prompt tokens' logprobs: RMS change M x sigma,
   largest change M x z(prompt length) x sigma + one bf16 step of logit_std x z(prompt length).
"""
from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass

U_BF16 = 2.0**-8
U_FP16 = 2.0**-11
PROPAGATION_PER_ATTN_LAYER = 0.25
FLOOR_PER_LAYER_U = 0.5  # bf16 re-rounding floor: 0.5 u per layer of relative change of the final hidden state
MARGIN = 2.0
Z_EXTRA = 1.5
MODES = ("bf16-kernels", "int8", "fp8")
KV_MODE = {"auto": "bf16", "bfloat16": "bf16", "int8_per_token_head": "int8", "fp8_per_token_head": "fp8"}


def z(n: int) -> float:
    """Multiple of the standard deviation the largest |change| of n draws may reach: sqrt(2 ln n) + Z_EXTRA."""
    return math.sqrt(2.0 * math.log(max(n, 2))) + Z_EXTRA


@functools.lru_cache(maxsize=None)
def quant_rel_error(kind: str, head_dim: int, rows: int = 4096, seed: int = 0) -> float:
    """Relative RMS error of one (token, head) vector of N(0, 1) values stored by the 8-bit cache's quantizer
    (scale = absmax / QMAX per vector, so the result does not depend on the vector's magnitude)."""
    import torch

    from kernels.kv_quant.reference import fake_quantize  # run from the repository root (python -m bench....)

    x = torch.randn(rows, head_dim, generator=torch.Generator().manual_seed(seed))
    err = fake_quantize(x, f"{kind}_pth") - x
    return float((err.pow(2).mean() / x.pow(2).mean()).sqrt())


def rounding_eps(kv: str) -> float:
    """RMS relative rounding error of one engine's attention output: P and the output rounded (uniform errors)."""
    u_p = U_FP16 if kv in ("int8", "fp8") else U_BF16
    return math.sqrt(u_p**2 + U_BF16**2) / math.sqrt(3.0)


def attention_eps(mode: str, score_std: float, head_dim: int) -> dict:
    """eps of ``mode`` and its parts (see the module docstring, step 1)."""
    if mode == "bf16-kernels":
        parts = {"rounding": math.hypot(rounding_eps("bf16"), rounding_eps("bf16"))}
    elif mode in ("int8", "fp8"):
        r = quant_rel_error(mode, head_dim)
        parts = {"k_scores": score_std * r, "v": r, "rounding": math.hypot(rounding_eps("bf16"), rounding_eps(mode)),
                 "r": r}
    else:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    parts["eps"] = math.sqrt(sum(v * v for k, v in parts.items() if k != "r"))
    return parts


def propagation(layers: int) -> float:
    """Upper bound of P (module docstring, step 2) for a model with full attention on every 4th layer."""
    return PROPAGATION_PER_ATTN_LAYER * max(1, layers // 4)


def rounding_floor(layers: int) -> float:
    """Upper bound of F (module docstring, step 2): the relative change of the final hidden state that bf16
    re-rounding alone leaves between two engines whose values differ at all."""
    return FLOOR_PER_LAYER_U * U_BF16 * layers


def bf16_ulp(x: float) -> float:
    """Spacing of bf16 numbers at |x| (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7) if x else 2.0**-133


@dataclass(frozen=True)
class Tolerance:
    mode: str
    eps: float
    sigma: float
    step_max_abs: float
    step_kl: float
    prompt_rms: float
    prompt_max_abs: float
    derivation: str

    def to_dict(self) -> dict:
        return asdict(self)


def derive(mode: str, *, layers: int, vocab: int, prompt_len: int, logit_std: float, score_std: float,
           head_dim: int = 256, margin: float = MARGIN) -> Tolerance:
    """The limits of a comparison of ``mode`` (module docstring)."""
    parts = attention_eps(mode, score_std, head_dim)
    p, f = propagation(layers), rounding_floor(layers)
    sigma = logit_std * math.hypot(p * parts["eps"], f)
    ulp_top, ulp_prompt = bf16_ulp(logit_std * z(vocab)), bf16_ulp(logit_std * z(prompt_len))
    step_max = margin * z(vocab) * sigma + ulp_top
    prompt_max = margin * z(prompt_len) * sigma + ulp_prompt
    shown = ", ".join(f"{k} {v:.3g}" for k, v in parts.items() if k != "eps")
    text = (f"{mode}: eps = {parts['eps']:.3g} ({shown}); sigma = logit_std {logit_std:g} x sqrt((P {p:g} x eps)^2 "
            f"+ F {f:.3g}^2) ({layers} layers) = {sigma:.3g}; limits with margin {margin:g}: step max |d logprob| "
            f"{margin:g} x z({vocab}) {z(vocab):.2f} x sigma + bf16 ulp of the top logit {ulp_top:g} = "
            f"{step_max:.3g}, step KL (M sigma)^2 / 2 = {(margin * sigma) ** 2 / 2:.3g}, prompt RMS "
            f"{margin * sigma:.3g}, prompt max {margin:g} x z({prompt_len}) {z(prompt_len):.2f} x sigma + "
            f"{ulp_prompt:g} = {prompt_max:.3g}")
    return Tolerance(mode=mode, eps=parts["eps"], sigma=sigma, step_max_abs=step_max,
                     step_kl=(margin * sigma) ** 2 / 2, prompt_rms=margin * sigma, prompt_max_abs=prompt_max,
                     derivation=text)


def comparison_mode(ref_cfg: dict, other_cfg: dict) -> str:
    """Which error model a pair of configurations is compared under."""
    a, b = KV_MODE.get(ref_cfg["kv"]), KV_MODE.get(other_cfg["kv"])
    if a is None or b is None:
        raise ValueError(f"unknown KV dtype in {ref_cfg['kv']!r} / {other_cfg['kv']!r}")
    if a == b == "bf16":
        return "bf16-kernels"
    if a == "bf16" and b in ("int8", "fp8"):
        return b
    raise ValueError(f"no error model for {a} vs {b} (the reference must be bf16 KV)")
