"""The scoreboard's markdown, its per-tier plots and the README's headline block (from bench/scoreboard_data.py's
JSON; nothing here measures or reads result files)."""
from __future__ import annotations

import re

from bench.score import TIER_MAX

TIERS = list(TIER_MAX)
HEADLINE_OPEN = "<!-- scoreboard:headline -->"
HEADLINE_CLOSE = "<!-- /scoreboard -->"
HEADLINE_RE = re.compile(re.escape(HEADLINE_OPEN) + r"\n(.*?)\n" + re.escape(HEADLINE_CLOSE), re.S)
RATIO_KEYS = (("tok_s", "output tok/s"), ("ttft_p99", "TTFT P99"), ("tpot_p99", "TPOT P99"))


def r3(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def span(xs) -> str:
    return "-" if not xs else (f"{min(xs):.3f}" if len(xs) == 1 else f"{min(xs):.3f}-{max(xs):.3f}")


def patch_range(patches: list[str]) -> str:
    nums = sorted(p[:4] for p in patches if p[:4].isdigit())
    return f"{nums[0]}-{nums[-1]}" if nums else "none"


def headline(sb: dict) -> str:
    """The README's block between the anchors (without them): the whole series against 0.18.1."""
    c, h = sb["contest"], sb["headline"]
    tiers = [t for t in TIERS if t in c["tiers"]]
    g = c["score"]["gates"].get("global_tpot_p99")
    text = (f"- **The whole series ({patch_range(c['patches'])})** against 0.18.1 through `vllm serve` with the "
            f"contest's flags ({c['layers']} layers, mode {c['mode']}, {c['requests_per_tier']} requests per tier, "
            f"baseline {'first and last' if c['baseline_first_and_last'] else 'not repeated'}): output tok/s "
            f"**{' / '.join(r3(x) for x in h['tok_s'])}x** at {' / '.join(tiers)}, TTFT P99 "
            f"{' / '.join(r3(x) for x in h['ttft_p99'])}x, TPOT P99 {' / '.join(r3(x) for x in h['tpot_p99'])}x"
            + (f" (global {r3(g['ratio'])}x)" if g else "")
            + f"; contest score {c['score']['total']:.2f} against 0.18.1's {c['score']['base_total']:.2f}, "
            f"{'every 1.5x gate held' if c['score']['all_gates_ok'] else 'a 1.5x gate failed'}")
    l64 = sb.get("l64")
    if l64:
        t64 = [t for t in TIERS if t in l64["tiers"]]
        text += (f"; at 64 layers ({', '.join(t64)}, {l64['requests_per_tier']} requests per build, mode "
                 f"{l64['mode']}) {' / '.join(r3(l64['tiers'][t]['ratio']['tok_s']) for t in t64)}x tok/s, TTFT "
                 f"P99 {' / '.join(r3(l64['tiers'][t]['ratio']['ttft_p99']) for t in t64)}x")
    text += (f". Commit {sb['commit']}, {sb['date']}"
             + (f" ({sb['label']})" if sb.get("label") else "")
             + ": [bench/results/SCOREBOARD.md](bench/results/SCOREBOARD.md)")
    return text


def replace_headline(readme: str, block: str) -> str:
    if not HEADLINE_RE.search(readme):
        raise ValueError(f"README has no {HEADLINE_OPEN} ... {HEADLINE_CLOSE} block")
    return HEADLINE_RE.sub(lambda m: f"{HEADLINE_OPEN}\n{block}\n{HEADLINE_CLOSE}", readme, count=1)


def readme_headline(readme: str) -> str | None:
    m = HEADLINE_RE.search(readme)
    return m.group(1) if m else None


def _serve_table(part: dict, with_score: bool) -> list[str]:
    lines = ["| tier | build | runs | out tok/s | TTFT P99 ms | TPOT P99 ms | ok / failed | preemptions |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for t, row in part["tiers"].items():
        for side in ("base", "full"):
            v = row[side]
            lines.append(f"| {t} | {part[side]}{' (baseline)' if side == 'base' else ''} | {v['runs']} | "
                         f"{v['tok_s']:.1f} | {v['ttft_p99']:.1f} | {v['tpot_p99']:.2f} | "
                         f"{v['completed']} / {v['failed']} | {v['preemptions']} |")
    lines += ["", f"Ratios {part['full']} / {part['base']} (pooled means; "
              "per step: each step's own ratio; baseline spread: (max - min) / mean of its runs):", "",
              "| tier | out tok/s | per step | TTFT P99 | per step | TPOT P99 | per step | baseline spread tok/s / "
              "TTFT P99 / TPOT P99 |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for t, row in part["tiers"].items():
        cells = [f"{r3(row['ratio'][k])} | {span(row['step_ratios'][k])}" for k, _ in RATIO_KEYS]
        spread = " / ".join(pct(row["base_spread"][k]) for k, _ in RATIO_KEYS)
        lines.append(f"| {t} | {' | '.join(cells)} | {spread} |")
    if with_score:
        s = part["score"]
        lines += ["", f"Contest score (maxima 20 / 50 / 30; r = tok/s ratio - 1; a tier scores 0 when its TTFT P99 or "
                  f"TPOT P99 exceeds {s['gates']['factor']}x the baseline's, every tier when the global TPOT P99 "
                  "does):", "", "| tier | r | raw | score | TTFT P99 gate | TPOT P99 gate | violations |",
                  "|---|---:|---:|---:|---|---|---|"]
        for t, v in s["tiers"].items():
            gt, gp = s["gates"]["ttft_p99"][t], s["gates"]["tpot_p99"][t]
            lines.append(f"| {t} | {v['r']:+.3f} | {v['raw']:.2f} | {v['score']:.2f} | {r3(gt['ratio'])}x "
                         f"{'ok' if gt['ok'] else 'FAIL'} | {r3(gp['ratio'])}x {'ok' if gp['ok'] else 'FAIL'} | "
                         f"{'; '.join(v['violations']) or '-'} |")
        g = s["gates"].get("global_tpot_p99")
        lines.append(f"| total | | | **{s['total']:.2f}** (0.18.1: {s['base_total']:.2f}) | | "
                     + (f"global {g['full_ms']:.2f} / {g['base_ms']:.2f} ms = {r3(g['ratio'])}x "
                        f"{'ok' if g['ok'] else 'FAIL'}" if g else "global: no per-request TPOTs") + " | |")
    return lines


def markdown(sb: dict, img_prefix: str) -> str:
    c = sb["contest"]
    out = [f"# Scoreboard: commit {sb['commit']}, {sb['date']}", ""]
    if sb.get("label"):
        out += [f"**{sb['label']}**", ""]
    out += [f"HEAD's build ({c['full']}: patches {patch_range(c['patches'])}) against 0.18.1 ({c['base']}) on one "
            "H200 with dummy Qwen3.5-27B weights; they compare builds and are not DCU numbers. Written by "
            "`python -m bench.scoreboard --collect` from: " + ", ".join(f"`{f}`" for f in sb["inputs"]) + ".", ""]
    if sb["notes"]:
        out += ["Departures from the scoreboard's protocol:", ""] + [f"- {n}" for n in sb["notes"]] + [""]
    if sb["missing"]:
        out += ["Not measured in this scoreboard (owed): " + ", ".join(sb["missing"]) + ".", ""]
    out += [f"## Contest serve ({c['layers']} layers, mode {c['mode']}, {c['requests_per_tier']} requests per tier, "
            f"{c['output_len']} output tokens, order {' -> '.join(c['order']) or '-'})", ""]
    out += _serve_table(c, with_score=True)
    out += ["", "Plots (ratios to the baseline; bars: pooled, whiskers: the steps' own ratios, band: the baseline's "
            "spread):", ""] + [f"![{t}]({img_prefix}{t}.png)" for t in c["tiers"]]
    out += ["", "Commands:", ""] + [f"- `{x}`" for x in c["commands"]]
    out += ["", "Differences from the official scripts (the harness's):", ""] + [f"- {d}" for d in c["deviations"]]
    if sb.get("l64"):
        out += ["", f"## 64-layer confirmation (mode {sb['l64']['mode']}, {sb['l64']['requests_per_tier']} requests)",
                ""] + _serve_table(sb["l64"], with_score=False)
    if sb.get("kv8_load"):
        k = sb["kv8_load"]
        out += ["", f"## 8-bit KV under load ({k['profile']} KV budget, {k['requests_per_tier']} requests, "
                f"{k['full']} vs {k['base']})", ""] + _serve_table(k, with_score=False)
    if sb.get("e2e"):
        e = sb["e2e"]
        out += ["", f"## Concurrency 1, offline engine ({e['layers']} layers, TPOT over {e['out_tokens']} tokens; "
                f"ratios to {e['base']})", "", "| config | input | TTFT ms | x base | TPOT ms | x base |",
                "|---|---:|---:|---:|---:|---:|"]
        for name, rows in e["ratios"].items():
            for n, v in rows.items():
                out.append(f"| {name} | {n} | {v['ttft_ms']:.1f} | {r3(v['ttft_ratio'])} | {v['tpot_ms']:.3f} | "
                           f"{r3(v['tpot_ratio'])} |")
        out += ["", "| config | engine start s | first request s (per length) | Triton compiles after start | "
                "autotuning after start |", "|---|---:|---|---|---|"]
        for name, v in e["configs"].items():
            fr = ", ".join(f"{n}: {s}" for n, s in v["first_request_s"].items()) or "-"
            ca = v["compiled_after_start"]
            aa = v["autotuned_after_start"]
            out.append(f"| {name}{' (FAILED)' if v['failed'] else ''} | {v['start_s'] if v['start_s'] is not None else '-'}"
                       f" | {fr} | {'not logged' if ca is None else (', '.join(ca) or 'none')} | "
                       f"{'not logged' if aa is None else (', '.join(aa) or 'none')} |")
    if sb.get("robustness"):
        r = sb["robustness"]
        out += ["", f"## Robustness: {'PASS' if r['pass'] else 'FAIL'}", "",
                "| config | pass | engine deaths | preemptions | KV after drain | GPU memory growth MiB | why |",
                "|---|---|---:|---:|---:|---:|---|"]
        for name, v in r["configs"].items():
            out.append(f"| {name} | {'yes' if v['pass'] else 'no'} | {v['engine_deaths']} | {v['preemptions']} | "
                       f"{v['kv_usage_after_drain']} | {v['gpu_memory_growth_mib']} | "
                       f"{v['skipped'] or '; '.join(v['why']) or '-'} |")
    out += ["", "README's headline (`python -m bench.scoreboard --readme` writes it; `tests/test_scoreboard.py` holds "
            "the two equal):", "", headline(sb)]
    return "\n".join(out) + "\n"


def plot_tier(sb: dict, tier: str, path: str) -> None:
    """One PNG: the tier's three ratios (bars), the steps' own ratios (whiskers), the baseline's spread (band)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kernels.results_io import save_figure

    row = sb["contest"]["tiers"][tier]
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for i, (k, title) in enumerate(RATIO_KEYS):
        v, steps, sp = row["ratio"][k], row["step_ratios"][k], row["base_spread"][k]
        # the pooled ratio need not lie between the steps' own (one step may hold the candidate's only run)
        lo, hi = (min(*steps, v), max(*steps, v)) if steps else (v, v)
        ax.bar(i, v, color="#4878a8", width=0.6)
        ax.errorbar(i, v, yerr=[[v - lo], [hi - v]], color="black", capsize=6)
        if sp:
            ax.fill_between([i - 0.4, i + 0.4], 1 - sp / 2, 1 + sp / 2, color="#e0a040", alpha=0.35, lw=0)
        ax.text(i, v, f"{v:.3f}", ha="center", va="bottom", fontsize=8)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(RATIO_KEYS)), [t for _, t in RATIO_KEYS])
    ax.set_ylabel("x 0.18.1 (tok/s: higher is better)")
    ax.set_title(f"{tier}: commit {sb['commit']}, {sb['date']}")
    save_figure(fig, path, dpi=90)
    plt.close(fig)
