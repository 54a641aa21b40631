"""Scheduler simulator: vLLM's real (patched) V1 scheduler on a simulated clock with a synthetic device.

The scheduler is driven the way EngineCore drives it (schedule -> execute -> update_from_output; with async
scheduling a two-deep batch queue), and each step's time comes from a step-time model of the device instead of a
model run (bench/sched_sim_engine.py; the CPU tests of patch 0004 are built on it). This command line runs
serving scenarios: the upstream scheduler against --scheduler-tpot-target-ms targets, over request rates, on the
KV cache a 64 GB DCU leaves, with a device calibrated to step times measured on the H200. A simulation, not a
measurement: it says what the scheduling policy does; the GPU serving benchmark (bench/serve_bench.py) says
what it is worth.

    python -m bench.sched_sim --scenario dcu64-16-32K --rates 0.25,0.6 --targets off,30,60,120 --seeds 3

Uses the tests' patched tree build/test-tree (built or refreshed on first use, ~20 s; VLLM_DCU_TREE=DIR to choose).
Writes <date>-cpu-sched-sim-<scenario>.{json,md} into --out (bench/results/).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import math
import os
import random
import sys
from pathlib import Path

from bench.sched_sim_scenarios import H200_L16, SCENARIOS

REPO = Path(__file__).resolve().parent.parent
REEXEC = "VLLM_DCU_SCHED_SIM_TREE"  # set in the re-run this module starts, naming the tree it put on PYTHONPATH


def has_patch_0004(vllm_dir: Path) -> bool:
    """Whether the vLLM package at `vllm_dir` carries patch 0004's hooks in its scheduler."""
    scheduler = vllm_dir / "v1" / "core" / "sched" / "scheduler.py"
    return scheduler.is_file() and "tpot_budget" in scheduler.read_text()


def ensure_patched_vllm() -> None:
    """Make sure `import vllm` finds a tree with patch 0004; if the one on the path lacks it (or there is none),
    run this same command again with VLLM_DCU_TREE, else the tests' build/test-tree (built or refreshed by the
    build tool, ~20 s), first on PYTHONPATH. An environment variable, not an edit of sys.path, so that the
    simulator imports exactly one vLLM."""
    spec = importlib.util.find_spec("vllm")
    if spec is not None and spec.submodule_search_locations and has_patch_0004(
            Path(spec.submodule_search_locations[0])):
        return
    if os.environ.get(REEXEC):
        raise SystemExit(f"sched_sim: error: {os.environ[REEXEC]} has no patch 0004 (scheduler hooks)")
    tree = os.environ.get("VLLM_DCU_TREE")
    if not tree:
        from tools.dcubuild import BuildError, testtree

        try:
            tree = str(testtree.prepared_tree())
        except BuildError as e:
            raise SystemExit(f"sched_sim: error: {str(e).splitlines()[0]}") from None
    path = [tree, str(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), **{REEXEC: tree})
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def poisson_items(scenario: str, rate: float, n: int, seed: int) -> list[tuple[float, str, int, int]]:
    _, prompt_range, out_len = SCENARIOS[scenario]
    rng = random.Random(seed)
    t, items = 0.0, []
    for i in range(n):
        items.append((t, f"r{i:03d}", rng.randint(*prompt_range), out_len))
        t += rng.expovariate(rate)
    return items


def replay_items(path: str) -> list[tuple[float, str, int, int]]:
    """Arrival offsets, prompt and output lengths of a `vllm bench serve --save-detailed` result (its raw JSON)."""
    with open(path) as f:
        raw = json.load(f)
    starts, ins, outs = raw.get("start_times"), raw.get("input_lens"), raw.get("output_lens")
    if not (starts and ins and outs and len(starts) == len(ins) == len(outs)):
        raise ValueError(f"{path}: not a --save-detailed result with start_times, input_lens and output_lens")
    t0 = min(starts)
    return sorted((s - t0, f"r{i:03d}", n_in, n_out) for i, (s, n_in, n_out) in enumerate(zip(starts, ins, outs)))


def summarize(runs: list[dict]) -> dict:
    from bench.sched_sim_engine import pct

    def p(key, q, scale=1.0):
        xs = [x for r in runs for x in r[key]]
        return pct(xs, q) * scale if xs else float("nan")
    return {"runs": len(runs), "out_tok_s": sum(r["out_tok_s"] for r in runs) / len(runs),
            "ttft_p50_ms": p("ttft_s", 0.5, 1e3), "ttft_p99_ms": p("ttft_s", 0.99, 1e3),
            "tpot_p50_ms": p("tpot_ms", 0.5), "tpot_p99_ms": p("tpot_ms", 0.99), "itl_p99_ms": p("itl_ms", 0.99),
            "preemptions": sum(r["preemptions"] for r in runs), "completed": sum(r["completed"] for r in runs)}


def render(doc: dict) -> list[str]:
    L = [f"# Scheduler simulation: {doc['scenario']}", "", f"Command: `{doc['command']}`", "",
         "A simulation, not a measurement: vLLM 0.18.1's scheduler with patch 0004 (the real code, "
         "`bench/sched_sim.py`) on a simulated clock, step times from a synthetic device calibrated to the H200 "
         f"fit {doc['device']}. Poisson loads: {doc['requests']} requests per run, {doc['seeds']} seed(s) "
         "pooled; replays: the arrivals and lengths of a GPU run. TPOT is per request (mean inter-token latency), "
         "as `vllm bench serve` reports it; `x off` is the ratio to the upstream scheduler on the same load.", ""]
    for load in doc["loads"]:
        L += [f"## {load}", "",
              "| scheduler | out tok/s | x off | TTFT P50 ms | TTFT P99 ms | x off | TPOT P50 ms | TPOT P99 ms | "
              "x off | ITL P99 ms | preemptions | completed |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        rows = [r for r in doc["results"] if r["load"] == load]
        base = next(r["summary"] for r in rows if r["target_ms"] is None)
        for r in rows:
            s = r["summary"]
            name = ("upstream (off)" if r["target_ms"] is None
                    else f"target {r['target_ms']:g} ms, cap {r.get('cap_when', 'always')}")

            def ratio(k):
                return f"{s[k] / base[k]:.2f}" if base[k] else "-"
            L.append(f"| {name} | {s['out_tok_s']:.1f} | {ratio('out_tok_s')} | {s['ttft_p50_ms']:.0f} | "
                     f"{s['ttft_p99_ms']:.0f} | {ratio('ttft_p99_ms')} | {s['tpot_p50_ms']:.1f} | "
                     f"{s['tpot_p99_ms']:.1f} | {ratio('tpot_p99_ms')} | {s['itl_p99_ms']:.0f} | "
                     f"{s['preemptions']} | {s['completed']} |")
        L.append("")
    return L


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="dcu64-16-32K", help="one of " + ", ".join(SCENARIOS))
    ap.add_argument("--rates", default="0.25,0.6", help="Poisson request rates (req/s), comma list")
    ap.add_argument("--targets", default="off,30,60,120", help="'off' and/or --scheduler-tpot-target-ms values")
    ap.add_argument("--cap-when", default="kv-pressure",
                    help="--scheduler-tpot-cap-when values to run each target with, comma list: kv-pressure, always")
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--replay", action="append", default=[], metavar="RAW_JSON",
                    help="instead of Poisson arrivals, replay the arrivals and lengths of a `vllm bench serve "
                         "--save-detailed` result (repeatable: one table each; checks the simulator against a GPU run)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--what", default=None, help="file-name label (default: the scenario)")
    a = ap.parse_args(argv)
    try:
        if a.scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {a.scenario}; supported: {', '.join(SCENARIOS)}")
        replays = {p: replay_items(p) for p in a.replay}
        rates = [float(x) for x in a.rates.split(",") if x]
        targets = [None if x == "off" else float(x) for x in a.targets.split(",") if x]
        if any(not (r > 0 and math.isfinite(r)) for r in rates) or not (rates or replays):
            raise ValueError("--rates must be positive numbers ('' with --replay: replays only)")
        if None not in targets:
            targets.insert(0, None)  # the upstream scheduler is every table's reference
        if any(t is not None and not t > 0 for t in targets):
            raise ValueError("--targets must be 'off' or numbers > 0")
        cap_whens = [x for x in a.cap_when.split(",") if x]
        if not cap_whens or any(x not in ("kv-pressure", "always") for x in cap_whens):
            raise ValueError("--cap-when must list kv-pressure and/or always")
        if a.requests < 1 or a.seeds < 1:
            raise ValueError("--requests and --seeds must be >= 1")
    except (ValueError, OSError) as e:
        print(f"sched_sim: error: {e}", file=sys.stderr)
        return 2
    ensure_patched_vllm()
    import logging

    from bench.sched_sim_engine import run_one
    logging.getLogger("vllm").setLevel(logging.ERROR)
    # workloads: one per rate (a.seeds Poisson draws each) or one per replayed GPU run (its own arrivals)
    loads = ([(f"{r:g} req/s", r, [poisson_items(a.scenario, r, a.requests, seed) for seed in range(a.seeds)])
              for r in rates]
             + [(f"replay of {os.path.relpath(p, REPO) if os.path.isabs(p) else p}", None, [items])
                for p, items in replays.items()])
    results = []
    for label, rate, item_sets in loads:
        for target, when in [(None, None)] + [(t, w) for t in targets if t is not None for w in cap_whens]:
            runs = [run_one(a.scenario, items, target, seed, when or "kv-pressure")
                    for seed, items in enumerate(item_sets)]
            s = summarize(runs)
            results.append({"load": label, "rate": rate, "target_ms": target, "cap_when": when, "summary": s,
                            "runs": [{k: v for k, v in r.items() if k not in ("ttft_s", "tpot_ms", "itl_ms")}
                                     for r in runs]})
            print(f"{label} target {target} ({when}): TPOT P99 {s['tpot_p99_ms']:.1f} ms, TTFT P99 "
                  f"{s['ttft_p99_ms']:.0f} ms, {s['out_tok_s']:.1f} tok/s, {s['preemptions']} preemptions",
                  flush=True)
    cmd = "python -m bench.sched_sim " + " ".join(argv if argv is not None else sys.argv[1:])
    doc = {"scenario": a.scenario, "command": cmd.strip(), "date": _dt.date.today().isoformat(),
           "device": H200_L16, "requests": a.requests, "seeds": a.seeds, "loads": [x[0] for x in loads],
           "scheduler": SCENARIOS[a.scenario][0], "results": results}
    from kernels.results_io import write_result_pair
    md = write_result_pair(a.out, f"{doc['date']}-cpu-sched-sim-{a.what or a.scenario}", doc, render(doc))
    print("\n".join(render(doc)[4:]))
    print(f"wrote {md} and its .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
