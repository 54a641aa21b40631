"""The scoreboard's numbers from the result files the scoreboard plans' jobs write (no GPU, no rendering).

Inputs are classified by content, not by name: a `bench.serve_bench` step (contest protocol at 16 layers = the
contest serve; contest at 64 layers = the confirmation; load protocol under dcu64 = the 8-bit KV load run), a
`bench.e2e_offline` result (concurrency 1, first request, Triton compiles after start) and a
`bench.serve_robustness` result. Several contest steps pool: the plans run base -> full in the first call and
full -> base in the second, so the baseline runs first and last and each build once per machine; a build's
number per tier is the mean over its runs (as bench/report.py takes it), each step's own ratio is kept for the
spread, and the score uses bench/score.py with the global TPOT P99 over every request of the pooled runs.
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import tarfile
import tempfile

from bench.machine_paths import scrub
from bench.score import SLA_FACTOR, TIER_MAX, percentile, score_terms, tier_score

SCHEMA = 1
TIERS = list(TIER_MAX)
PARTS = ("contest", "e2e", "kv8_load", "robustness", "l64")
METRICS = {"tok_s": "output_throughput", "ttft_p99": "p99_ttft_ms", "tpot_p99": "p99_tpot_ms"}


class ScoreboardError(Exception):
    """Bad input: one line, non-zero exit."""


# ---------------------------------------------------------------------------------------------- reading inputs
def _json_files(root: str) -> list[str]:
    out = []
    for d, _, files in os.walk(root):
        out += [os.path.join(d, f) for f in files if f.endswith(".json")]
    return sorted(out)


def _extract(tgz: str, into: str) -> str:
    dest = tempfile.mkdtemp(prefix="tgz-", dir=into)
    try:
        with tarfile.open(tgz) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and m.name.endswith(".json")
                       and not m.name.startswith("/") and ".." not in m.name.split("/")]
            tar.extractall(dest, members=members)
    except (OSError, tarfile.TarError) as e:
        raise ScoreboardError(f"cannot read {tgz}: {e}") from None
    return dest


def load_inputs(paths: list[str], scratch: str) -> list[dict]:
    """Every result document under paths (folders, results.tgz, JSON files), each once, in the order given."""
    files: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            files += _json_files(p)
            for d, _, names in os.walk(p):
                files += [f for n in sorted(names) if n.endswith(".tgz")
                          for f in _json_files(_extract(os.path.join(d, n), scratch))]
        elif p.endswith(".tgz"):
            files += _json_files(_extract(p, scratch))
        elif os.path.isfile(p):
            files.append(p)
        else:
            raise ScoreboardError(f"no such file or folder: {p}")
    docs, seen = [], set()
    for f in files:
        try:
            with open(f) as fh:
                text = fh.read()
            doc = json.loads(text)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ScoreboardError(f"cannot read {f}: {e}") from None
        kind = classify(doc)
        key = hashlib.sha256(text.encode()).hexdigest()
        if kind and key not in seen:
            seen.add(key)
            docs.append({"kind": kind, "doc": doc, "file": os.path.basename(f)})
    return docs


def classify(doc) -> str | None:
    if not isinstance(doc, dict):
        return None
    if "runs" in doc and "baseline" in doc and isinstance(doc.get("args"), dict):
        a = doc["args"]
        if "contest" in a.get("protocols", []) and a.get("profile") == "h200":
            return "l64" if a.get("layers") == 64 else "contest"
        if "load" in a.get("protocols", []) and a.get("profile") == "dcu64":
            return "kv8_load"
        return None
    if isinstance(doc.get("results"), list) and "out_tokens" in doc:
        return "e2e"
    if isinstance(doc.get("configs"), list) and "pass" in doc:
        return "robustness"
    return None


# ------------------------------------------------------------------------------------------------ serve steps
def _candidate(doc: dict) -> str:
    names = [r["variant"] for r in [*doc.get("plan", []), *doc["runs"]]]
    cands = [n for n in dict.fromkeys(names) if n != doc["baseline"]]
    if not cands:
        raise ScoreboardError(f"step {doc.get('stem')} has no build besides its baseline {doc['baseline']}")
    return cands[0]


def _runs(doc: dict, variant: str, tier: str, protocol: str) -> list[dict]:
    return [r for r in doc["runs"] if r.get("variant") == variant and r.get("tier") == tier
            and r.get("protocol") == protocol and r.get("bench")]


def _mean(xs):
    return statistics.fmean(xs) if xs else None


def _spread(xs):
    return (max(xs) - min(xs)) / statistics.fmean(xs) if len(xs) > 1 and statistics.fmean(xs) else None


def serve_steps(docs: list[dict], protocol: str = "contest") -> dict:
    """Pooled base vs candidate per tier over several steps of the same two builds."""
    steps = [d["doc"] for d in docs]
    base, cand = steps[0]["baseline"], _candidate(steps[0])
    for s in steps[1:]:
        if (s["baseline"], _candidate(s)) != (base, cand):
            raise ScoreboardError(f"step {s.get('stem')} compares {_candidate(s)} with {s['baseline']}, the "
                                  f"first step {cand} with {base}")
    # the builds that ran, in order (a build the deadline skipped is in the step's plan, not its runs)
    order = [v for s in steps for v in dict.fromkeys(r["variant"] for r in s["runs"])]
    tiers = {}
    for t in TIERS:
        per = {b: [r for s in steps for r in _runs(s, b, t, protocol)] for b in (base, cand)}
        if not per[base] or not per[cand]:
            continue
        row = {"base": {}, "full": {}, "ratio": {}, "step_ratios": {}, "base_spread": {}}
        for key, field in METRICS.items():
            bv = [r["bench"][field] for r in per[base]]
            cv = [r["bench"][field] for r in per[cand]]
            row["base"][key], row["full"][key] = _mean(bv), _mean(cv)
            row["ratio"][key] = row["full"][key] / row["base"][key]
            row["step_ratios"][key] = [
                _mean([r["bench"][field] for r in _runs(s, cand, t, protocol)])
                / _mean([r["bench"][field] for r in _runs(s, base, t, protocol)])
                for s in steps if _runs(s, cand, t, protocol) and _runs(s, base, t, protocol)]
            row["base_spread"][key] = _spread(bv)
        for side, b in (("base", base), ("full", cand)):
            row[side]["runs"] = len(per[b])
            row[side]["completed"] = sum(r["bench"].get("completed") or 0 for r in per[b])
            row[side]["failed"] = sum(r["bench"].get("failed") or 0 for r in per[b])
            row[side]["tpot_ms"] = [x for r in per[b] for x in (r.get("per_request") or {}).get("tpot_ms", [])]
            cs = [r.get("server_counters") or {} for r in per[b]]
            row[side]["preemptions"] = sum(c.get("preemptions", 0) for c in cs)
        tiers[t] = row
    if not tiers:
        raise ScoreboardError(f"no tier has runs of both {base} and {cand} ({protocol})")
    a = steps[0]["args"]
    out = {"base": base, "full": cand, "order": order, "baseline_first_and_last": bool(order) and order[0] == base
           and order[-1] == base, "mode": a.get("mode"), "layers": a.get("layers"), "profile": a.get("profile"),
           "requests_per_tier": a.get("requests") if protocol == "contest" else a.get("load_requests"),
           "output_len": a.get("output_len"), "steps": [s.get("stem") for s in steps],
           "commands": [scrub(s.get("command", "")) for s in steps],
           "skipped": [scrub(str(x)) for s in steps for x in s.get("skipped", [])],
           "deviations": [scrub(x) for x in steps[0].get("deviations", [])],
           "patches": steps[0].get("variant_patches", {}).get(cand, []), "tiers": tiers}
    if protocol == "contest":
        out["score"] = contest_score(tiers)
    for row in tiers.values():  # per-request TPOTs only feed the global P99
        for side in ("base", "full"):
            row[side].pop("tpot_ms")
    return out


def contest_score(tiers: dict) -> dict:
    """Score terms with the 1.5x gates: per tier TTFT P99 and TPOT P99, and the global TPOT P99 (pooled)."""
    base = {t: tiers[t]["base"] for t in tiers}
    cand = {t: tiers[t]["full"] for t in tiers}
    bt = [x for t in tiers for x in base[t]["tpot_ms"]]
    ct = [x for t in tiers for x in cand[t]["tpot_ms"]]
    glob = (percentile(bt, 99), percentile(ct, 99)) if bt and ct else None
    terms = score_terms(base, cand, glob)
    gates = {"factor": SLA_FACTOR,
             "ttft_p99": {t: {"ratio": tiers[t]["ratio"]["ttft_p99"],
                              "ok": tiers[t]["ratio"]["ttft_p99"] <= SLA_FACTOR} for t in tiers},
             "tpot_p99": {t: {"ratio": tiers[t]["ratio"]["tpot_p99"],
                              "ok": tiers[t]["ratio"]["tpot_p99"] <= SLA_FACTOR} for t in tiers}}
    if glob:
        gates["global_tpot_p99"] = {"base_ms": glob[0], "full_ms": glob[1], "ratio": glob[1] / glob[0],
                                    "ok": glob[1] <= SLA_FACTOR * glob[0]}
    return {"tiers": terms, "total": sum(v["score"] for v in terms.values()),
            "base_total": sum(tier_score(TIER_MAX[t], 0.0) for t in terms), "gates": gates,
            "all_gates_ok": all(v["sla_ok"] for v in terms.values())}


# ------------------------------------------------------------------------------------------ other benchmarks
def e2e_part(docs: list[dict]) -> dict:
    doc = docs[-1]["doc"]
    res = doc["results"]
    if len(res) < 2 or res[0].get("failed"):
        raise ScoreboardError(f"{docs[-1]['file']}: the e2e baseline ({res[0].get('name')}) failed or stands alone")
    base, rows = res[0], {}
    configs = {}
    for r in res:
        configs[r["name"]] = {"failed": bool(r.get("failed")), "start_s": r.get("start_s"),
                              "first_request_s": {str(x["input"]): x.get("first_request_s") for x in r.get("rows", [])},
                              "compiled_after_start": r.get("compiled_after_start"),
                              "autotuned_after_start": r.get("autotuned_after_start")}
    for r in res[1:]:
        if r.get("failed"):
            continue
        for x in r["rows"]:
            b = next((y for y in base["rows"] if y["input"] == x["input"]), None)
            if b:
                rows.setdefault(r["name"], {})[str(x["input"])] = {
                    "ttft_ms": x["ttft_ms"], "tpot_ms": x["tpot_ms"], "base_ttft_ms": b["ttft_ms"],
                    "base_tpot_ms": b["tpot_ms"], "ttft_ratio": x["ttft_ms"] / b["ttft_ms"],
                    "tpot_ratio": x["tpot_ms"] / b["tpot_ms"]}
    return {"base": base["name"], "layers": doc.get("layers"), "out_tokens": doc.get("out_tokens"),
            "command": scrub(doc.get("command", "")), "ratios": rows, "configs": configs}


def robustness_part(docs: list[dict]) -> dict:
    configs = {}
    for d in docs:
        for c in d["doc"]["configs"]:
            configs[c["config"]] = {"pass": bool(c.get("pass")), "why": [scrub(str(w)) for w in c.get("why") or []],
                                    "engine_deaths": c.get("engine_deaths"), "preemptions": c.get("preemptions"),
                                    "kv_usage_after_drain": c.get("kv_usage_after_drain"),
                                    "gpu_memory_growth_mib": c.get("gpu_memory_growth_mib"),
                                    "skipped": scrub(c["skipped"]) if c.get("skipped") else None}
    return {"configs": configs, "pass": bool(configs) and all(c["pass"] for c in configs.values()),
            "commands": [scrub(d["doc"].get("command", "")) for d in docs]}


def build(inputs: list[dict], commit: str, date: str | None, label: str | None) -> dict:
    by = {k: [d for d in inputs if d["kind"] == k] for k in PARTS}
    if not by["contest"]:
        raise ScoreboardError("no contest serve step among the inputs (a bench.serve_bench result of the "
                              "contest protocol at 16 layers); nothing to score")
    sb = {"schema": SCHEMA, "commit": commit, "date": date or by["contest"][0]["doc"].get("date"),
          "label": label, "inputs": [d["file"] for d in inputs]}
    sb["contest"] = serve_steps(by["contest"])
    incomplete = {}

    def optional(kind, part, *args):
        """A part other than the contest serve: None when it did not run or its results cannot make the part
        (e.g. the deadline skipped one build), with the reason kept for the report."""
        if not by[kind]:
            return None
        try:
            return part(by[kind], *args)
        except ScoreboardError as e:
            incomplete[kind] = str(e)
            return None

    sb["l64"] = optional("l64", serve_steps)
    sb["kv8_load"] = optional("kv8_load", serve_steps, "load")
    sb["e2e"] = optional("e2e", e2e_part)
    sb["robustness"] = optional("robustness", robustness_part)
    sb["missing"] = [k for k in PARTS if not by[k] or k in incomplete]
    sb["incomplete"] = incomplete
    c = sb["contest"]
    notes = []
    if not c["baseline_first_and_last"]:
        notes.append(f"the baseline did not run first and last (order {' -> '.join(c['order'])})")
    if (c["requests_per_tier"] or 0) < 10:
        notes.append(f"{c['requests_per_tier']} requests per tier (the scoreboard asks for at least 10)")
    if c["mode"] != "graph":
        notes.append(f"mode {c['mode']}, not the official start script's compilation mode (torch.compile + CUDA "
                     "graphs, bench.serve_bench --mode graph)")
    sb["notes"] = notes
    sb["headline"] = {k: [c["tiers"][t]["ratio"][k] for t in TIERS if t in c["tiers"]] for k in METRICS}
    return sb
