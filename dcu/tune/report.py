"""From measured sides to the tuned file's path decisions, and the decision table the run prints last."""
from __future__ import annotations

from .common import Side


def decide(side: Side, upstream_name: str = "upstream") -> dict:
    """``paths[side.path]``: ours when it ran, matched upstream and took less time; else upstream, with why."""
    if side.failure:
        if side.failure.startswith("upstream failed"):
            return {"use": "ours", "ratio": None, "why": f"{side.failure}; ours ran, not compared"}
        return {"use": "upstream", "ratio": None, "why": side.failure}
    ratio = side.ratio
    if ratio is None:
        return {"use": "upstream", "ratio": None, "why": "not measured"}
    per_case = " / ".join(f"{o / u:.2f}x" for o, u in zip(side.ours_us, side.upstream_us))
    where = ", ".join(side.cases)
    how = "total time; per case" if side.by_total_time else "geomean of"
    detail = f"at {where}" + (f" ({how} {per_case})" if len(side.cases) > 1 else "")
    if side.launch != "table":
        detail += ", chosen launch"
    if ratio < 1.0:
        return {"use": "ours", "ratio": round(ratio, 4), "why": f"measured {ratio:.2f}x {upstream_name} {detail}"}
    return {"use": "upstream", "ratio": round(ratio, 4),
            "why": f"measured {ratio:.2f}x {upstream_name} {detail}: {upstream_name} is faster"}


def table(paths: dict, launch: dict, gemv: dict) -> str:
    """The decision table: one line per launch kind, the launch overrides, the GEMV's choices per row bucket."""
    width = max([len(p) for p in paths] + [4])
    lines = [f"{'path':<{width}}  use       ratio  why"]
    for path, e in paths.items():
        ratio = "-" if e["ratio"] is None else f"{e['ratio']:.3f}"
        lines.append(f"{path:<{width}}  {e['use']:<8} {ratio:>6}  {e['why']}")
    for family, override in launch.items():
        lines.append(f"launch {family}: {override}")
    if gemv:
        buckets = [(shape, b, e) for shape, per in gemv.items() for b, e in per.items()]
        ours = sum(e["choice"] == "triton" for _, _, e in buckets)
        lines.append(f"gemv: the Triton GEMV in {ours} of {len(buckets)} (shape, row bucket) pairs")
        for shape, per in gemv.items():
            cells = []
            for b, e in per.items():
                t = "-" if e["triton_us"] is None else f"{e['triton_us']:.1f}"
                p = "-" if e["platform_us"] is None else f"{e['platform_us']:.1f}"
                cells.append(f"{b}: {e['choice']} {t}/{p} us")
            lines.append(f"  {shape}: " + "; ".join(cells))
    return "\n".join(lines)
