"""Contest score terms (bench/score.py): formula values and the SLA zeroing rules."""
import math

import numpy as np
import pytest

from bench.score import TIER_MAX, percentile, score_terms, tier_score


def _f(r):
    return 0.6 + 0.4 * (1 - math.exp(-1.3 * r))


def test_tier_score_gives_60_percent_of_each_bucket_at_no_gain():
    assert [tier_score(m, 0.0) for m in TIER_MAX.values()] == pytest.approx([12.0, 30.0, 18.0])


def test_tier_score_known_values():
    # r = +100%: 0.6 + 0.4 * (1 - e^-1.3) = 0.890987...
    assert tier_score(20, 1.0) == pytest.approx(17.819746, abs=1e-5)
    assert tier_score(50, 0.25) == pytest.approx(35.549453, abs=1e-5)
    assert tier_score(30, 10.0) == pytest.approx(30.0, abs=1e-4)  # saturates at the bucket maximum
    assert tier_score(20, -0.1) < 12.0  # a slowdown scores below the 60% floor, as the formula says


def _m(tok, ttft, tpot):
    return {"tok_s": tok, "ttft_p99": ttft, "tpot_p99": tpot}


BASE = {"4-8K": _m(100, 500, 5.0), "8-16K": _m(80, 1000, 5.0), "16-32K": _m(50, 2000, 5.0)}


def test_score_terms_sum_matches_formula_for_uniform_gain():
    cand = {t: _m(m["tok_s"] * 1.25, m["ttft_p99"], m["tpot_p99"]) for t, m in BASE.items()}
    terms = score_terms(BASE, cand)
    assert [round(x["r"], 6) for x in terms.values()] == [0.25, 0.25, 0.25]
    assert sum(x["score"] for x in terms.values()) == pytest.approx(100 * _f(0.25))
    assert all(x["sla_ok"] for x in terms.values())


def test_score_zeroes_only_the_tier_whose_ttft_p99_exceeds_1_5x_baseline():
    cand = dict(BASE)
    cand["8-16K"] = _m(160, 1500.01, 5.0)  # twice the tok/s but TTFT P99 just over 1.5x
    cand["4-8K"] = _m(100, 750.0, 5.0)  # exactly 1.5x is allowed
    terms = score_terms(BASE, cand)
    assert terms["8-16K"]["score"] == 0.0 and not terms["8-16K"]["sla_ok"]
    assert terms["8-16K"]["raw"] == pytest.approx(50 * _f(1.0))
    assert "TTFT" in terms["8-16K"]["violations"][0]
    assert terms["4-8K"]["score"] == pytest.approx(12.0)
    assert terms["16-32K"]["score"] == pytest.approx(18.0)


def test_score_zeroes_tier_whose_tpot_p99_exceeds_1_5x_baseline():
    cand = dict(BASE, **{"16-32K": _m(60, 2000, 7.6)})
    terms = score_terms(BASE, cand)
    assert terms["16-32K"]["score"] == 0.0
    assert "TPOT" in terms["16-32K"]["violations"][0]
    assert terms["4-8K"]["sla_ok"] and terms["8-16K"]["sla_ok"]


def test_global_tpot_p99_violation_zeroes_every_tier():
    cand = {t: _m(m["tok_s"] * 2, m["ttft_p99"], m["tpot_p99"]) for t, m in BASE.items()}
    terms = score_terms(BASE, cand, global_tpot_p99=(5.0, 7.6))
    assert all(x["score"] == 0.0 for x in terms.values())
    assert all(any("global" in v for v in x["violations"]) for x in terms.values())
    ok = score_terms(BASE, cand, global_tpot_p99=(5.0, 7.4))
    assert all(x["sla_ok"] for x in ok.values())


def test_score_terms_covers_only_tiers_present_in_both():
    terms = score_terms({"8-16K": BASE["8-16K"]}, {"8-16K": BASE["8-16K"], "4-8K": BASE["4-8K"]})
    assert list(terms) == ["8-16K"]


def test_score_terms_rejects_a_baseline_without_throughput():
    with pytest.raises(ValueError, match="baseline output tok/s"):
        score_terms({"4-8K": _m(0, 1, 1)}, {"4-8K": _m(1, 1, 1)})


def test_percentile_matches_numpy_linear_interpolation():
    rng = np.random.default_rng(0)
    xs = list(rng.exponential(5.0, size=37))
    for q in (0, 50, 95, 99, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
