"""bench/sched_sim.py's command line (`python -m bench.sched_sim`): bad input fails with one line; a replayed GPU
run writes its tables."""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sim(*args, tmp_path):
    # the patched test tree is first on PYTHONPATH (ci/run_tests.sh), so the command imports it
    return subprocess.run([sys.executable, "-m", "bench.sched_sim", "--out", str(tmp_path), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("args, message", [
    (["--scenario", "mi300"], "unknown scenario mi300; supported: dcu64-16-32K, dcu64-8-16K"),
    (["--rates", "0,0.5"], "--rates must be positive numbers"),
    (["--targets", "off,-3"], "--targets must be 'off' or numbers > 0"),
    (["--cap-when", "sometimes"], "--cap-when must list kv-pressure and/or always"),
    (["--rates", "", "--replay", "nope.json"], "No such file or directory"),
])
def test_bad_input_fails_with_one_line(args, message, tmp_path):
    p = sim(*args, tmp_path=tmp_path)
    assert p.returncode == 2
    err = [line for line in p.stderr.splitlines() if line.startswith("sched_sim: error:")]
    assert len(err) == 1 and message in err[0], p.stderr
    assert os.listdir(tmp_path) == []


def test_replay_of_a_gpu_run_writes_json_and_tables_against_the_upstream_scheduler(tmp_path):
    raw = tmp_path / "raw.json"  # three overlapping 16-32K requests, as `vllm bench serve --save-detailed` saves
    raw.write_text(json.dumps({"start_times": [100.0, 101.0, 101.5], "input_lens": [20000, 18000, 17000],
                               "output_lens": [40, 40, 40]}))
    out = tmp_path / "out"
    out.mkdir()
    p = sim("--rates", "", "--targets", "60", "--cap-when", "always,kv-pressure", "--replay", str(raw),
            "--what", "t", tmp_path=out)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads((out / [f for f in os.listdir(out) if f.endswith("-cpu-sched-sim-t.json")][0]).read_text())
    rows = {(r["target_ms"], r["cap_when"]): r["summary"] for r in doc["results"]}
    # the upstream scheduler is always the reference row
    assert set(rows) == {(None, None), (60.0, "always"), (60.0, "kv-pressure")}
    off, always, gated = rows[None, None], rows[60.0, "always"], rows[60.0, "kv-pressure"]
    assert off["completed"] == always["completed"] == gated["completed"] == 3
    assert always["itl_p99_ms"] < off["itl_p99_ms"]  # the cap in every step bounds the steps with decodes
    assert gated == off  # three prompts fit the cache with room: the gate leaves upstream's schedule
    md = (out / [f for f in os.listdir(out) if f.endswith(".md")][0]).read_text()
    assert md.startswith("# Scheduler simulation: dcu64-16-32K") and "A simulation, not a measurement" in md
    assert "| upstream (off) |" in md and "| target 60 ms, cap always |" in md
    assert "| target 60 ms, cap kv-pressure |" in md
