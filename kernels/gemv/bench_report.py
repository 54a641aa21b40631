"""The GEMV bench's report (kernels/gemv/bench.py): the main table, the --variants table with each shape's best side,
and the relative error the rows carry.
"""
from .bench_sweep import VARIANT_ROWS


def rel_error(y, ref):
    return float((y.double() - ref).norm() / ref.norm().clamp_min(1e-300))


def markdown(meta, rows):
    out = [f"# Decode GEMV: {meta['device']}", "", f"Command: `{meta['command']}`", "",
           f"Device copy bandwidth (read + write): {meta['copy_GBps']:.0f} GB/s. Platform GEMM: F.linear "
           f"({meta['platform']}); for the fused row, F.linear then a separate SiLU-and-mul kernel. bf16, no bias.",
           f"GEMV configuration: {meta['config_source']}. Times in us per call, CUDA/HIP-graph replay, median of 7;"
           " weights rotated through copies larger than the L2 cache.",
           "GB/s = (W + x + out) bytes / time; % = of copy bandwidth; T/P = GEMV time / platform time (< 1: GEMV"
           " faster); pick = the dispatch's choice (GEMV only when > 1% faster); err = ||y - y64|| / ||y64||"
           " against float64.", "",
           "| GEMM | N x K | rows | GEMV us | GB/s | % copy | platform us | GB/s | % copy | T/P | pick | "
           "GEMV err | platform err | config |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cfg = " ".join(f"{k}={v}" for k, v in r["config"].items())
        out.append(f"| {r['op']} | {r['n']}x{r['k']} | {r['rows']} | {r['triton_us']:.1f} | {r['triton_GBps']:.0f} | "
                   f"{r['triton_pct']:.0f}% | {r['platform_us']:.1f} | {r['platform_GBps']:.0f} | "
                   f"{r['platform_pct']:.0f}% | {r['ratio']:.3f} | {r['pick']} | {r['triton_err']:.1e} | "
                   f"{r['platform_err']:.1e} | {cfg} |")
    return "\n".join(out) + "\n"


def variants_markdown(meta, rows):
    what = ("named launch options (--try)" if meta.get("tries") else "K loop pipelining (K_STAGES)")
    rows_txt = ", ".join(map(str, meta.get("variant_rows", [VARIANT_ROWS])))
    out = [f"# Decode GEMV, {what} at {rows_txt} row(s): {meta['device']}", "",
           f"Command: `{meta['command']}`", "",
           (f"Device copy bandwidth (read + write, timed eagerly): {meta['copy_GBps']:.0f} GB/s. Platform: F.linear "
            f"({meta['platform']}; for the fused row, then a separate SiLU-and-mul kernel). bf16, no bias. us per "
            "call, CUDA/HIP-graph replay, median of 7, all sides of a shape interleaved in one call; weights rotated "
            "through copies larger than the L2 cache."),
           ("% copy = (W + x + out) bytes / time / copy bandwidth; /platform = time / platform time, /table = time / "
            "table time (< 1: faster); err = ||y - y64|| / ||y64||; table = launch_params' entry for the shape; "
            "plain / kS = the same tiles with the K loop plain / pipelined K_STAGES S deep; other sides: --try "
            "options merged over the table's (config column); * = fastest GEMV side; read bBxP = the read roof, a "
            "Triton kernel that only streams W (P programs per SM, B elements a step; no xP: one program per B "
            "elements), read torch.sum = torch's float32 sum of W; timed once per shape in the first rows' call, "
            "% copy of W's bytes."),
           "",
           "| GEMM | N x K | rows | side | us | % copy | /platform | /table | err | config |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cfg = " ".join(f"{k}={v}" for k, v in r["config"].items()) if r["config"] else "F.linear"
        star = " *" if r["best"] else ""
        err = "-" if r["err"] is None else f"{r['err']:.1e}"
        out.append(f"| {r['op']} | {r['n']}x{r['k']} | {r['rows']} | {r['side']}{star} | {r['us']:.1f} | "
                   f"{r['pct']:.0f}% | {r['ratio']:.3f} | {r['vs_table']:.3f} | {err} | {cfg} |")
    out += ["", "Best GEMV side per shape (a per-shape K_STAGES entry pays where /table is clearly below 1; "
            "read roof = the best read side of the shape):", "",
            "| GEMM | N x K | rows | best | % copy | /platform | /table | table % copy | platform % copy "
            "| read roof % copy |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    by_key, roof = {}, {}
    for r in rows:
        if r["err"] is None:  # a read roof side
            roof[(r["op"], r["n"], r["k"])] = max(roof.get((r["op"], r["n"], r["k"]), 0.0), r["pct"])
        else:
            by_key.setdefault((r["op"], r["n"], r["k"], r["rows"]), {})[r["side"]] = r
    for (op, n, k, nrows), sides in by_key.items():
        best = next(r for r in sides.values() if r["best"])
        read = roof.get((op, n, k))
        out.append(f"| {op} | {n}x{k} | {nrows} | {best['side']} | {best['pct']:.0f}% | {best['ratio']:.3f} | "
                   f"{best['vs_table']:.3f} | {sides['table']['pct']:.0f}% | {sides['platform']['pct']:.0f}% | "
                   f"{'-' if read is None else f'{read:.0f}%'} |")
    return "\n".join(out) + "\n"
