"""Contest throughput score, as the technical plan states it.

Per tier (bucket): `max * (0.6 + 0.4 * (1 - exp(-1.3 * r)))`, where r is the
relative output-throughput gain over the baseline (tok/s / baseline tok/s - 1)
and max is 20 (4-8K), 50 (8-16K), 30 (16-32K). r = 0 gives 60% of the bucket;
the formula is applied as written for r < 0 too (no clamp is documented).

SLA, each against the baseline of the same run:
- a tier scores 0 when its TTFT P99 exceeds 1.5x the baseline's TTFT P99 of
  that tier;
- a tier scores 0 when its TPOT P99 exceeds 1.5x the baseline's TPOT P99 of
  that tier; and when the global TPOT P99 (all requests of all tiers pooled,
  as the contest takes it) is known for both, every tier scores 0 when it
  exceeds 1.5x the baseline's.
Accuracy factors (k) and completion-rate checks are outside this module: the
dummy-weight benchmark cannot measure accuracy.
"""
from __future__ import annotations

import math

TIER_MAX = {"4-8K": 20.0, "8-16K": 50.0, "16-32K": 30.0}
SLA_FACTOR = 1.5


def tier_score(max_points: float, r: float) -> float:
    """Bucket score for relative gain r (0.25 means +25% output tok/s)."""
    return max_points * (0.6 + 0.4 * (1.0 - math.exp(-1.3 * r)))


def score_terms(base: dict[str, dict], cand: dict[str, dict],
                global_tpot_p99: tuple[float, float] | None = None) -> dict[str, dict]:
    """Score terms per tier.

    base, cand: {tier: {"tok_s", "ttft_p99", "tpot_p99"}} (ms for latencies).
    global_tpot_p99: (baseline, candidate) global TPOT P99 in ms, or None.
    Returns {tier: {"r", "raw", "score", "sla_ok", "violations": [str]}} for the
    tiers present in both, in TIER_MAX order.
    """
    global_bad = None
    if global_tpot_p99 is not None:
        gb, gc = global_tpot_p99
        if gc > SLA_FACTOR * gb:
            global_bad = f"global TPOT P99 {gc:.2f} ms > {SLA_FACTOR}x {gb:.2f}"
    out: dict[str, dict] = {}
    for tier, max_points in TIER_MAX.items():
        if tier not in base or tier not in cand:
            continue
        b, c = base[tier], cand[tier]
        if b["tok_s"] <= 0:
            raise ValueError(f"baseline output tok/s for {tier} is {b['tok_s']}; cannot score")
        r = c["tok_s"] / b["tok_s"] - 1.0
        raw = tier_score(max_points, r)
        violations = []
        if c["ttft_p99"] > SLA_FACTOR * b["ttft_p99"]:
            violations.append(f"TTFT P99 {c['ttft_p99']:.1f} ms > {SLA_FACTOR}x {b['ttft_p99']:.1f}")
        if c["tpot_p99"] > SLA_FACTOR * b["tpot_p99"]:
            violations.append(f"TPOT P99 {c['tpot_p99']:.2f} ms > {SLA_FACTOR}x {b['tpot_p99']:.2f}")
        if global_bad:
            violations.append(global_bad)
        out[tier] = {
            "r": r,
            "raw": raw,
            "score": 0.0 if violations else raw,
            "sla_ok": not violations,
            "violations": violations,
        }
    return out


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]."""
    if not values:
        raise ValueError("percentile of an empty list")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
