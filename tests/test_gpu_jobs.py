"""ci/gpu/jobs.py: the plan runner for device calls (lanes per GPU, multi-GPU barriers, deadline, packing)."""
from __future__ import annotations

import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from ci.gpu import jobs

REPO = Path(__file__).resolve().parents[1]


def _run_cli(*args, cwd=REPO, env=None):
    return subprocess.run([sys.executable, "ci/gpu/jobs.py", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.mark.parametrize("plan, why", [
    ("", "no jobs"),
    ("0 a\n", "expected 'GPUS NAME COMMAND'"),
    ("x a true\n", "GPUS must be like 0 or 0,1"),
    ("0 a/b true\n", "job name 'a/b'"),
    ("0 a true\n1 a true\n", "used twice"),
])
def test_bad_plans_fail_with_one_line(tmp_path, plan, why):
    p = tmp_path / "plan"
    p.write_text(plan)
    r = _run_cli(str(p), "--dry-run")
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("jobs: error:") and why in r.stderr, r.stderr


def test_missing_plan_is_one_line(tmp_path):
    r = _run_cli(str(tmp_path / "nope"))
    assert r.returncode == 2 and r.stderr.startswith("jobs: error: cannot read plan")


def test_lanes_run_side_by_side_and_multi_gpu_jobs_wait_for_both(tmp_path, monkeypatch, capsys):
    plan = tmp_path / "plan"
    plan.write_text(
        "# comment\n"
        "0    a    sleep 1.5; echo $CUDA_VISIBLE_DEVICES > $OUT/gpu; date +%s.%N > $OUT/end\n"
        "1    b    sleep 1.5; echo $CUDA_VISIBLE_DEVICES > $OUT/gpu; date +%s.%N > $OUT/end\n"
        "0,1  both date +%s.%N > $OUT/start; echo $CUDA_VISIBLE_DEVICES > $OUT/gpu; echo $LEFT_S > $OUT/left\n"
        "0    fail echo oops; exit 3\n")
    out = tmp_path / "out"
    monkeypatch.setenv("OUT", str(out))
    t = time.monotonic()
    rc = jobs.main([str(plan), "--res", str(tmp_path / "res"), "--deadline-s", "100"])
    wall = time.monotonic() - t
    assert rc == 1  # one job failed
    assert wall < 2.9, f"lanes did not run side by side ({wall:.1f} s)"
    res = tmp_path / "res"
    assert (res / "a" / "gpu").read_text().strip() == "0" and (res / "b" / "gpu").read_text().strip() == "1"
    assert (res / "both" / "gpu").read_text().strip() == "0,1"
    start = float((res / "both" / "start").read_text())
    assert start >= max(float((res / x / "end").read_text()) for x in ("a", "b"))
    assert 0 < int((res / "both" / "left").read_text()) <= 100
    assert (res / "fail.log").read_text().strip() == "oops"
    with tarfile.open(out / "results.tgz") as tar:
        names = set(tar.getnames())
    assert {"a/gpu", "both/gpu", "fail.log", "summary.md"} <= names
    assert not list(out.glob(".*tmp"))
    printed = capsys.readouterr().out
    table = printed[printed.index("# GPU jobs"):]  # the summary comes last
    assert "| fail | 0 | failed | 3 |" in table and "| both | 0,1 | ok | 0 |" in table


def test_deadline_stops_a_job_and_skips_the_rest_of_its_lane(tmp_path, monkeypatch):
    monkeypatch.setattr(jobs, "MIN_START_S", 1.0)
    monkeypatch.setattr(jobs, "PACK_MARGIN_S", 0.5)
    monkeypatch.delenv("OUT", raising=False)
    plan = tmp_path / "plan"
    plan.write_text("0 long sleep 60 & wait\n0 after true\n1 quick true\n")
    t = time.monotonic()
    rc = jobs.main([str(plan), "--res", str(tmp_path / "res"), "--deadline-s", "3"])
    assert time.monotonic() - t < 10
    assert rc == 1
    md = (tmp_path / "res" / "summary.md").read_text()
    assert "| long | 0 | stopped at the deadline |" in md
    assert "| after | 0 | skipped (deadline) |" in md
    assert "| quick | 1 | ok | 0 |" in md


@pytest.mark.parametrize("plan", sorted((REPO / "ci" / "gpu" / "plans").glob("*.jobs")), ids=lambda p: p.name)
def test_committed_plans_parse(plan):
    parsed = jobs.parse_plan(plan.read_text())
    assert parsed and all(len(j.gpus) >= 1 for j in parsed)
    harness = [i for i, j in enumerate(parsed) if "ci/gpu/run.sh" in j.command and j.name != "prepare"]
    if harness:  # harness jobs need the bundle unpacked first, on every GPU they use
        prep = [i for i, j in enumerate(parsed) if j.name == "prepare"]
        assert prep and prep[0] < harness[0]
        first = parsed[harness[0]]
        assert set(first.gpus) <= set(parsed[prep[0]].gpus)


def test_results_io_writes_whole_files_or_nothing(tmp_path):
    from kernels import results_io

    target = tmp_path / "sub" / "r.md"
    results_io.write_text(target, "one\n")
    assert target.read_text() == "one\n"

    class Boom(Exception):
        pass

    class Fig:
        def savefig(self, path, format, **kw):
            with open(path, "w") as f:
                f.write("half")
            raise Boom()

    with pytest.raises(Boom):
        results_io.save_figure(Fig(), tmp_path / "sub" / "p.png", dpi=100)
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["r.md"]  # no temp file, no half figure
