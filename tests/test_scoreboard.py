"""bench.scoreboard: the plans' serve steps run against the fake harness and collected; the score with its 1.5x
gates; the README's headline block held equal to the latest scoreboard JSON (SCOREBOARD.md names it)."""
import copy
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tarfile

import pytest

from bench import scoreboard, scoreboard_data, scoreboard_render
from bench.score import TIER_MAX

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE_HARNESS = os.path.join(REPO, "tests", "data", "fake_harness.py")
RESULTS = os.path.join(REPO, "bench", "results")


def plan_line(plan: str, job: str) -> list[str]:
    """The `python -m bench.serve_bench ...` arguments of one job of a scoreboard plan."""
    with open(os.path.join(REPO, "ci", "gpu", "plans", plan)) as f:
        for line in f:
            parts = line.split(None, 2)
            if len(parts) == 3 and not line.startswith("#") and parts[1] == job:
                words = shlex.split(parts[2])
                return words[words.index("bench.serve_bench") + 1:]
    raise AssertionError(f"{plan} has no job {job}")


def run_step(args: list[str], out, tmp_path):
    """One plan step against the fake vllm: variant base -> the fake harness's baseline, $LEFT_S -> 400."""
    args = [{"$LEFT_S": "400"}.get(a, a) for a in args]
    for flag in ("--variants", "--baseline"):
        i = args.index(flag)
        args[i + 1] = ",".join("baseline" if v == "base" else v for v in args[i + 1].split(","))
    env = dict(os.environ, VLLM_DCU_BENCH_HARNESS=FAKE_HARNESS, OUT=str(out))
    p = subprocess.run([sys.executable, "-m", "bench.serve_bench", "--work", str(tmp_path / "work"), "--gpu", "test",
                        *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return out


def sb_main(*args, **kw):
    return subprocess.run([sys.executable, "-m", "bench.scoreboard", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300, **kw)


def test_the_plans_run_on_fake_servers_and_collect_pools_them_baseline_first_and_last(tmp_path):
    a = plan_line("scoreboard-1.jobs", "contest-a")
    b = plan_line("scoreboard-2.jobs", "contest-b")
    assert a[a.index("--mode") + 1] == "graph" and b[b.index("--mode") + 1] == "graph"  # start_vllm.sh's mode
    assert int(a[a.index("--requests") + 1]) >= 10 and a[a.index("--output-len") + 1] == "250"
    call1 = run_step(a, tmp_path / "call1" / "res", tmp_path)
    call2 = run_step(b, tmp_path / "call2" / "res", tmp_path)
    with tarfile.open(tmp_path / "call1" / "results.tgz", "w:gz") as tar:  # as ci/gpu/jobs.py packs a call
        tar.add(call1, arcname="contest-a")
    res = tmp_path / "results"
    p = sb_main("--collect", str(tmp_path / "call1" / "results.tgz"), str(call2), "--commit", "abc1234",
                "--results", str(res))
    assert p.returncode == 0, p.stderr
    stem = next(f[:-5] for f in os.listdir(res / "scoreboard") if f.endswith(".json"))
    assert stem.endswith("-abc1234")
    sb = json.load(open(res / "scoreboard" / f"{stem}.json"))
    c = sb["contest"]
    assert c["order"] == ["baseline", "full", "full", "baseline"] and c["baseline_first_and_last"]
    assert c["mode"] == "graph" and c["requests_per_tier"] == 10 and sb["notes"] == []
    assert set(sb["missing"]) == {"e2e", "kv8_load", "robustness", "l64"}
    for t in TIER_MAX:
        row = c["tiers"][t]
        assert row["base"]["runs"] == 2 and row["full"]["runs"] == 2 and row["full"]["completed"] == 20
        assert len(row["step_ratios"]["tok_s"]) == 2  # one ratio per call: the spread
        assert row["ratio"]["tok_s"] == pytest.approx(1.25, rel=0.1)  # the fake full build is 1.25x as fast
        r = row["ratio"]["tok_s"] - 1
        assert c["score"]["tiers"][t]["score"] == pytest.approx(TIER_MAX[t] * (0.6 + 0.4 * (1 - math.exp(-1.3 * r))))
    assert c["score"]["all_gates_ok"] and c["score"]["base_total"] == pytest.approx(60.0)
    md = (res / "SCOREBOARD.md").read_text()
    assert f"JSON: `scoreboard/{stem}.json`" in md and "| 4-8K | full | 2 |" in md
    assert all((res / "scoreboard" / f"{stem}-{t}.png").stat().st_size > 1000 for t in TIER_MAX)
    assert f"![16-32K](scoreboard/{stem}-16-32K.png)" in md
    assert "**The whole series" in md.split("README's headline")[1]


def tier_row(tok, ttft, tpot, tpots):
    return {"tok_s": tok, "ttft_p99": ttft, "tpot_p99": tpot, "tpot_ms": tpots}


def test_score_gates_zero_a_tier_over_1_5x_ttft_and_every_tier_over_1_5x_global_tpot():
    def tiers(cand_ttft_16k, cand_tpot):
        out = {}
        for t in TIER_MAX:
            out[t] = {"base": tier_row(100.0, 1000.0, 5.0, [5.0] * 10),
                      "full": tier_row(120.0, cand_ttft_16k if t == "16-32K" else 900.0, cand_tpot,
                                       [cand_tpot] * 10)}
            out[t]["ratio"] = {k: out[t]["full"][k] / out[t]["base"][k] for k in ("tok_s", "ttft_p99", "tpot_p99")}
        return out

    ok = scoreboard_data.contest_score(tiers(1400.0, 5.5))
    assert ok["all_gates_ok"] and ok["total"] == pytest.approx(sum(
        m * (0.6 + 0.4 * (1 - math.exp(-1.3 * 0.2))) for m in TIER_MAX.values()))
    ttft = scoreboard_data.contest_score(tiers(1600.0, 5.5))  # 1.6x the baseline's TTFT P99 at 16-32K
    assert ttft["tiers"]["16-32K"]["score"] == 0 and not ttft["gates"]["ttft_p99"]["16-32K"]["ok"]
    assert ttft["tiers"]["4-8K"]["score"] > 0 and not ttft["all_gates_ok"]
    tpot = scoreboard_data.contest_score(tiers(1400.0, 8.0))  # 1.6x the global TPOT P99
    assert tpot["total"] == 0 and not tpot["gates"]["global_tpot_p99"]["ok"]
    assert tpot["gates"]["global_tpot_p99"]["ratio"] == pytest.approx(1.6)


def test_readme_headline_is_the_latest_scoreboards():
    """One number per claim: README's generated block equals what the JSON SCOREBOARD.md names renders to."""
    sb = scoreboard.load_latest(RESULTS)
    readme = open(os.path.join(REPO, "README.md")).read()
    block = scoreboard_render.readme_headline(readme)
    assert block is not None, "README lost its <!-- scoreboard:headline --> block"
    assert block == scoreboard_render.headline(sb), "run python -m bench.scoreboard --readme"
    shown = re.search(r"output tok/s \*\*([\d. /]+)x\*\*", block).group(1).split(" / ")
    assert [float(x) for x in shown] == [round(x, 3) for x in sb["headline"]["tok_s"]]
    ttft = re.search(r"TTFT P99 ([\d. /]+)x", block).group(1).split(" / ")
    assert [float(x) for x in ttft] == [round(x, 3) for x in sb["headline"]["ttft_p99"]]
    if sb["label"] and sb["label"].startswith("legacy"):  # the seed says what it is, in the JSON, md and README
        assert "3 requests per tier" in sb["label"] and sb["label"] in block
        assert sb["label"] in open(os.path.join(RESULTS, "SCOREBOARD.md")).read()


def test_readme_mode_rewrites_the_block_and_check_fails_on_a_drifted_number(tmp_path):
    readme = tmp_path / "README.md"
    text = open(os.path.join(REPO, "README.md")).read()
    block = scoreboard_render.readme_headline(text)
    drifted = text.replace(block, block.replace("**1.", "**9.", 1))
    readme.write_text(drifted)
    p = sb_main("--check", "--readme-file", str(readme))
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and p.stderr.startswith("error: README's headline")
    p = sb_main("--readme", "--readme-file", str(readme))
    assert p.returncode == 0 and readme.read_text() == text
    assert sb_main("--check", "--readme-file", str(readme)).returncode == 0


@pytest.mark.parametrize("make, message", [
    (lambda d: str(d / "nope"), "error: no such file or folder: "),
    (lambda d: (d / "x.json").write_text("{") and str(d / "x.json"), "error: cannot read "),
    (lambda d: (d / "y.json").write_text('{"results": [], "out_tokens": 1}') and str(d / "y.json"),
     "error: no contest serve step among the inputs"),
])
def test_bad_input_gives_one_error_line(tmp_path, make, message):
    p = sb_main("--collect", make(tmp_path), "--commit", "abc1234", "--results", str(tmp_path / "r"))
    assert p.returncode == 2 and p.stderr.startswith(message) and p.stderr.count("\n") == 1
    assert not (tmp_path / "r").exists()  # nothing written


def test_steps_comparing_other_builds_are_refused():
    doc = json.load(open(os.path.join(RESULTS, "2026-12-02-h200-serve-contest-baseline-repeated.json")))
    other = copy.deepcopy(doc)
    for r in other["runs"] + other["plan"]:
        r["variant"] = {"full": "no0006"}.get(r["variant"], r["variant"])
    with pytest.raises(scoreboard_data.ScoreboardError, match="compares no0006 with base"):
        scoreboard_data.serve_steps([{"doc": doc}, {"doc": other}])
