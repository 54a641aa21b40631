"""Markdown tables of a real-model accuracy run (CPU route or engine route: the same document shape) and the
targets of issue #45."""
from __future__ import annotations

import datetime
import json
from pathlib import Path

from .fetch import write_atomic

REF = "auto"
NAMES = {"auto": "bf16", "int8_per_token_head": "int8_per_token_head", "fp8_per_token_head": "fp8_per_token_head",
         "fp8": "fp8 per-tensor (0.18.1, scale 1.0)"}


def write_pair(out_dir: Path, what: str, doc: dict, md_text: str) -> Path:
    """``<out_dir>/<date>-<what>.json`` (``doc``) and ``.md`` (``md_text``), each whole or not at all; the .md path."""
    stem = f"{datetime.date.today().isoformat()}-{what}"
    write_atomic(out_dir / f"{stem}.json", json.dumps(doc, indent=1) + "\n")
    md = out_dir / f"{stem}.md"
    write_atomic(md, md_text)
    return md


def _em(section: dict, kv: str) -> str:
    cells = []
    for c, res in section.items():
        if kv in res:
            cells.append(f"{c}: {100 * res[kv]['exact_match']:.0f}%")
    return ", ".join(cells) or "-"


def targets(doc: dict) -> list[str]:
    s = doc["sections"]
    lines = []
    for c, per in s.get("perplexity", {}).items():
        if "int8_per_token_head" in per:
            r = per["int8_per_token_head"]["ppl_ratio"]
            lines.append(f"- int8_per_token_head perplexity at {c}: {100 * (r - 1):+.3f}% of bf16 (target within "
                         f"0.5%): {'met' if abs(r - 1) <= 0.005 else 'MISSED'}")
    for task in ("retrieval", "aggregation"):
        for c, res in s.get(task, {}).items():
            if "dropped" in res:
                lines.append(f"- {task} at {c}: dropped ({res['dropped']})")
            elif "int8_per_token_head" in res:
                d = 100 * (res["int8_per_token_head"]["exact_match"] - res[REF]["exact_match"])
                lines.append(f"- int8_per_token_head {task} at {c}: {d:+.1f} points vs bf16 (target within 1): "
                             f"{'met' if abs(d) <= 1 else 'MISSED'}")
    worse = []
    for c, per in s.get("perplexity", {}).items():
        if "fp8" in per and "fp8_per_token_head" in per:
            a, b = per["fp8_per_token_head"], per["fp8"]
            if a["ppl_ratio"] > b["ppl_ratio"]:
                worse.append(f"perplexity at {c}")
            if a["all"]["kl"] > b["all"]["kl"]:
                worse.append(f"KL at {c}")
            if a["all"]["top1"] < b["all"]["top1"]:
                worse.append(f"top-1 at {c}")
    for task in ("retrieval", "aggregation"):
        for c, res in s.get(task, {}).items():
            if "fp8" in res and "fp8_per_token_head" in res and \
                    res["fp8_per_token_head"]["exact_match"] < res["fp8"]["exact_match"]:
                worse.append(f"{task} at {c} ({res['fp8_per_token_head']['hits']} against {res['fp8']['hits']} of "
                             f"{res['fp8']['n']})")
    g = s.get("greedy", {})
    if "fp8" in g and "fp8_per_token_head" in g and g["fp8_per_token_head"]["agreement"] < g["fp8"]["agreement"]:
        big = 10**9  # identical: diverges after the end
        pairs = [(big if a is None else a, big if b is None else b)
                 for a, b in zip(g["fp8_per_token_head"]["first_divergence"], g["fp8"]["first_divergence"])]
        earlier, later = sum(a < b for a, b in pairs), sum(a > b for a, b in pairs)
        worse.append(f"greedy agreement; paired: fp8_per_token_head diverged first on {earlier} passages, "
                     f"per-tensor fp8 on {later}, {len(pairs) - earlier - later} ties")
    lines.append("- fp8_per_token_head no worse than per-tensor fp8 anywhere: "
                 + ("met" if not worse else "MISSED (" + ", ".join(worse) + ")"))
    return lines


def markdown(doc: dict, title: str) -> str:
    s = doc["sections"]
    kvs = doc["kv"]
    out = [f"# {title}", "", f"Command: `{doc['command']}`", "", doc.get("setup", ""), ""]
    ppl = s.get("perplexity", {})
    head = "| KV dtype | " + " | ".join(f"ppl {c} (x bf16)" for c in ppl) + " | KL (nats) | top-1 | greedy agreement " \
        "(identical) | retrieval EM | aggregation EM |"
    out += [head, "|" + "---|" * (head.count("|") - 1)]
    for kv in kvs:
        cells = [f"{per[kv]['all']['ppl']:.4f} ({per[kv]['ppl_ratio']:.5f})" for per in ppl.values()]
        last = list(ppl.values())[-1][kv]["all"] if ppl else None
        g = s.get("greedy", {}).get(kv)
        out.append(f"| {NAMES.get(kv, kv)} | " + " | ".join(cells)
                   + (f" | {last['kl']:.2e} (max {last['kl_max']:.2e}) | {last['top1']:.4f}" if last else " | - | -")
                   + (f" | {g['agreement']:.3f} ({g['identical']}/{g['prompts']})" if g else " | -")
                   + f" | {_em(s.get('retrieval', {}), kv)} | {_em(s.get('aggregation', {}), kv)} |")
    for c, per in ppl.items():
        buckets = [b for b in per[REF] if b not in ("all", "window_ppl", "window_ratio", "ppl_ratio")]
        out += ["", f"KL(bf16 || x) and top-1 agreement by position, {c}-token windows:", "",
                "| KV dtype | " + " | ".join(buckets) + " |", "|---|" + "---|" * len(buckets)]
        for kv in kvs[1:]:
            out.append(f"| {NAMES.get(kv, kv)} | " + " | ".join(
                f"{per[kv][b]['kl']:.1e} / {per[kv][b]['top1']:.3f}" for b in buckets) + " |")
        out += ["", "Per-window perplexity ratio to bf16: " + "; ".join(
            f"{NAMES.get(kv, kv)} " + ", ".join(f"{r:.4f}" for r in per[kv]["window_ratio"]) for kv in kvs[1:])]
    g = s.get("greedy")
    if g:
        out += ["", "Greedy first divergence per prompt (token index; None = identical): " + "; ".join(
            f"{NAMES.get(kv, kv)} {g[kv]['first_divergence']}" for kv in kvs[1:])]
    k = s.get("kernels")
    if k:
        out += ["", f"Through the project's kernels in the Triton interpreter ({k['tokens']}-token windows x "
                f"{k['windows']}): KL / top-1 against bf16 through the same kernels, and against the same format on "
                "the torch route:", "", "| KV dtype | vs bf16 (kernels) | vs its torch route |", "|---|---|---|"]
        for kv in kvs:
            a, b = k[kv]["vs_bf16_kernels"], k[kv]["vs_torch_route"]
            out.append(f"| {NAMES.get(kv, kv)} | {a['kl']:.2e} / {a['top1']:.4f} | {b['kl']:.2e} / {b['top1']:.4f} |")
    out += ["", "Targets (issue #45):", ""] + targets(doc)
    return "\n".join(out) + "\n"


def write(doc: dict, out_dir: Path, what: str, title: str) -> Path:
    return write_pair(out_dir, what, doc, markdown(doc, title))
