"""Where each KV format loses accuracy on the real model: per layer, head, position and channel.

    python -m bench.real_model analyze [--tokens 1024] [--window 2] [--out DIR]

One window of the text runs through the bf16-KV forward while every layer's K (after RoPE), V and queries are
recorded. For each layer and KV head, and each format: the stored values' relative RMS error against bf16
(``||x_q - x|| / ||x||``), the share of values e4m3 at scale 1.0 cannot hold as normals (``|x| < 2^-6``, the
subnormal zone where per-tensor fp8 keeps fewer bits) or at all (``|x| > 448``), K's largest channel against the
median channel's absmax (outlier channels), and the attention output's relative error when the layer's own queries
read that head's quantized K/V (the layer's local error, every other input held at bf16), overall and at the first
position (the attention sink) separately. Writes ``<date>-cpu-real-model-analysis.{json,md}``.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from kernels.kv_quant.reference import fake_quantize

from . import forward, report, tasks

MODES = {"int8_per_token_head": "int8_pth", "fp8_per_token_head": "fp8_pth", "fp8": "fp8_per_tensor"}


class Recorder(forward.TorchCache):
    """A bf16 cache that keeps the layer's queries too."""

    def __init__(self):
        super().__init__("auto")
        self.q = None

    def attend(self, q, scale):
        self.q = q.detach().clone()
        return super().attend(q, scale)


def _attend(q, k, v, scale):
    t, hq, _ = q.shape
    n, hkv, _ = k.shape
    g = hq // hkv
    mask = torch.arange(n)[None, :] <= torch.arange(n - t, n)[:, None]
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.repeat_interleave(g, 1).transpose(0, 1),
                                         v.repeat_interleave(g, 1).transpose(0, 1), attn_mask=mask, scale=scale)
    return out.transpose(0, 1)  # [t, hq, d]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def analyze(model: forward.Model, ids: torch.Tensor) -> dict:
    caches = [Recorder() for _ in range(model.cfg["num_hidden_layers"])]
    model.forward(ids, caches, hidden_only=True)
    scale = 1.0 / math.sqrt(model.d)
    g = model.hq // model.hkv
    layers = []
    for li, c in enumerate(caches):
        k, v, q = c.k, c.v, c.q  # bf16-valued float32: [n, hkv, d], q [n, hq, d]
        ref = _attend(q, k, v, scale)
        heads = []
        for h in range(model.hkv):
            kh, vh = k[:, h], v[:, h]
            ch = kh.abs().amax(0)
            row = dict(head=h, k_absmax=kh.abs().max().item(), v_absmax=vh.abs().max().item(),
                       k_outlier_channel=int(ch.argmax()), k_outlier_ratio=(ch.max() / ch.median()).item(),
                       k_sub=(kh.abs() < 2**-6).float().mean().item(), v_sub=(vh.abs() < 2**-6).float().mean().item(),
                       over448=int((kh.abs() > 448).sum() + (vh.abs() > 448).sum()), formats={})
            for kv, mode in MODES.items():
                kq, vq = k.clone(), v.clone()
                kq[:, h], vq[:, h] = fake_quantize(kh, mode), fake_quantize(vh, mode)
                out = _attend(q, kq, vq, scale)
                sl = slice(h * g, (h + 1) * g)
                row["formats"][kv] = dict(k_err=rel(kq[:, h], kh), v_err=rel(vq[:, h], vh),
                                          attn_err=rel(out[:, sl], ref[:, sl]),
                                          attn_err_first=rel(out[:1, sl], ref[:1, sl]),
                                          attn_err_rest=rel(out[1:, sl], ref[1:, sl]))
            heads.append(row)
        layers.append(heads)
    return dict(tokens=int(ids.numel()), layers=layers)


def markdown(doc: dict, command: str) -> str:
    out = [f"# Where the KV formats lose accuracy: SmolLM2-135M, per layer and KV head (CPU)", "",
           f"Command: `{command}`", "",
           f"One {doc['tokens']}-token window of Austen. Per layer x KV head: K / V absmax, K's largest channel "
           "over the median channel absmax (outliers), share of K / V values below 2^-6 (e4m3's subnormals at scale "
           "1.0), then per format the relative RMS error of K, V and of the head's attention output when the layer's "
           "queries read that head quantized (local error; first position = the attention sink).", "",
           "| layer.head | K max | V max | K outlier ch (x median) | K / V < 2^-6 | int8 K / V / attn | fp8 pth K / V / "
           "attn | fp8 tensor K / V / attn |", "|---|---|---|---|---|---|---|---|"]
    worst = {kv: (0.0, "") for kv in MODES}
    for li, heads in enumerate(doc["layers"]):
        for r in heads:
            f = r["formats"]
            out.append(f"| {li}.{r['head']} | {r['k_absmax']:.1f} | {r['v_absmax']:.2f} | {r['k_outlier_channel']} "
                       f"({r['k_outlier_ratio']:.1f}) | {100 * r['k_sub']:.1f}% / {100 * r['v_sub']:.1f}% | "
                       + " | ".join(f"{f[kv]['k_err']:.4f} / {f[kv]['v_err']:.4f} / {f[kv]['attn_err']:.4f}"
                                    for kv in MODES) + " |")
            for kv in MODES:
                if f[kv]["attn_err"] > worst[kv][0]:
                    worst[kv] = (f[kv]["attn_err"], f"{li}.{r['head']}")
    sums = {kv: sum(r["formats"][kv]["attn_err"] ** 2 for h in doc["layers"] for r in h) for kv in MODES}
    out += ["", "Summary: " + "; ".join(
        f"{kv}: worst head {worst[kv][1]} ({worst[kv][0]:.4f}), RMS over heads "
        f"{math.sqrt(sums[kv] / sum(len(h) for h in doc['layers'])):.4f}" for kv in MODES)]
    sink = {kv: max(r["formats"][kv]["attn_err_first"] for h in doc["layers"] for r in h) for kv in MODES}
    out += ["", "Largest attention error at the first position (a query that sees one key): " + "; ".join(
        f"{kv} {sink[kv]:.4f}" for kv in MODES)]
    return "\n".join(out) + "\n"


def run(model, tok, text: str, tokens: int, window: int, out_dir: Path, command: str) -> Path:
    ids = torch.tensor(tasks.windows(tasks.tokenize(tok, text), tokens, window + 1)[window])
    doc = dict(analyze(model, ids), command=command)
    return report.write_pair(out_dir, "cpu-real-model-analysis", doc, markdown(doc, command))
