"""Attention-output error of 8-bit KV caches against bf16, on synthetic K/V (CPU, torch reference).

    python -m kernels.kv_quant.numerics [--out DIR] [--ctx 4096,32768] [--seeds 2]

Compares vLLM 0.18.1's per-tensor fp8 (scale 1.0, the default without calibration), fp8_per_token_head
and int8_per_token_head over scenarios that differ only in what the quantizers see: queries are scaled
so the attention logits have standard deviation 1 in every scenario. Qwen3.5-27B heads (24 q / 4 kv x
256), 4 query tokens at the end of the context, float32 attention. The kernel writes bit-identical codes
(tests/test_kv_quant.py), so these numbers hold for the cache the engine keeps.
Writes ``<date>-cpu-kv-numerics.{json,md}`` into ``--out`` (default ``$OUT`` or bench/results/).
"""
import argparse
import datetime
import math
import os
import shlex
import sys
from pathlib import Path

import torch

from .reference import attention_reference, fake_quantize, relative_error
from ..results_io import write_result_pair

NUM_Q, HQ, HKV, D = 4, 24, 4, 256
MODES = ("fp8_per_tensor", "fp8_pth", "int8_pth")

# name: (K std, V std, K outlier-channel ratio or None); 4 outlier channels per head when set
SCENARIOS = {
    "gaussian_unit": (1.0, 1.0, None),
    "gaussian_small_v": (1.0, 2.0**-8, None),  # V mostly below e4m3's smallest normal (2^-6) at scale 1.0
    "gaussian_small_kv": (2.0**-8, 2.0**-8, None),
    "k_outliers_20x_in_range": (1.0, 1.0, 20),  # outlier channels stay inside +-448
    "k_outliers_100x_in_range": (1.0, 1.0, 100),
    "k_outliers_20x_beyond_448": (8.0, 1.0, 20),  # outliers exceed e4m3's range at scale 1.0
    "k_outliers_100x_beyond_448": (8.0, 1.0, 100),
}


def scenario_errors(name: str, ctx: int, seed: int | None = None) -> dict[str, float]:
    """Relative error of the attention output for each mode against unquantized (bf16) K/V."""
    k_std, v_std, ratio = SCENARIOS[name]
    g = torch.Generator().manual_seed(ctx + len(name) if seed is None else seed)
    k = torch.randn(ctx, HKV, D, generator=g) * k_std
    v = torch.randn(ctx, HKV, D, generator=g) * v_std
    if ratio is not None:
        channels = torch.randperm(D, generator=g)[:4]
        k[:, :, channels] *= ratio
    k, v = k.bfloat16().float(), v.bfloat16().float()
    q = torch.randn(NUM_Q, HQ, D, generator=g)
    logits = torch.einsum("qgd,kgd->qgk", q.view(NUM_Q, HKV, -1, D)[:, :, 0], k[:1024]) / math.sqrt(D)
    q = (q / logits.std()).bfloat16().float()
    want = attention_reference(q, k, v, dtype=torch.float32)
    errs = {}
    for mode in MODES:
        got = attention_reference(q, fake_quantize(k, mode), fake_quantize(v, mode), dtype=torch.float32)
        if not torch.isfinite(got).all():
            raise AssertionError(f"{mode} gave a non-finite attention output in {name} at {ctx}")
        errs[mode] = relative_error(got, want)
    return errs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench/results")
    ap.add_argument("--ctx", default="4096,32768")
    ap.add_argument("--seeds", type=int, default=2)
    args = ap.parse_args(argv)
    rows = []
    for ctx in [int(x) for x in args.ctx.split(",")]:
        for name in SCENARIOS:
            per_seed = [scenario_errors(name, ctx, seed=ctx + 7919 * s) for s in range(args.seeds)]
            row = dict(ctx=ctx, scenario=name)
            for mode in MODES:
                row[mode] = round(sum(e[mode] for e in per_seed) / len(per_seed), 5)
            ratios = [(e["fp8_pth"] / e["fp8_per_tensor"], e["int8_pth"] / e["fp8_pth"]) for e in per_seed]
            row["fp8_pth/per_tensor"] = f"{min(r[0] for r in ratios):.2f}-{max(r[0] for r in ratios):.2f}"
            row["int8_pth/fp8_pth"] = f"{min(r[1] for r in ratios):.2f}-{max(r[1] for r in ratios):.2f}"
            rows.append(row)
            print(row, flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{datetime.date.today().isoformat()}-cpu-kv-numerics"
    command = "python -m kernels.kv_quant.numerics " + shlex.join(sys.argv[1:] if argv is None else argv)
    lines = [
        "# Attention-output error of 8-bit KV caches against bf16 (synthetic K/V)", "", f"Command: `{command}`", "",
        f"{HQ} q / {HKV} kv heads x {D}, {NUM_Q} queries at the end of the context, logits scaled to std 1, "
        f"mean of {args.seeds} seeds (ratios: range over seeds). per-tensor fp8 = vLLM 0.18.1 `fp8` with "
        "scale 1.0.", "",
        "| ctx | scenario | per-tensor fp8 | fp8_pth | int8_pth | fp8_pth / per-tensor | int8_pth / fp8_pth |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['ctx']} | {r['scenario']} | {r['fp8_per_tensor']:.4f} | {r['fp8_pth']:.4f} | "
                     f"{r['int8_pth']:.4f} | {r['fp8_pth/per_tensor']} | {r['int8_pth/fp8_pth']} |")
    md = write_result_pair(out, stem, dict(command=command, rows=rows), lines)
    print(md.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
