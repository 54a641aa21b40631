"""Markdown report and plots from serve_bench.py result JSON (one file per step).

Every build is compared with the baseline of its own step (the mean of the
baseline's runs there: first and last), because numbers from different
machines or sessions do not compare. Per protocol, memory profile and tier:
output tok/s, TTFT P50/P99, TPOT P50/P99, ratios to the baseline, the
baseline's run-to-run spread, and for the contest protocol the score terms
(bench/score.py).

Usage: python -m bench.report STEP.json [STEP2.json ...] [--out bench/results/<date>-<gpu>-<what>]
Writes <out>.md and <out>.png (matplotlib); the default <out> is the first
JSON's path without .json.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys

from bench.score import TIER_MAX, percentile, score_terms
from kernels.results_io import save_figure, write_text

TIERS = list(TIER_MAX)
METRICS = [  # (key in run["bench"], column title, format)
    ("output_throughput", "out tok/s", "{:.1f}"),
    ("p50_ttft_ms", "TTFT P50 ms", "{:.1f}"),
    ("p99_ttft_ms", "TTFT P99 ms", "{:.1f}"),
    ("p50_tpot_ms", "TPOT P50 ms", "{:.2f}"),
    ("p99_tpot_ms", "TPOT P99 ms", "{:.2f}"),
]
RATIO_OF = {"output_throughput", "p99_ttft_ms", "p99_tpot_ms"}


class ReportError(Exception):
    pass


def load(paths: list[str]) -> list[dict]:
    docs = []
    for p in paths:
        try:
            with open(p) as f:
                d = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ReportError(f"cannot read {p}: {e}") from None
        if "runs" not in d or "baseline" not in d:
            raise ReportError(f"{p} is not a serve_bench result (no 'runs'/'baseline')")
        d.setdefault("stem", os.path.splitext(os.path.basename(p))[0])
        docs.append(d)
    return docs


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def _spread(xs):
    xs = [x for x in xs if x is not None]
    if len(xs) < 2 or not statistics.fmean(xs):
        return None
    return (max(xs) - min(xs)) / statistics.fmean(xs)


def sections(docs: list[dict]) -> list[dict]:
    """One section per (step, profile, protocol): builds in run order, metrics per tier."""
    out = []
    for d in docs:
        keys = []
        for r in d["runs"]:
            if r.get("protocol") and (r["profile"], r["protocol"]) not in keys:
                keys.append((r["profile"], r["protocol"]))
        for profile, protocol in keys:
            runs = [r for r in d["runs"] if r.get("protocol") == protocol and r["profile"] == profile]
            builds: list[str] = []
            for r in [*d.get("plan", []), *runs]:
                if r["variant"] not in builds:
                    builds.append(r["variant"])
            tiers = [t for t in TIERS if any(r["tier"] == t for r in runs)]
            down = {}  # build -> errors of servers that never served
            for r in d["runs"]:
                if not r.get("protocol") and r.get("error"):
                    down.setdefault(r["variant"], []).append(r["error"])
            cell = {}  # (build, tier) -> {"n", "errors", metric: mean over runs, "spread_"+metric}
            for b in builds:
                for t in tiers:
                    rs = [r for r in runs if r["variant"] == b and r["tier"] == t]
                    ok = [r for r in rs if r.get("bench")]
                    c = {"n": len(ok), "errors": [r["error"] for r in rs if r.get("error")] + down.get(b, []),
                         "per_run": [r["bench"] for r in ok],
                         "tpot_ms": [x for r in ok for x in (r.get("per_request") or {}).get("tpot_ms", [])],
                         "completed": sum(r["bench"].get("completed") or 0 for r in ok),
                         "failed": sum(r["bench"].get("failed") or 0 for r in ok)}
                    cs = [r.get("server_counters") for r in ok]
                    c["counters"] = ({k: sum(x.get(k, 0) for x in cs) for k in cs[0]}
                                     if cs and all(x is not None for x in cs) else None)
                    for key in ("p99_itl_ms", "p99_e2el_ms", "mean_ttft_ms"):
                        c[key] = _mean([r["bench"].get(key) for r in ok])
                    for key, _, _ in METRICS:
                        c[key] = _mean([r["bench"].get(key) for r in ok])
                        c["spread_" + key] = _spread([r["bench"].get(key) for r in ok])
                    cell[(b, t)] = c
            out.append({"doc": d, "profile": profile, "protocol": protocol, "builds": builds,
                        "tiers": tiers, "cell": cell, "baseline": d["baseline"]})
    return out


def section_scores(s: dict) -> dict[str, dict]:
    """{build: score_terms(...)} for a contest section (empty dict for other protocols)."""
    if s["protocol"] != "contest":
        return {}
    base = s["baseline"]

    def metrics(b):
        return {t: {"tok_s": s["cell"][(b, t)]["output_throughput"],
                    "ttft_p99": s["cell"][(b, t)]["p99_ttft_ms"],
                    "tpot_p99": s["cell"][(b, t)]["p99_tpot_ms"]}
                for t in s["tiers"] if s["cell"][(b, t)]["n"]}

    bm = metrics(base) if base in s["builds"] else {}
    if not bm or any(v["tok_s"] is None or v["tok_s"] <= 0 for v in bm.values()):
        return {}
    base_tpot = [x for t in bm for x in s["cell"][(base, t)]["tpot_ms"]]
    out = {}
    for b in s["builds"]:
        cm = metrics(b)
        common = [t for t in cm if t in bm]
        g = None
        cand_tpot = [x for t in common for x in s["cell"][(b, t)]["tpot_ms"]]
        if base_tpot and cand_tpot:
            base_common = [x for t in common for x in s["cell"][(base, t)]["tpot_ms"]]
            g = (percentile(base_common, 99), percentile(cand_tpot, 99))
        out[b] = score_terms({t: bm[t] for t in common}, {t: cm[t] for t in common}, g)
    return out


def _name(b: str, s: dict) -> str:
    return b + (" (baseline)" if b == s["baseline"] and "baseline" not in b else "")


def _fmt(v, f):
    return "-" if v is None else f.format(v)


def _ratio(v, b):
    return "-" if v is None or not b else f"{v / b:.3f}"


def load_detail(s: dict, t: str) -> list[str]:
    """Lines of the load protocol's second table for tier t: stalls (ITL P99), whole-request latency, and the
    server's counters over the run (preemptions mean recomputed prefills: the KV cache ran out)."""
    L = ["| build | ITL P99 ms | E2E P99 ms | TTFT mean ms | preemptions | prompt tokens | prefix-cache hits |",
         "|---|---:|---:|---:|---:|---:|---:|"]
    for b in s["builds"]:
        c = s["cell"][(b, t)]
        if not c["n"]:
            continue
        k = c.get("counters") or {}
        hits = (f"{100 * k['prefix_cache_hits'] / k['prefix_cache_queries']:.1f}%"
                if k.get("prefix_cache_queries") else "-")
        L.append(f"| {_name(b, s)} | {_fmt(c.get('p99_itl_ms'), '{:.1f}')} | {_fmt(c.get('p99_e2el_ms'), '{:.0f}')} | "
                 f"{_fmt(c.get('mean_ttft_ms'), '{:.0f}')} | {k.get('preemptions', '-')} | "
                 f"{k.get('prompt_tokens', '-')} | {hits} |")
    return L + [""]


def render_markdown(docs: list[dict], report_cmd: str | None = None) -> str:
    L = []
    what = docs[0].get("stem", "")
    L.append(f"# Serving benchmark: {what}")
    L.append("")
    for d in docs:
        L.append(f"Command: `{d.get('command', '(not recorded)')}`")
        L.append("")
    if report_cmd:
        L.append(f"Report: `{report_cmd}`")
        L.append("")
    d0 = docs[0]
    a = d0.get("args", {})
    L.append(f"GPU {d0.get('gpu', '?')}, {d0.get('date', '?')}; {a.get('layers', '?')} layers of Qwen3.5-27B with "
             f"dummy weights; mode {a.get('mode', '?')}; output length {a.get('output_len', '?')} tokens per request "
             f"with ignore-eos (dummy weights never emit EOS; the contest's real outputs average ~250 tokens); "
             f"contest protocol {a.get('requests', '?')} requests per tier.")
    L.append("")
    L.append("How to read: each build is compared with the baseline of its own step (mean of its first and last "
             "run). `x base` is the ratio to that mean (tok/s: higher is better; latencies: lower is better). "
             "Score terms follow the contest formula per tier, `max * (0.6 + 0.4 * (1 - exp(-1.3 r)))` with maxima "
             "20/50/30 and r the relative output tok/s gain; a tier scores 0 when its TTFT P99 or TPOT P99 exceeds "
             "1.5x the baseline's, and all tiers do when the pooled TPOT P99 does. The baseline's own spread says "
             "how large a difference must be before it means anything.")
    L.append("")
    for s in sections(docs):
        d = s["doc"]
        L.append(f"## {s['protocol']} protocol, {s['profile']} memory profile ({d['stem']})")
        L.append("")
        if s["protocol"] == "load":
            load = d.get("load") or {}
            rates = load.get("rates_used") or load.get("rates")
            rates = ", ".join(f"{t} {r:.3g}" for t, r in rates.items()) if isinstance(rates, dict) else rates
            if isinstance(load.get("rates"), dict):
                how = "given"
            elif load.get("rates_how"):
                how = "; ".join(f"{t}: {h}" for t, h in load["rates_how"].items())
            else:  # results written before rates_how was recorded
                how = "auto: 0.6 of the baseline's concurrency-1 capacity, or the fixed table without one"
            L.append(f"Concurrency {load.get('concurrency', 16)}, Poisson arrivals at {rates} req/s ({how}).")
            L.append("")
        scores = section_scores(s)
        if scores:
            L.append("### Score terms")
            L.append("")
            L.append("| build | " + " | ".join(f"{t} (max {TIER_MAX[t]:.0f})" for t in s["tiers"]) + " | total | SLA |")
            L.append("|---|" + "---:|" * len(s["tiers"]) + "---:|---|")
            for b in s["builds"]:
                terms = scores.get(b, {})
                cells = []
                for t in s["tiers"]:
                    x = terms.get(t)
                    cells.append("-" if x is None else (f"{x['score']:.2f}" if x["sla_ok"]
                                                        else f"0 (was {x['raw']:.2f})"))
                total = sum(x["score"] for x in terms.values())
                viol = []
                for t, x in terms.items():
                    for v in x["violations"]:
                        v = v if v.startswith("global") else f"{t} {v}"
                        if v not in viol:
                            viol.append(v)
                if not terms:
                    viol = ["no result"]
                name = _name(b, s)
                L.append(f"| {name} | " + " | ".join(cells) + f" | {total:.2f} | {'; '.join(viol) or 'ok'} |")
            L.append("")
        for t in s["tiers"]:
            L.append(f"### {t}")
            L.append("")
            L.append("| build | runs | out tok/s | x base | TTFT P50 ms | TTFT P99 ms | x base | TPOT P50 ms | "
                     "TPOT P99 ms | x base | ok / failed |")
            L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
            bc = s["cell"].get((s["baseline"], t), {})
            for b in s["builds"]:
                c = s["cell"][(b, t)]
                name = _name(b, s)
                if not c["n"]:
                    why = "; ".join(e.splitlines()[0] for e in c["errors"])[:160] or "not run"
                    L.append(f"| {name} | 0 | failed: {why} |" + " - |" * 8)
                    continue
                L.append(f"| {name} | {c['n']} | {_fmt(c['output_throughput'], '{:.1f}')} | "
                         f"{_ratio(c['output_throughput'], bc.get('output_throughput'))} | "
                         f"{_fmt(c['p50_ttft_ms'], '{:.1f}')} | {_fmt(c['p99_ttft_ms'], '{:.1f}')} | "
                         f"{_ratio(c['p99_ttft_ms'], bc.get('p99_ttft_ms'))} | "
                         f"{_fmt(c['p50_tpot_ms'], '{:.2f}')} | {_fmt(c['p99_tpot_ms'], '{:.2f}')} | "
                         f"{_ratio(c['p99_tpot_ms'], bc.get('p99_tpot_ms'))} | {c['completed']} / {c['failed']} |")
            L.append("")
            if s["protocol"] == "load":
                L.extend(load_detail(s, t))
        bs = [(t, s["cell"][(s["baseline"], t)]) for t in s["tiers"] if (s["baseline"], t) in s["cell"]]
        L.append("### Baseline spread (max - min) / mean over its runs")
        L.append("")
        L.append("| tier | runs | out tok/s | TTFT P99 | TPOT P99 |")
        L.append("|---|---:|---:|---:|---:|")
        for t, c in bs:
            sp = [c.get("spread_" + k) for k in ("output_throughput", "p99_ttft_ms", "p99_tpot_ms")]
            L.append(f"| {t} | {c['n']} | " + " | ".join("-" if x is None else f"{100 * x:.1f}%" for x in sp) + " |")
        L.append("")
    L.append("## Setup")
    L.append("")
    for d in docs:
        order = " -> ".join(p["variant"] + (" (again)" if p.get("repeat") else "") for p in d.get("plan", []))
        L.append(f"Step {d['stem']}: order {order}")
        L.append("")
        if d.get("server_flags"):
            L.append("- server flags: `" + shlex.join(d["server_flags"]) + "`")
        for v, ps in (d.get("variant_patches") or {}).items():
            if ps is not None:
                L.append(f"- {v}: patches {', '.join(ps) or '(none)'}")
        for v, fl in (d.get("variant_flags") or {}).items():
            L.append(f"- extra server flags for {v}: `{shlex.join(fl)}`")
        for v, env in (d.get("variant_env") or {}).items():
            L.append(f"- extra env for {v}: `" + shlex.join(f"{k}={val}" for k, val in env.items()) + "`")
        if d.get("bench_flags"):
            L.append("- bench flags: `" + shlex.join(d["bench_flags"]) + "`")
        if d.get("prompts"):
            L.append("- prompts: " + ", ".join(f"{t} sha256 {p['sha256'][:12]} (seed {p.get('seed')})"
                                              for t, p in d["prompts"].items()))
        if d.get("profile_detail"):
            L.append("- memory profile: " + ", ".join(f"{k} {round(v, 3) if isinstance(v, float) else v}"
                                                      for k, v in d["profile_detail"].items()))
        srv = {}
        for r in d["runs"]:
            if r.get("server"):
                srv.setdefault((r["variant"], r["repeat"]), r["server"])
        for (v, rep), info in srv.items():
            L.append(f"- server {v}{' (again)' if rep else ''}: " + ", ".join(
                f"{k} {int(val) if isinstance(val, float) and val.is_integer() else val}" for k, val in info.items()))
        for sk in d.get("skipped", []):
            L.append(f"- skipped {sk['what']}: {sk['why']}")
        for r in d["runs"]:
            if r.get("error") and not r.get("protocol"):
                L.append(f"- {r['variant']} failed to serve: {r['error'].splitlines()[0]}")
        if d.get("deviations"):
            L.append("- differences from the official scripts:")
            for x in d["deviations"]:
                L.append(f"  - {x}")
        L.append("")
    return "\n".join(L)


def render_plot(docs: list[dict], path: str) -> str | None:
    secs = [s for s in sections(docs) if s["tiers"]]
    if not secs:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = [("output_throughput", "output tok/s (higher is better)"),
            ("p99_ttft_ms", "TTFT P99 ms (dashes: 1.5x baseline)"),
            ("p99_tpot_ms", "TPOT P99 ms (dashes: 1.5x baseline)")]
    fig, axes = plt.subplots(len(secs), 3, figsize=(15, 3.6 * len(secs)), squeeze=False)
    for row, s in enumerate(secs):
        n = len(s["builds"])
        width = 0.8 / max(1, n)
        for col, (key, title) in enumerate(cols):
            ax = axes[row][col]
            for j, b in enumerate(s["builds"]):
                vals = [s["cell"][(b, t)][key] or 0.0 for t in s["tiers"]]
                xs = [k + (j - (n - 1) / 2) * width for k in range(len(s["tiers"]))]
                ax.bar(xs, vals, width, label=b)
            if key != "output_throughput" and s["protocol"] == "contest":
                for k, t in enumerate(s["tiers"]):
                    bv = s["cell"].get((s["baseline"], t), {}).get(key)
                    if bv:
                        ax.hlines(1.5 * bv, k - 0.45, k + 0.45, colors="k", linestyles="dashed", linewidth=1)
            ax.set_xticks(range(len(s["tiers"])))
            ax.set_xticklabels(s["tiers"])
            ax.set_title(f"{s['protocol']}/{s['profile']}: {title}", fontsize=9)
            if row == 0 and col == 0:
                ax.legend(fontsize=7)
    fig.suptitle(docs[0].get("stem", ""), fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def write_report(paths: list[str], out_stem: str | None = None, report_cmd: str | None = None):
    docs = load(paths)
    out_stem = out_stem or os.path.splitext(paths[0])[0]
    md = render_markdown(docs, report_cmd)
    md_path = out_stem + ".md"
    write_text(md_path, md + "\n")
    png = render_plot(docs, out_stem + ".png")
    return md_path, png


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+")
    ap.add_argument("--out", default=None, help="output path without extension")
    a = ap.parse_args(argv)
    cmd = "python -m bench.report " + " ".join(shlex.quote(x) for x in (argv if argv is not None else sys.argv[1:]))
    try:
        md, png = write_report(a.json, a.out, cmd if len(a.json) > 1 or a.out else None)
    except ReportError as e:
        print(f"report: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {md}" + (f" and {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
