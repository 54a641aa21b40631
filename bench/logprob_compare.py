"""Comparison of two engines' runs (bench/logprob_eq.py's worker output) against the limits of
bench/logprob_tolerance.py, and the rows of the report (tests/gpu/test_engine_equivalence.py, bench/kv_drift.py).

Greedy steps are compared while both engines have produced the same tokens, including the step where they first
differ (its context is still the same); a divergence is then within tolerance by the per-step check (the two
tokens' logprobs are within 2 x the limit of each other in the reference).
"""
from __future__ import annotations

import math

from bench.logprob_eq import scales
from bench.logprob_tolerance import MARGIN, comparison_mode, derive


def _kl(ref_lp, other_lp) -> float:
    import numpy as np

    a = ref_lp.astype(np.float64)
    return float((np.exp(a) * (a - other_lp.astype(np.float64))).sum())


def compare_length(ref: dict, other: dict) -> dict:
    """Metrics of one prompt length: every sampled position while the tokens agree (through the first
    difference), and the prompt tokens' logprobs."""
    import numpy as np

    if not np.array_equal(ref["prompt"], other["prompt"]):
        raise ValueError("the two runs used different prompts")
    steps = []
    diverged_at = None
    for t in range(min(len(ref["tokens"]), len(other["tokens"]))):
        a, b = ref["logprobs"][t], other["logprobs"][t]
        finite = bool(np.isfinite(a).all() and np.isfinite(b).all())
        d = np.abs(b.astype(np.float64) - a) if finite else np.array([np.inf])
        steps.append(dict(step=t, max_abs=float(d.max()), kl=_kl(a, b) if finite else math.inf,
                          same_token=bool(ref["tokens"][t] == other["tokens"][t]), finite=finite))
        if ref["tokens"][t] != other["tokens"][t]:
            diverged_at = t
            gap = float(a[ref["tokens"][t]] - a[other["tokens"][t]])
            steps[-1]["ref_gap"] = gap  # reference logprob of its token minus of the other's
            break
    dp = other["prompt_lp"].astype(np.float64) - ref["prompt_lp"]
    prompt_finite = bool(np.isfinite(dp).all())
    return dict(
        steps=steps, steps_compared=len(steps), diverged_at=diverged_at,
        first_max_abs=steps[0]["max_abs"], first_kl=steps[0]["kl"],
        step_max_abs=max(s["max_abs"] for s in steps), step_kl=max(s["kl"] for s in steps),
        prompt_rms=float(np.sqrt(np.mean(dp * dp))) if prompt_finite else math.inf,
        prompt_max_abs=float(np.abs(dp).max()) if prompt_finite else math.inf,
        prompt_argmax=int(np.abs(dp).argmax()) + 1 if prompt_finite else None,
        finite=prompt_finite and all(s["finite"] for s in steps),
        bit_identical=bool(all(s["max_abs"] == 0 for s in steps) and not np.any(dp)),
    )


def compare(ref_run: dict, other_run: dict) -> dict:
    """{length: compare_length(...)} over the lengths both runs have."""
    common = sorted(set(ref_run["lengths"]) & set(other_run["lengths"]))
    if not common:
        raise ValueError("the runs share no prompt length")
    return {n: compare_length(ref_run["lengths"][n], other_run["lengths"][n]) for n in common}


def tolerances_for(ref_meta: dict, other_meta: dict, lengths, margin: float = MARGIN) -> dict:
    """{length: Tolerance} for comparing two runs (their configurations decide the error model)."""
    mode = comparison_mode(ref_meta, other_meta)
    sc = scales(ref_meta["scales"])
    if sc != scales(other_meta["scales"]) or ref_meta["layers"] != other_meta["layers"]:
        raise ValueError("the runs used different weights (scales or layers)")
    return {n: derive(mode, layers=ref_meta["layers"], vocab=ref_meta["vocab"], prompt_len=n - 1,
                      logit_std=sc.logit_std, score_std=sc.score_std, margin=margin) for n in lengths}


CHECKS = (("step_max_abs", "step max |d logprob|"), ("step_kl", "step KL"), ("prompt_rms", "prompt RMS"),
          ("prompt_max_abs", "prompt max |d logprob|"))


def check(metrics: dict, tol: dict) -> list[str]:
    """Failures (empty when every length is within its limits and finite)."""
    bad = []
    for n, m in sorted(metrics.items()):
        if not m["finite"]:
            bad.append(f"length {n}: non-finite logprobs")
            continue
        for key, label in CHECKS:
            lim = getattr(tol[n], key)
            if m[key] > lim:
                bad.append(f"length {n}: {label} {m[key]:.4g} > limit {lim:.4g}")
    return bad


def ratios(metrics: dict, tol: dict) -> dict:
    """Measured / limit per check and length (1 = at the limit): how much room the derivation left."""
    return {n: {key: round(m[key] / getattr(tol[n], key), 4) if getattr(tol[n], key) > 0 else None
                for key, _ in CHECKS} for n, m in sorted(metrics.items())}


def report_rows(pair: str, metrics: dict, tol: dict) -> list[str]:
    """Markdown table rows (see REPORT_HEADER) for one compared pair."""
    rows = []
    for n, m in sorted(metrics.items()):
        t = tol[n]
        div = "-" if m["diverged_at"] is None else str(m["diverged_at"])
        rows.append(
            f"| {pair} | {n} | {m['first_max_abs']:.3g} | {m['first_kl']:.3g} | {m['step_max_abs']:.3g} / "
            f"{t.step_max_abs:.3g} | {m['step_kl']:.3g} / {t.step_kl:.3g} | {m['prompt_rms']:.3g} / {t.prompt_rms:.3g} "
            f"| {m['prompt_max_abs']:.3g} / {t.prompt_max_abs:.3g} | {m['steps_compared']} | {div} | "
            f"{'yes' if m['bit_identical'] else 'no'} |")
    return rows


REPORT_HEADER = [
    "| pair | prompt tokens | first token max abs | first token KL | step max abs / limit | step KL / limit | "
    "prompt RMS / limit | prompt max abs / limit | steps compared | first different token | bit-identical |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
]
