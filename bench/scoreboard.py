"""One scoreboard for HEAD: its build against 0.18.1 on the GPU, and the only numbers the README's headline quotes.

  python -m bench.scoreboard                     the steps: build, bundle, the three device calls, collect
  python -m bench.scoreboard --collect PATH...   read the calls' results (each call's folder with results.tgz,
                                                 a results.tgz, a folder or a result JSON) and write
                                                 bench/results/scoreboard/<date>-<commit>.{json,md} + one PNG per
                                                 tier, then bench/results/SCOREBOARD.md (the latest)
  python -m bench.scoreboard --readme            rewrite README's <!-- scoreboard:headline --> block from the JSON
                                                 that SCOREBOARD.md names
  python -m bench.scoreboard --check             exit 1 when README's block is not what --readme would write

The device calls run the plans ci/gpu/plans/scoreboard-{1,2,3}.jobs (their headers: order, estimates, what to
carry, how to resume); each call's results.tgz holds what it finished, and --collect takes any subset: a part
that did not run is listed as owed. Scoring: bench/score.py (the contest's formula with its 1.5x gates); pooling
and the parts: bench/scoreboard_data.py; tables, plots and the headline: bench/scoreboard_render.py.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from bench.scoreboard_data import TIERS, ScoreboardError, build, load_inputs
from bench.scoreboard_render import headline, markdown, plot_tier, readme_headline, replace_headline
from kernels.results_io import write_text

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLANS = [f"ci/gpu/plans/scoreboard-{i}.jobs" for i in (1, 2, 3)]
DEVICE_CMD = "python3 ci/gpu/jobs.py {plan} --deadline-s 570"
STEPS = """Scoreboard for HEAD (one nvidia-h200, three device calls of at most 10 minutes):

  ./build.sh --without 0001,0002,0003,0004,0006,0007,0008,0009 --dist dist/base   # 0.18.1 + inert packages
  ./build.sh                                                                      # HEAD's build
  rm -rf .bundle && python -m ci.gpu.bundle --wheel dist/base/*.whl dist/vllm-*.whl dist/vllm-*.whl \\
      --name base --name full --name full8
  mkdir -p .gpu && tar xzf bench/results/raw/2026-12-04-session20/call4/results.tgz -C .gpu triton-autotune
  (after each call: tar xzf <its files_at>/results.tgz -C .gpu triton-autotune)

{calls}
  python -m bench.scoreboard --collect <call 1 files> <call 2 files> <call 3 files>
  python -m bench.scoreboard --readme && ci/run_tests.sh -q tests/test_scoreboard.py
"""


def plan_text() -> str:
    calls = "\n".join(f"  call {i}: device run (kind nvidia-h200, carry [\".bundle\", \".gpu\"]):\n"
                      f"          {DEVICE_CMD.format(plan=p)}" for i, p in enumerate(PLANS, 1))
    return STEPS.format(calls=calls)


def git_commit() -> str:
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        raise ScoreboardError("cannot read HEAD's commit; give --commit") from None


def latest_json(results: str) -> str:
    """The scoreboard JSON that results/SCOREBOARD.md names on its `JSON:` line."""
    md = os.path.join(results, "SCOREBOARD.md")
    try:
        with open(md) as f:
            text = f.read()
    except OSError:
        raise ScoreboardError(f"no {os.path.relpath(md, REPO)}; run --collect first") from None
    for line in text.splitlines():
        if line.startswith("JSON: `"):
            return os.path.join(results, line.split("`")[1])
    raise ScoreboardError(f"{os.path.relpath(md, REPO)} names no `JSON:` source")


def load_latest(results: str) -> dict:
    path = latest_json(results)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ScoreboardError(f"cannot read {os.path.relpath(path, REPO)}: {e}") from None


def collect(paths: list[str], results: str, commit: str | None, date: str | None, label: str | None) -> str:
    with tempfile.TemporaryDirectory(prefix="scoreboard-") as scratch:
        sb = build(load_inputs(paths, scratch), commit or git_commit(), date, label)
    stem = f"{sb['date']}-{sb['commit']}"
    folder = os.path.join(results, "scoreboard")
    os.makedirs(folder, exist_ok=True)
    for t in TIERS:
        if t in sb["contest"]["tiers"]:
            plot_tier(sb, t, os.path.join(folder, f"{stem}-{t}.png"))
    write_text(os.path.join(folder, f"{stem}.json"), json.dumps(sb, indent=1) + "\n")
    write_text(os.path.join(folder, f"{stem}.md"), markdown(sb, f"{stem}-"))
    title, rest = markdown(sb, f"scoreboard/{stem}-").split("\n", 1)
    latest = f"{title}\n\nJSON: `scoreboard/{stem}.json` (the latest; every scoreboard is kept in `scoreboard/`)\n{rest}"
    write_text(os.path.join(results, "SCOREBOARD.md"), latest)
    return stem


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--collect", nargs="+", metavar="PATH", help="the device calls' results to read")
    g.add_argument("--readme", action="store_true", help="rewrite README's headline block from the latest JSON")
    g.add_argument("--check", action="store_true", help="exit 1 when README's headline block is out of date")
    ap.add_argument("--commit", help="the measured commit (default: HEAD, short)")
    ap.add_argument("--date", help="the measurement's date (default: the contest step's)")
    ap.add_argument("--label", help="a note shown with every number (e.g. that the data predate the protocol)")
    ap.add_argument("--results", default=os.path.join(REPO, "bench", "results"), help=argparse.SUPPRESS)
    ap.add_argument("--readme-file", default=os.path.join(REPO, "README.md"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    try:
        if a.collect:
            stem = collect(a.collect, a.results, a.commit, a.date, a.label)
            print(f"wrote bench/results/scoreboard/{stem}.{{json,md}} and bench/results/SCOREBOARD.md")
            return 0
        if a.readme or a.check:
            block = headline(load_latest(a.results))
            try:
                with open(a.readme_file) as f:
                    text = f.read()
                new = replace_headline(text, block)
            except (OSError, ValueError) as e:
                raise ScoreboardError(str(e)) from None
            if a.check:
                if readme_headline(text) != block:
                    print("error: README's headline block differs from the latest scoreboard; run "
                          "python -m bench.scoreboard --readme", file=sys.stderr)
                    return 1
                return 0
            write_text(a.readme_file, new)
            print("README headline block rewritten" if new != text else "README headline block already current")
            return 0
        print(plan_text(), end="")
        return 0
    except ScoreboardError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
