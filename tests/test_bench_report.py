"""Report generator (bench/report.py) on canned results (tests/data/bench_step_fixture.json)."""
import copy
import json
import os
import subprocess
import sys

import pytest

from bench.report import render_markdown, section_scores, sections, write_report

FIXTURE = os.path.join(os.path.dirname(__file__), "data", "bench_step_fixture.json")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def doc():
    with open(FIXTURE) as f:
        return json.load(f)


def _row(md, section_title, build):
    part = md.split(section_title, 1)[1]
    return next(line for line in part.splitlines() if line.startswith(f"| {build} "))


def test_report_starts_with_the_exact_command(doc):
    md = render_markdown([doc])
    lines = md.splitlines()
    assert lines[0] == "# Serving benchmark: 2026-11-30-h200-fixture"
    assert lines[2] == f"Command: `{doc['command']}`"


def test_baseline_is_the_mean_of_its_first_and_last_run_and_builds_are_ratios_to_it(doc):
    md = render_markdown([doc])
    base = _row(md, "### 4-8K", "base (baseline)").split("|")
    assert base[2].strip() == "2" and base[3].strip() == "100.0" and base[4].strip() == "1.000"  # (98 + 102) / 2
    p1 = _row(md, "### 4-8K", "p1").split("|")
    assert p1[3].strip() == "125.0" and p1[4].strip() == "1.250" and p1[7].strip() == "0.900"


def test_score_terms_per_build_with_sla_zeroing(doc):
    md = render_markdown([doc])
    assert _row(md, "### Score terms", "base (baseline)").split("|")[5].strip() == "60.00"
    assert _row(md, "### Score terms", "p1").split("|")[5].strip() == "71.10"  # 100 * f(0.25)
    p2 = _row(md, "### Score terms", "p2").split("|")
    assert p2[2].strip() == "0 (was 15.82)"  # 4-8K: +50% tok/s but TTFT P99 800 > 1.5 x 500
    assert p2[5].strip() == "50.44"  # 50 * f(0.1) + 30 * f(0)
    assert "4-8K TTFT P99 800.0 ms > 1.5x 500.0" in p2[6]


def test_baseline_spread_is_reported_per_tier(doc):
    md = render_markdown([doc])
    spread = md.split("### Baseline spread", 1)[1]
    row = next(line for line in spread.splitlines() if line.startswith("| 4-8K "))
    assert row.split("|")[3].strip() == "4.0%"  # (102 - 98) / 100
    row = next(line for line in spread.splitlines() if line.startswith("| 8-16K "))
    assert row.split("|")[3].strip() == "0.0%"


def test_global_tpot_from_pooled_requests_zeroes_all_tiers_when_it_regresses(doc):
    slow = copy.deepcopy(doc)
    for r in slow["runs"]:
        if r["variant"] == "p1":
            r["per_request"]["tpot_ms"] = [9.0, 9.0]  # per tier P99 untouched, pooled P99 1.8x
    scores = section_scores(sections([slow])[0])
    assert all(x["score"] == 0 for x in scores["p1"].values())
    assert all(x["score"] > 0 for x in scores["base"].values())


def test_each_step_is_compared_with_its_own_baseline(doc, tmp_path):
    other = copy.deepcopy(doc)
    other["stem"] = "2026-11-30-h200-fixture-step2"
    for r in other["runs"]:
        r["bench"]["output_throughput"] *= 2  # a faster machine: every build doubles
    p2 = tmp_path / "step2.json"
    p2.write_text(json.dumps(other))
    md_path, png_path = write_report([FIXTURE, str(p2)], str(tmp_path / "merged"))
    md = open(md_path).read()
    assert md.count("## contest protocol") == 2
    step2 = md.split("(2026-11-30-h200-fixture-step2)", 1)[1]
    assert _row(step2, "### 4-8K", "p1").split("|")[4].strip() == "1.250"  # ratio unchanged
    assert _row(step2, "### 4-8K", "p1").split("|")[3].strip() == "250.0"


def test_plot_is_a_png_and_failed_builds_appear_as_failed(doc, tmp_path):
    d = copy.deepcopy(doc)
    d["plan"].insert(3, {"variant": "p3", "repeat": 0})
    d["runs"].append({"variant": "p3", "repeat": 0, "order": 3, "profile": "h200", "protocol": None,
                      "tier": None, "error": "server exited with status 1 while starting: ImportError: x"})
    src = tmp_path / "d.json"
    src.write_text(json.dumps(d))
    md_path, png_path = write_report([str(src)])
    assert md_path == str(tmp_path / "d.md") and png_path == str(tmp_path / "d.png")
    with open(png_path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    md = open(md_path).read()
    assert "| p3 | 0 | failed: server exited with status 1 while starting: ImportError: x |" in md
    assert "p3 failed to serve" in md


def test_report_cli_rejects_a_file_that_is_not_a_result(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"foo": 1}')
    p = subprocess.run([sys.executable, "-m", "bench.report", str(bad)], capture_output=True, text=True,
                       cwd=REPO)
    assert p.returncode == 2
    assert p.stderr.strip() == f"report: error: {bad} is not a serve_bench result (no 'runs'/'baseline')"


def test_load_sections_add_stalls_whole_request_latency_and_server_counters(doc):
    load = copy.deepcopy(doc)
    for r in load["runs"]:
        if r.get("protocol"):
            r["protocol"] = "load"
            r["bench"]["p99_itl_ms"] = 250.0 if r["variant"] == "base" else 60.0
            r["server_counters"] = {"preemptions": 2 if r["variant"] == "base" else 0, "prompt_tokens": 5000,
                                    "prefix_cache_queries": 5000, "prefix_cache_hits": 1000}
    md = render_markdown([load])
    assert "| build | ITL P99 ms | E2E P99 ms | TTFT mean ms | preemptions | prompt tokens | prefix-cache hits |" in md
    part = md.split("### 4-8K", 1)[1].split("| build | ITL P99", 1)[1]
    base = next(line for line in part.splitlines() if line.startswith("| base (baseline) ")).split("|")
    assert base[2].strip() == "250.0" and base[5].strip() == "4" and base[7].strip() == "20.0%"  # two runs summed
    p1 = next(line for line in part.splitlines() if line.startswith("| p1 ")).split("|")
    assert p1[2].strip() == "60.0" and p1[5].strip() == "0"
    assert "ITL P99" not in render_markdown([doc])  # contest sections keep one table per tier


def test_setup_lists_each_builds_extra_server_env(doc):
    doc = copy.deepcopy(doc)
    doc["variant_env"] = {"full": {"FOO": "1", "BAR": "x y"}}
    md = render_markdown([doc])
    setup = md.split("## Setup", 1)[1]
    assert "- extra env for full: `FOO=1 'BAR=x y'`" in setup
    assert "extra env for" not in render_markdown([dict(doc, variant_env={})])
