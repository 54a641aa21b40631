"""The decode GEMV at every dense GEMM of the model and each row bucket (1, 2, 4, 8 rows) against the platform GEMM:
the dispatch table (kernels/gemv/dispatch.py's entry format) and, with ``--full``, per-shape launch overrides."""
from __future__ import annotations

import json
import math

import torch
import torch.nn.functional as F

from .._kernels import candidates, gemv, gemv_params, one_line, silu_and_mul
from .._kernels import gemv_dispatch as dispatch

from .common import GEMV_MAX_REL, Failed, run_ours, sweep_over, time_us

BETTER = 0.97  # a candidate replaces the table's launch when it takes less than this share of its time (bench.py)


def platform_linear(x, weight):
    """What vLLM runs without patch 0007: on ROCm upstream's rocm_unquantized_gemm body (vllm.dcu.gemv), else
    F.linear."""
    if torch.version.hip:
        from ..gemv import platform_linear as rocm_linear

        return rocm_linear(x, weight, None)
    return F.linear(x, weight)


def _copies(weight) -> int:
    if weight.device.type != "cuda":
        return 1
    props = torch.cuda.get_device_properties(weight.device)
    return dispatch.l2_copies(weight.numel() * weight.element_size(), getattr(props, "L2_cache_size", 0) or 64 << 20)


def _us(v: float) -> float | None:
    """A time for the table: 0.01 us, None when not measured (JSON has no NaN)."""
    return round(v, 2) if math.isfinite(v) else None


def _rel(got, want) -> float:
    g, w = got.double(), want.double()
    return float((g - w).norm() / w.norm().clamp_min(1e-30))


class Shape:
    def __init__(self, name, n, k, silu, dev):
        self.name, self.n, self.k, self.silu = name, n, k, silu
        self.key = dispatch.ShapeKey(n, k, "bfloat16", False, silu)
        gen = torch.Generator(device=dev).manual_seed(n * 7 + k)
        w = (torch.randn(n, k, device=dev, generator=gen) / k**0.5).to(torch.bfloat16)
        self.w = [w] + [w.clone() for _ in range(_copies(w) - 1)]
        self.x = {b: (torch.randn(b, k, device=dev, generator=gen) * 0.5).to(torch.bfloat16)
                  for b in dispatch.BUCKETS}

    def ours(self, bucket, cfg):
        x = self.x[bucket]
        return lambda i: gemv(x, self.w[i], None, silu_mul=self.silu, config=cfg)

    def platform(self, bucket):
        x = self.x[bucket]
        if self.silu:
            return lambda i: silu_and_mul(platform_linear(x, self.w[i]))
        return lambda i: platform_linear(x, self.w[i])

    def check(self, bucket, cfg):
        got = run_ours(lambda: self.ours(bucket, cfg)(0))
        rel = _rel(got, self.platform(bucket)(0))
        if not rel < GEMV_MAX_REL:
            raise Failed(f"differs from upstream: relative {rel:.3g} (limit {GEMV_MAX_REL:g}) at {bucket} rows")
        return rel


def run(shapes, dev, full: bool, rows: list, log):
    """(doc["gemv"] entries, the launch override for the tuned file, number of (shape, bucket) pairs on the GEMV)."""
    target = gemv_params.current_target(dev)
    rocm = target.startswith("gfx") or target == "rocm"
    entry = gemv_params.get_params(target, "")  # the table's entry (the rehearsal's without ROCm-only options)
    table, shape_ov = {}, {}
    for name, n, k, silu in shapes.gemms:
        op = Shape(name, n, k, silu, dev)
        per_bucket = {}
        for b in dispatch.BUCKETS:
            cfg = gemv_params.config_for(target, n, k, b, silu_mul=silu, entry=entry)
            best, best_label, why = cfg, "table", None
            try:
                op.check(b, cfg)
            except Failed as e:
                why = e.why
            cands = candidates.gemv_candidates(cfg, b) if full else []
            scored = []
            for label, cand in [("table", cfg)] * (why is None) + cands:
                row = {"phase": "gemv", "shape": op.key.id, "rows": b, "candidate": label, "config": cand}
                try:
                    gemv_params.check_config(dict(cand), "candidate", rocm=rocm, rows=b, silu_mul=silu)
                except ValueError as e:
                    rows.append({**row, "skipped": one_line(e)})
                    continue
                if label != "table" and sweep_over():
                    rows.append({**row, "skipped": "sweep budget spent (--sweep-budget-s)"})
                    continue
                try:
                    if label != "table":
                        op.check(b, cand)
                    us = time_us({"ours": op.ours(b, cand)}, len(op.w))["ours"]
                except Failed as e:
                    rows.append({**row, "failed": e.why})
                    continue
                scored.append((us, label, cand))
                rows.append({**row, "us": round(us, 2)})
            table_us = next((us for us, label, _ in scored if label == "table"), None)
            if scored:
                us, label, cand = min(scored, key=lambda s: s[0])
                if table_us is None or us < BETTER * table_us:
                    best, best_label = cand, label
            if best_label != "table" or why is None:
                why = None
                t = time_us({"triton": op.ours(b, best), "platform": op.platform(b)}, len(op.w))
                t_us, p_us = t["triton"], t["platform"]
            else:
                t_us, p_us = float("nan"), time_us({"platform": op.platform(b)}, len(op.w))["platform"]
            choice = dispatch.decide(t_us, p_us)
            per_bucket[str(b)] = {"choice": choice, "triton_us": _us(t_us), "platform_us": _us(p_us)}
            if best_label != "table" and choice == "triton":
                diff = candidates.diff(cfg, best)
                shape_ov.setdefault(gemv_params.shape_name(n, k, silu), {})[str(b)] = diff
            rows.append({"phase": "gemv", "shape": op.key.id, "rows": b, "launch": best_label, "choice": choice,
                         "triton_us": per_bucket[str(b)]["triton_us"], "platform_us": per_bucket[str(b)]["platform_us"],
                         **({"failure": why} if why else {})})
            if why:
                log(f"  gemv {op.key.id} rows {b}: {why}; platform GEMM")
        table[op.key.id] = per_bucket
        del op
    override = {"shapes": shape_ov} if shape_ov else {}
    if override:
        gemv_params.get_params(target, json.dumps(override, sort_keys=True))  # the table's own validation
    return table, override
