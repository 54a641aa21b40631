#!/usr/bin/env python3
"""Run a plan of GPU jobs in one device call: one lane per GPU, a shared deadline, everything packed into $OUT.

A device call costs its machine's start and is limited to 10 minutes, so a call should carry as much work as it
can: on a 2-GPU box, two one-GPU jobs at once. The plan is a text file, one job per line:

    # GPUS  NAME          COMMAND (bash)
    0,1     prepare       bash ci/gpu/run.sh prepare
    0       kv-tests      VARIANT=full bash ci/gpu/run.sh pytest tests/gpu/test_kv_quant_gpu.py -rA
    1       contest       bash ci/gpu/run.sh python -m bench.serve_bench --variants base,full --deadline-s $LEFT_S

Jobs of one GPU run in file order; GPUs run side by side. A job on several GPUs ("0,1") waits until those
lanes are idle and holds them while it runs. Each job gets CUDA_VISIBLE_DEVICES, OUT=<res>/<name> (results
folders never collide), BENCH_WORK=<work>/<name>, and LEFT_S (seconds to the deadline, minus a margin
for packing, when it starts); it is stopped (its process group killed) at the deadline, and a job whose lane
reaches it with under 20 s left is skipped. Logs: <res>/<name>.log. At the end the results folder is packed
into $OUT/results.tgz, the summary is written to $OUT/summary.md and printed last. The machine's Triton
autotuning results go into results.tgz too (triton-autotune/, ci/gpu/autotune_cache.py): unpacked into .gpu/ and
carried, they spare the next fresh machine the sweeps (`tar xzf results.tgz -C .gpu triton-autotune`).

    python ci/gpu/jobs.py PLAN [--deadline-s 560] [--res DIR] [--work DIR] [--dry-run]

--res and --work default to jobs-res/ and jobs-work/ in the system's temporary folder (tempfile.gettempdir()).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MIN_START_S = 20.0
PACK_MARGIN_S = 15.0
TMP = Path(tempfile.gettempdir())
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class PlanError(Exception):
    pass


@dataclass
class Job:
    gpus: tuple[int, ...]
    name: str
    command: str
    line: int
    status: str = "pending"
    rc: int | None = None
    wall_s: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)


def parse_plan(text: str) -> list[Job]:
    jobs, names = [], set()
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 2)
        if len(parts) < 3:
            raise PlanError(f"plan line {i}: expected 'GPUS NAME COMMAND', got {raw!r}")
        gpus_s, name, command = parts
        try:
            gpus = tuple(sorted({int(g) for g in gpus_s.split(",")}))
        except ValueError:
            raise PlanError(f"plan line {i}: GPUS must be like 0 or 0,1, got {gpus_s!r}") from None
        if any(g < 0 for g in gpus):
            raise PlanError(f"plan line {i}: GPU numbers start at 0, got {gpus_s!r}")
        if not NAME_RE.match(name):
            raise PlanError(f"plan line {i}: job name {name!r} must be letters, digits, '.', '_' or '-'")
        if name in names:
            raise PlanError(f"plan line {i}: job name {name!r} used twice")
        names.add(name)
        jobs.append(Job(gpus, name, command, i))
    if not jobs:
        raise PlanError("the plan has no jobs")
    return jobs


def lane_order(jobs: list[Job]) -> dict[int, list[Job]]:
    """Per GPU, the jobs that use it, in plan order."""
    lanes: dict[int, list[Job]] = {}
    for job in jobs:
        for g in job.gpus:
            lanes.setdefault(g, []).append(job)
    return lanes


class Runner:
    def __init__(self, jobs: list[Job], res: Path, deadline: float, log=print, work: Path = TMP / "jobs-work"):
        self.jobs, self.res, self.deadline, self.log, self.work = jobs, res, deadline, log, work
        self.lanes = lane_order(jobs)
        self.t0 = time.monotonic()
        # (job, GPU) -> set when that GPU's lane reaches a multi-GPU job it does not lead
        self._reached = {(j.name, g): threading.Event() for j in jobs for g in j.gpus[1:]}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def _stamp(self, msg: str) -> None:
        e = int(time.monotonic() - self.t0)
        self.log(f"[jobs +{e // 60:02d}:{e % 60:02d}] {msg}")

    def run_job(self, job: Job) -> None:
        left = self.left()
        if left < MIN_START_S:
            job.status = "skipped (deadline)"
            self._stamp(f"skip {job.name}: {left:.0f} s left")
            return
        out = self.res / job.name
        out.mkdir(parents=True, exist_ok=True)
        work = self.work / job.name
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(map(str, job.gpus)), OUT=str(out),
                   BENCH_WORK=str(work), LEFT_S=str(int(max(0.0, left - PACK_MARGIN_S))))
        self._stamp(f"start {job.name} on GPU {','.join(map(str, job.gpus))}: {job.command}")
        t = time.monotonic()
        with open(self.res / f"{job.name}.log", "wb") as logf:
            proc = subprocess.Popen(["bash", "-c", job.command], cwd=str(REPO), env=env, stdout=logf,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                job.rc = proc.wait(timeout=max(1.0, left))
                job.status = "ok" if job.rc == 0 else "failed"
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                job.rc, job.status = proc.returncode, "stopped at the deadline"
        job.wall_s = time.monotonic() - t
        self._stamp(f"end {job.name}: {job.status} (rc {job.rc}, {job.wall_s:.0f} s)")

    def lane(self, gpu: int) -> None:
        for job in self.lanes[gpu]:
            others = [g for g in job.gpus if g != gpu]
            if not others:
                self.run_job(job)
            elif gpu == job.gpus[0]:
                # the first GPU of a multi-GPU job runs it once every other lane has reached it
                for g in others:
                    self._reached[(job.name, g)].wait()
                self.run_job(job)
                job.done.set()
            else:
                self._reached[(job.name, gpu)].set()
                job.done.wait()

    def run(self) -> None:
        threads = [threading.Thread(target=self.lane, args=(g,), daemon=True) for g in sorted(self.lanes)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()


def summary_md(jobs: list[Job], plan: str, elapsed: float) -> str:
    lines = [f"# GPU jobs: {plan}", "", f"{len(jobs)} jobs, {elapsed:.0f} s", "",
             "| job | GPUs | status | rc | wall s | command |", "|---|---|---|---:|---:|---|"]
    for j in jobs:
        cmd = j.command.replace("|", "\\|")
        lines.append(f"| {j.name} | {','.join(map(str, j.gpus))} | {j.status} | "
                     f"{'' if j.rc is None else j.rc} | {j.wall_s:.0f} | `{cmd}` |")
    return "\n".join(lines) + "\n"


def pack(res: Path, out: Path) -> Path:
    """res -> out/results.tgz, written under a temporary name and renamed."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".results.tgz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        for p in sorted(res.iterdir()):
            tar.add(p, arcname=p.name)
    final = out / "results.tgz"
    os.replace(tmp, final)
    return final


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plan")
    ap.add_argument("--deadline-s", type=float, default=560.0, help="seconds from now until every job is stopped")
    ap.add_argument("--res", default=str(TMP / "jobs-res"), help="results folder (emptied first; default %(default)s)")
    ap.add_argument("--work", default=str(TMP / "jobs-work"),
                    help="scratch folders, one per job, given to it as BENCH_WORK (default %(default)s)")
    ap.add_argument("--dry-run", action="store_true", help="print the lanes, run nothing")
    a = ap.parse_args(argv)
    try:
        text = Path(a.plan).read_text()
    except OSError as e:
        raise PlanError(f"cannot read plan {a.plan}: {e.strerror}") from None
    jobs = parse_plan(text)
    if a.deadline_s <= MIN_START_S + PACK_MARGIN_S:
        raise PlanError(f"--deadline-s must be more than {MIN_START_S + PACK_MARGIN_S:.0f}")
    if a.dry_run:
        for g, lane in sorted(lane_order(jobs).items()):
            print(f"GPU {g}: " + " -> ".join(j.name for j in lane))
        return 0
    res = Path(a.res)
    if res.exists():
        shutil.rmtree(res)
    res.mkdir(parents=True)
    t0 = time.monotonic()
    runner = Runner(jobs, res, t0 + a.deadline_s - PACK_MARGIN_S, work=Path(a.work))
    runner.run()
    # the Triton autotuning results of this machine, for the next call's prepare (ci/gpu/autotune_cache.py)
    saved = subprocess.run([sys.executable, str(Path(__file__).with_name("autotune_cache.py")), "save",
                            str(res / "triton-autotune")], capture_output=True, text=True)
    md = summary_md(jobs, a.plan, time.monotonic() - t0)
    if saved.stdout.strip():
        md += f"\n{saved.stdout.strip()}\n"
    (res / "summary.md").write_text(md)
    out = os.environ.get("OUT")
    if out:
        pack(res, Path(out))
        (Path(out) / "summary.md").write_text(md)
    print("\n" + md, flush=True)
    return 0 if all(j.status == "ok" for j in jobs) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except PlanError as e:
        print(f"jobs: error: {e}", file=sys.stderr)
        sys.exit(2)
