"""The decode bench's report (kernels/decode_attention/bench.py): the markdown table, the summary of ratios, the
cost per token and fixed cost, the bandwidth plot, reading an earlier run's rows (--compare, --summary), and the
splits column's label. Pure Python over the rows (matplotlib for the plot only).
"""
import json
import sys

from ..bench_common import geomean
from ..results_io import save_figure
from .planning import launch_plan

DTYPES = ("bf16", "fp8_pth_hw", "fp8_pth_sw", "int8_pth")  # the row kinds: bf16 and the 8-bit caches


def plot(rows, copy_gbps, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({r["batch"] for r in rows})
    ctxs = sorted({r["ctx"] for r in rows})
    fig, axes = plt.subplots(1, len(batches), figsize=(4 * len(batches), 3.6), sharey=True, squeeze=False)
    axes = axes[0]
    for ax, batch in zip(axes, batches):
        for dtype in DTYPES + ("baseline_bf16",):
            pts = [(r["ctx"], r["GBps"]) for r in rows if r["batch"] == batch and r["dtype"] == dtype]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=dtype, linestyle="--" if dtype.startswith("baseline") else "-")
        ax.axhline(copy_gbps, color="k", linewidth=0.8)
        ax.text(ctxs[0], copy_gbps * 1.01, "device copy", fontsize=7)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ctxs, [f"{c // 1024}K" if c % 1024 == 0 else str(c) for c in ctxs])
        ax.set_title(f"batch {batch}")
        ax.set_xlabel("context")
    axes[0].set_ylabel("KV bytes read / time (GB/s)")
    axes[0].set_ylim(0, copy_gbps * 1.1)
    axes[-1].legend(fontsize=7)
    fig.suptitle("decode attention, Qwen3.5-27B (24/4 heads x 256): achieved bandwidth vs the copy roof")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def markdown(meta, rows):
    stages = any("stage1_us" in r for r in rows)  # --stage-times (stage 2 is absent where one split wrote the output)
    out = [f"# Decode attention: {meta['device']}", "", f"Command: `{meta['command']}`", "",
           f"Device copy bandwidth (read + write): {meta['copy_GBps']:.0f} GB/s. Baseline: {meta['baseline']}.",
           f"Configuration: target `{meta['target']}`, {json.dumps(meta['config'])}"
           f" ({'from the sweep' if meta['swept'] else 'from launch_params / env'})."
           + "".join(f" Rows `dtype [{k}]`: kv8 {json.dumps(v)}." for k, v in meta.get("kv8_variants", {}).items()),
           "Times in us per call (both stages), CUDA-graph replay, median"
           + (" (one call per replay, L2 flushed before each)." if meta.get("calls_per_graph", 1) == 1 else
              f" (graphs of {meta['calls_per_graph']} calls on different pages, no flush: per-call time as in a"
              " captured decode step).")
           + (" Rows `[...Vdim]` / `[...Vtok]`: 8-bit V read as if stored by dim (tokens contiguous) / by token,"
              " not as the cache stores it (int8 by dim, fp8 by token)." if meta.get("v_layouts") else "")
           + (f" Lengths `{meta['lens'][0]}:{meta['lens'][1]}` (batch_lengths): ctx is the batch's longest sequence,"
              " GB/s counts the bytes of the actual lengths." if meta.get("lens") else "")
           + (" Splits `bN`: launch key balance shares N programs per kv head out by length."
              if any(str(r.get("splits", "")).startswith("b") for r in rows) else "")
           + " GB/s = KV bytes read / time;"
           " % = of copy bandwidth; x UA = speedup over unified_attention on bf16 KV;"
           " x bf16 = our time / our bf16 time."
           + (" Stage 1 / 2 us: each stage's kernel time per call (profiler, same graphs); rest = us - both"
              " (launch gaps, ramps; the profiler's replays run apart from the timed ones)." if stages else ""), "",
           "| dtype | batch | ctx | splits | us | GB/s | % copy | UA us | x UA | x bf16 |"
           + (" stage 1 us | stage 2 us | rest us |" if stages else ""),
           "|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if stages else "")]
    for r in rows:
        if r["dtype"].startswith("baseline"):
            continue
        ctx = f"{r['ctx'] // 1024}K" if r["ctx"] % 1024 == 0 else str(r["ctx"])
        line = (f"| {r['dtype']} | {r['batch']} | {ctx} | {r['splits']} | {r['us']:.1f} | "
                f"{r['GBps']:.0f} | {r['pct_copy']:.0f}% | {r.get('baseline_us', '') or '-'} | "
                f"{r.get('speedup_vs_ua', '') or '-'} | {r.get('ratio_vs_bf16', '') or '-'} |")
        if stages:
            s1, s2 = r.get("stage1_us"), r.get("stage2_us", 0.0 if r.get("stage1_us") is not None else None)
            line += (f" {s1:.1f} | {s2:.1f} | {r['us'] - s1 - s2:.1f} |" if s1 is not None else " - | - | - |")
        out.append(line)
    return "\n".join(out) + "\n"


def _times_by_kind(rows) -> dict:
    """{row kind: {(batch, ctx): us}} of our rows (the unified-attention baseline's left out)."""
    times = {}
    for r in rows:
        if r["dtype"] != "baseline_bf16":
            times.setdefault(r["dtype"], {})[(r["batch"], r["ctx"])] = r["us"]
    return times


def load_rows(path: str, flag: str) -> list:
    """The rows of an earlier run's JSON; exits with one line naming ``flag`` when it is not one."""
    try:
        with open(path) as f:
            rows = json.load(f)["rows"]
        if not isinstance(rows, list) or not all({"dtype", "batch", "ctx", "us"} <= set(r) for r in rows):
            raise ValueError("rows without dtype / batch / ctx / us")
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"error: {flag} {path}: not a decode bench JSON ({e})")
    return rows


def summary_markdown(rows, compare_rows=None, compare_label="compared"):
    """One line per row kind (dtype, or "dtype [variant]"): geomean over the contexts of time / bf16's time per
    batch, of time / the same dtype's table rows (variants), and of time / an earlier run's rows of the same dtype
    (``compare_rows``, e.g. the kernel before a change benchmarked in the same call)."""
    times = _times_by_kind(rows)
    earlier = _times_by_kind(compare_rows or [])
    batches = sorted({b for t in times.values() for b, _ in t})

    def ratio(mine, other, keys):
        keys = [k for k in keys if k in other]
        return f"{geomean([mine[k] / other[k] for k in keys]):.3f}" if keys else "-"

    head = ["rows", *(f"x bf16, batch {b}" for b in batches), "x table", f"x {compare_label}"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for kind, mine in times.items():
        dtype = kind.split(" [")[0]
        cells = [ratio(mine, times.get("bf16", {}), [k for k in mine if k[0] == b]) if kind != "bf16" else "1"
                 for b in batches]
        cells.append(ratio(mine, times[dtype], list(mine)) if kind != dtype and dtype in times else "-")
        cells.append(ratio(mine, earlier[dtype], list(mine)) if dtype in earlier else "-")
        out.append(f"| {kind} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def cost_fit(points):
    """Least squares ``us = fixed + per_token x ctx`` over (ctx, us) points (two contexts at least): (us per 1024
    tokens of context, fixed us)."""
    n = len(points)
    mx, my = sum(c for c, _ in points) / n, sum(t for _, t in points) / n
    slope = sum((c - mx) * (t - my) for c, t in points) / sum((c - mx) ** 2 for c, _ in points)
    return slope * 1024, my - slope * mx


def cost_markdown(rows):
    """Per row kind and batch, the time as a fixed part plus a part per token of context (least squares over the
    run's contexts), the per-token part also over bf16's: 8-bit KV moves half the bytes per token, so ~0.5x there
    means the tiles stream at bf16's bandwidth, and what the per-token ratio leaves to the total ratio is the fixed
    part (launches, prologues, the merge)."""
    points = {}  # {kind: {batch: [(ctx, us)]}}
    for kind, mine in _times_by_kind(rows).items():
        for (batch, ctx), us in mine.items():
            points.setdefault(kind, {}).setdefault(batch, []).append((ctx, us))
    batches = sorted({b for per in points.values() for b in per})
    fits = {kind: {b: cost_fit(pts) for b, pts in per.items() if len(pts) > 1} for kind, per in points.items()}
    head = ["rows", *(f"batch {b}: us / 1K tokens (x bf16) + fixed us" for b in batches)]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for kind, fit in fits.items():
        cells = []
        for b in batches:
            if b not in fit:
                cells.append("-")
                continue
            per, fixed = fit[b]
            bf = fits.get("bf16", {}).get(b)
            cells.append(f"{per:.2f}" + (f" ({per / bf[0]:.2f}x)" if bf and kind != "bf16" else "") + f" + {fixed:.1f}")
        out.append(f"| {kind} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def splits_label(c):
    """The launcher's split plan for case ``c`` (the Gluon stage 1's where it takes the call): splits per sequence,
    or "b" and the programs per kv head that launch key balance shares out by length."""
    plan, _ = launch_plan(c["q"], c["k"], c["v"], c.get("kv_quant"))
    return f"b{plan.programs}" if plan.programs else plan.splits
