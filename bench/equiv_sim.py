"""CPU simulation of the engine-equivalence comparisons (issue #15) at reduced width.

    python -m bench.equiv_sim [--layers 4,8,16] [--seeds 3] [--tokens 384] [--f64]

A Qwen3.5-shaped stack (Gated DeltaNet on three layers of four, gated full attention with q/k norms and GQA 6:1 on
the fourth, SiLU MLP, pre-norm residual, final norm, lm_head) with the weights of ci/gpu/scaled_weights.py at the
given Scales (same std rules; widths: hidden 256, vocabulary 8192, head_dim 64, 1 KV head, GDN 2 key / 6 value
heads of 32). Partial RoPE is left out (it rotates q and k, norms unchanged). Random token ids as the prompt.
Arithmetic in float64; by default every tensor the engine stores in bf16 is rounded to bf16 (weights, linear and
norm outputs, the residual stream, activations, the attention output, the logits), as vLLM runs the model;
``--f64`` leaves everything but attention exact, which isolates how an attention error propagates linearly.

Each comparison runs the stack twice on the same ids with the attention computed as two engines would:

* ``bf16-kernels``: two bf16-KV attention kernels (TRITON_ATTN's and DCU_TRITON_ATTN's decode): each rounds P to
  bf16 before P.V in its own accumulation order, modelled as independent multiplicative noise U(-u, u)
  (u = 2^-8) on every P element per engine, and rounds its output to bf16;
* ``int8`` / ``fp8``: K and V stored per (token, head) by kernels/kv_quant/reference.py (the cache's exact
  quantizer) against bf16 K and V; P in fp16 (noise u = 2^-11) on the 8-bit side, bf16 on the other.

It reports, per comparison, the attention layers' own relative error eps (error of the attention output against
the exact attention of the same inputs, RMS over elements) and the logprob drift: the standard deviation over the
vocabulary of the change of the last position's logprobs, the largest change, KL, and the prompt logprobs' RMS /
largest change; ``propagation`` = drift std / (logit_std * eps). bench/logprob_tolerance.py's limits bound the
linear propagation (``--f64``) and the bf16 re-rounding floor (default) it measures; tests/test_logprob_eq.py
checks those bounds and the limits against this simulation.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass

import torch

from ci.gpu.scaled_weights import Scales, param_seed, std_rule
from kernels.kv_quant.reference import fake_quantize

U_BF16 = 2.0**-8
U_FP16 = 2.0**-11
MODES = ("bf16-kernels", "int8", "fp8")


@dataclass(frozen=True)
class Dims:
    hidden: int = 256
    vocab: int = 8192
    heads: int = 6
    kv_heads: int = 1
    head_dim: int = 64
    inter: int = 864
    gdn_k_heads: int = 2
    gdn_v_heads: int = 6
    gdn_dim: int = 32
    conv: int = 4


def _draw(name, module_cls, path, pname, shape, scales):
    kind, val = std_rule(module_cls, path, pname, shape, scales)
    if kind == "const":
        return torch.full(shape, float(val), dtype=torch.float64)
    g = torch.Generator().manual_seed(param_seed(scales.seed, name))
    return torch.randn(shape, generator=g, dtype=torch.float64) * val


def build(layers: int, scales: Scales, d: Dims = Dims()) -> dict:
    """Weights of a ``layers``-layer stack (full attention on every 4th layer), drawn by std_rule."""
    w = {}

    def add(path, cls, pname, shape):
        w[f"{path}.{pname}"] = _draw(f"{path}.{pname}", cls, path, pname, shape, scales)

    add("embed_tokens", "VocabParallelEmbedding", "weight", (d.vocab, d.hidden))
    kd, vd = d.gdn_k_heads * d.gdn_dim, d.gdn_v_heads * d.gdn_dim
    for i in range(layers):
        p = f"layers.{i}"
        add(f"{p}.input_layernorm", "GemmaRMSNorm", "weight", (d.hidden,))
        add(f"{p}.post_attention_layernorm", "GemmaRMSNorm", "weight", (d.hidden,))
        if (i + 1) % 4 == 0:
            a = f"{p}.self_attn"
            add(f"{a}.qkv_proj", "QKVParallelLinear", "weight",
                ((2 * d.heads + 2 * d.kv_heads) * d.head_dim, d.hidden))
            add(f"{a}.o_proj", "RowParallelLinear", "weight", (d.hidden, d.heads * d.head_dim))
            add(f"{a}.q_norm", "GemmaRMSNorm", "weight", (d.head_dim,))
            add(f"{a}.k_norm", "GemmaRMSNorm", "weight", (d.head_dim,))
        else:
            a = f"{p}.linear_attn"
            add(f"{a}.in_proj_qkvz", "MergedColumnParallelLinear", "weight", (2 * kd + 2 * vd, d.hidden))
            add(f"{a}.in_proj_ba", "MergedColumnParallelLinear", "weight", (2 * d.gdn_v_heads, d.hidden))
            add(f"{a}.conv1d", "ColumnParallelLinear", "weight", (2 * kd + vd, 1, d.conv))
            add(f"{a}", "Qwen3_5GatedDeltaNet", "A_log", (d.gdn_v_heads,))
            add(f"{a}", "Qwen3_5GatedDeltaNet", "dt_bias", (d.gdn_v_heads,))
            add(f"{a}.norm", "RMSNormGated", "weight", (d.gdn_dim,))
            add(f"{a}.out_proj", "RowParallelLinear", "weight", (d.hidden, vd))
        add(f"{p}.mlp.gate_up_proj", "MergedColumnParallelLinear", "weight", (2 * d.inter, d.hidden))
        add(f"{p}.mlp.down_proj", "RowParallelLinear", "weight", (d.hidden, d.inter))
    add("norm", "GemmaRMSNorm", "weight", (d.hidden,))
    add("lm_head", "ParallelLMHead", "weight", (d.vocab, d.hidden))
    w["_layers"] = layers
    w["_dims"] = d
    return w


def _rms_norm(x, weight, one_plus=True, eps=1e-6):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * ((1.0 + weight) if one_plus else weight)


def _noise(x, u, gen):
    """x * (1 + U(-u, u)) elementwise: the rounding model of one engine (u = 0: exact)."""
    if u == 0:
        return x
    return x * (1.0 + (torch.rand(x.shape, generator=gen, dtype=x.dtype) * 2 - 1) * u)


def _bf16(x):
    """Round to bfloat16 (RNE) and back: where the engine stores a tensor in the model's dtype."""
    return x.to(torch.bfloat16).to(x.dtype)


def _exact(x):
    return x


class Engine:
    """How one engine computes the full-attention layers: KV storage ('exact', 'int8', 'fp8') and rounding. With
    ``bf16`` (the engine's dtype) the output is rounded to bf16; without it, modelled as noise U(-u_out, u_out)."""

    def __init__(self, kv="exact", u_p=0.0, u_out=0.0, seed=0, bf16=True):
        self.kv, self.u_p, self.u_out, self.bf16 = kv, u_p, u_out, bf16
        self.gen = torch.Generator().manual_seed(seed)
        self.eps_sq = []  # per full-attention layer: (error^2 sum, reference^2 sum)

    def store(self, x):
        if self.kv == "exact":
            return x
        return fake_quantize(x.float(), f"{self.kv}_pth").double()

    def attend(self, q, k, v, scale, group):
        """q [T, H, D], k/v [T, Hkv, D]: causal attention as this engine computes it; records its own error."""
        exact = _attention(q, k, v, scale, group, None, 0.0)
        out = _attention(q, self.store(k), self.store(v), scale, group, self, self.u_p)
        out = _bf16(out) if self.bf16 else _noise(out, self.u_out, self.gen)
        self.eps_sq.append((float((out - exact).pow(2).sum()), float(exact.pow(2).sum())))
        return out

    def eps(self) -> float:
        err = sum(e for e, _ in self.eps_sq)
        ref = sum(r for _, r in self.eps_sq)
        return math.sqrt(err / ref) if ref > 0 else 0.0


def _attention(q, k, v, scale, group, engine, u_p):
    t = q.shape[0]
    kk = k.repeat_interleave(group, dim=1)
    vv = v.repeat_interleave(group, dim=1)
    s = torch.einsum("thd,shd->hts", q, kk) * scale
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.exp(s - s.amax(-1, keepdim=True))
    l_sum = p.sum(-1, keepdim=True)  # the kernels sum P before rounding it
    if engine is not None:
        p = _noise(p, u_p, engine.gen)
    return torch.einsum("hts,shd->thd", p / l_sum, vv)


def _gdn(x, w, a, d: Dims, r=_exact):
    t = x.shape[0]
    kd, vd = d.gdn_k_heads * d.gdn_dim, d.gdn_v_heads * d.gdn_dim
    qkvz = r(x @ w[f"{a}.in_proj_qkvz.weight"].T)
    mixed, z = qkvz[:, : 2 * kd + vd], qkvz[:, 2 * kd + vd :]
    ba = r(x @ w[f"{a}.in_proj_ba.weight"].T)
    b, a_in = ba[:, : d.gdn_v_heads], ba[:, d.gdn_v_heads :]
    cw = w[f"{a}.conv1d.weight"][:, 0, :]  # [C, K], causal depthwise
    padded = torch.cat([torch.zeros(d.conv - 1, mixed.shape[1], dtype=x.dtype), mixed])
    conv = sum(padded[j : j + t] * cw[:, j] for j in range(d.conv))
    conv = r(torch.nn.functional.silu(conv))
    q = conv[:, :kd].view(t, d.gdn_k_heads, d.gdn_dim)
    k = conv[:, kd : 2 * kd].view(t, d.gdn_k_heads, d.gdn_dim)
    v = conv[:, 2 * kd :].view(t, d.gdn_v_heads, d.gdn_dim)
    rep = d.gdn_v_heads // d.gdn_k_heads
    q = torch.nn.functional.normalize(q, dim=-1).repeat_interleave(rep, 1) / math.sqrt(d.gdn_dim)
    k = torch.nn.functional.normalize(k, dim=-1).repeat_interleave(rep, 1)
    beta = torch.sigmoid(b)
    g = -torch.exp(w[f"{a}.A_log"]) * torch.nn.functional.softplus(a_in + w[f"{a}.dt_bias"])
    state = torch.zeros(d.gdn_v_heads, d.gdn_dim, d.gdn_dim, dtype=x.dtype)
    outs = []
    for i in range(t):
        state = state * torch.exp(g[i])[:, None, None]
        mem = torch.einsum("hkv,hk->hv", state, k[i])
        delta = (v[i] - mem) * beta[i][:, None]
        state = state + torch.einsum("hk,hv->hkv", k[i], delta)
        outs.append(torch.einsum("hkv,hk->hv", state, q[i]))
    o = r(torch.stack(outs))  # [T, Hv, dv]
    o = r(_rms_norm(o, w[f"{a}.norm.weight"], one_plus=False) * torch.nn.functional.silu(
        z.view(t, d.gdn_v_heads, d.gdn_dim)))
    return r(o.reshape(t, vd) @ w[f"{a}.out_proj.weight"].T)


def _full_attention(x, w, a, d: Dims, engine: Engine, r=_exact):
    t = x.shape[0]
    qkv = r(x @ w[f"{a}.qkv_proj.weight"].T)
    qg = qkv[:, : 2 * d.heads * d.head_dim].view(t, d.heads, 2 * d.head_dim)
    q, gate = qg[..., : d.head_dim], qg[..., d.head_dim :]
    k = qkv[:, 2 * d.heads * d.head_dim : (2 * d.heads + d.kv_heads) * d.head_dim].view(t, d.kv_heads, d.head_dim)
    v = qkv[:, (2 * d.heads + d.kv_heads) * d.head_dim :].view(t, d.kv_heads, d.head_dim)
    q = r(_rms_norm(q, w[f"{a}.q_norm.weight"]))
    k = r(_rms_norm(k, w[f"{a}.k_norm.weight"]))
    o = engine.attend(q, k, v, d.head_dim**-0.5, d.heads // d.kv_heads)
    o = r(o * torch.sigmoid(gate))
    return r(o.reshape(t, d.heads * d.head_dim) @ w[f"{a}.o_proj.weight"].T)


def forward(w: dict, ids: torch.Tensor, engine: Engine) -> torch.Tensor:
    """Logprobs [T, vocab] of every position. With engine.bf16 every tensor the engine stores in bf16 is rounded
    to it (weights, linear and norm outputs, the residual stream, activations, attention output, logits; the
    arithmetic in between exact), as vLLM runs the model: then two engines whose attention differs by rounding
    differ everywhere after it by re-rounding too."""
    d = w["_dims"]
    r = _bf16 if engine.bf16 else _exact
    wr = {k: (r(v) if isinstance(v, torch.Tensor) else v) for k, v in w.items()}
    h = wr["embed_tokens.weight"][ids]
    for i in range(w["_layers"]):
        p = f"layers.{i}"
        x = r(_rms_norm(h, wr[f"{p}.input_layernorm.weight"]))
        if (i + 1) % 4 == 0:
            h = r(h + _full_attention(x, wr, f"{p}.self_attn", d, engine, r))
        else:
            h = r(h + _gdn(x, wr, f"{p}.linear_attn", d, r))
        x = r(_rms_norm(h, wr[f"{p}.post_attention_layernorm.weight"]))
        gu = r(x @ wr[f"{p}.mlp.gate_up_proj.weight"].T)
        act = r(torch.nn.functional.silu(gu[:, : d.inter]) * gu[:, d.inter :])
        h = r(h + r(act @ wr[f"{p}.mlp.down_proj.weight"].T))
    logits = r(r(_rms_norm(h, wr["norm.weight"])) @ wr["lm_head.weight"].T)
    return torch.log_softmax(logits, dim=-1)


def engines(mode: str, seed: int, bf16: bool = True) -> tuple[Engine, Engine]:
    """The two sides of a comparison (reference first)."""
    if mode == "bf16-kernels":
        return (Engine("exact", U_BF16, U_BF16, 2 * seed + 1, bf16),
                Engine("exact", U_BF16, U_BF16, 2 * seed + 2, bf16))
    if mode in ("int8", "fp8"):
        return Engine("exact", U_BF16, U_BF16, 2 * seed + 1, bf16), Engine(mode, U_FP16, U_BF16, 2 * seed + 2, bf16)
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def simulate(mode: str, layers: int, scales: Scales = Scales(), tokens: int = 384, seed: int = 0,
             dims: Dims = Dims(), bf16: bool = True) -> dict:
    """Run one comparison; the drift numbers and eps (the attention error of the perturbed side, and of both
    sides together: sqrt(eps_ref^2 + eps_other^2), what the logits see)."""
    w = build(layers, Scales(**{**scales.to_dict(), "seed": scales.seed + 1000 * seed}), dims)
    ids = torch.randint(0, dims.vocab, (tokens,), generator=torch.Generator().manual_seed(seed))
    ref_engine, other_engine = engines(mode, seed, bf16)
    ref = forward(w, ids, ref_engine)
    other = forward(w, ids, other_engine)
    last = other[-1] - ref[-1]
    p = ref[-1].exp()
    kl = float((p * (ref[-1] - other[-1])).sum())
    eps = math.hypot(ref_engine.eps(), other_engine.eps())
    prompt = (other[:-1] - ref[:-1]).gather(1, ids[1:, None])[:, 0]  # each position's next prompt token
    std = float(last.std())
    return dict(mode=mode, layers=layers, seed=seed, tokens=tokens, eps=eps, drift_std=std,
                drift_max=float(last.abs().max()), kl=kl, prompt_rms=float(prompt.pow(2).mean().sqrt()),
                prompt_max=float(prompt.abs().max()), propagation=std / (scales.logit_std * eps),
                top1_p=float(p.max()), logprob_std=float(ref[-1].std()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default="4,8,16")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=384)
    ap.add_argument("--scales", default="{}", help="Scales as JSON (ci/gpu/scaled_weights.py)")
    ap.add_argument("--f64", action="store_true", help="float64 everywhere but attention (the linear part alone)")
    a = ap.parse_args(argv)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    scales = Scales.from_dict(json.loads(a.scales))
    for layers in map(int, a.layers.split(",")):
        for mode in a.modes.split(","):
            for seed in range(a.seeds):
                r = simulate(mode, layers, scales, a.tokens, seed, bf16=not a.f64)
                print(json.dumps({k: round(v, 6) if isinstance(v, float) else v for k, v in r.items()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
