"""The GEMV bench's sweep and --variants grid (kernels/gemv/bench.py): the explicit K splits tried, the K loop
pipelining sides, the bounded sweep over launch configurations and the launch_params entry it supports.
"""
import json
import time

from ..bench_common import geomean, log
from . import launch_params

VARIANT_ROWS = 1
VARIANT_STAGES = (2, 3, 4)


def split_candidates(n_out: int) -> list:
    """Explicit K splits tried (stage 2) where N alone gives few programs."""
    if n_out < 1024:
        return [4, 8, 16]
    if n_out <= 8192:
        return [1, 2, 4]
    return []


def variant_grid(table_cfg: dict) -> dict:
    """Named launch configurations --variants times against a shape's table entry ``table_cfg`` at one row:
    the same tiles, grid and split with the K loop plain ("plain") or pipelined K_STAGES 2 / 3 / 4 deep
    ("k2" / "k3" / "k4": tl.range(num_stages=K_STAGES), async copies into shared memory on the FMA path
    too, K_STAGES - 1 W tiles in flight per program); a side equal to the table entry is left out.
    Measured on the H200 (2026-12-02, the sm90 table's comment): K_STAGES 3 helps at one row for the
    N = 5120 shapes only; at 2-8 rows (the dot path, already pipelined by num_stages) it was slower, and
    so was stream-K everywhere (removed), so neither is in the grid."""
    plain = {k: v for k, v in table_cfg.items() if k != "K_STAGES"}
    grid = {"plain": plain, **{f"k{s}": dict(plain, K_STAGES=s) for s in VARIANT_STAGES}}
    return {name: cfg for name, cfg in grid.items() if cfg != table_cfg}


def cfg_key(cfg):
    return json.dumps(cfg, sort_keys=True)


def sweep(ops, rocm, deadline, rows_out, rows_list, sweep_grid, timed):
    """{(op name, bucket): {cfg_key: us}} for the grid (stage 1, split from the policy) and explicit
    splits of the two best configurations where N is small (stage 2). Stops adding work at ``deadline``. The bench
    passes its row counts, grid (``sweep_grid(rows, rocm, silu)``) and timer (``timed(calls, copies)``): --smoke's."""
    results = {}
    skipped = 0
    for stage in (1, 2):
        for op in ops:
            for rows in rows_list:
                res = results.setdefault((op.name, rows), {})
                if stage == 1:
                    cands = sweep_grid(rows, rocm, op.silu)
                else:
                    best = sorted(res.items(), key=lambda kv: kv[1])[:2]
                    cands = [dict(json.loads(k), SPLIT_K=s) for k, _ in best for s in split_candidates(op.n_out)
                             if "SPLIT_K" not in json.loads(k)]
                for cfg in cands:
                    if time.time() > deadline:
                        skipped += 1
                        continue
                    key = cfg_key(cfg)
                    if key in res:
                        continue
                    t0 = time.time()
                    try:
                        us = timed({"triton": op.triton(rows, cfg)}, op.copies)["triton"]
                    except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: record, go on
                        rows_out.append(dict(op=op.name, rows=rows, config=cfg, error=f"{type(e).__name__}: {e}"[:200]))
                        log(f"sweep {op.name} rows {rows} {cfg}: {type(e).__name__}: {str(e)[:120]}")
                        continue
                    res[key] = us
                    rows_out.append(dict(op=op.name, rows=rows, config=cfg, us=round(us, 2)))
                    log(f"sweep {op.name} rows {rows} {cfg}: {us:.1f} us ({time.time() - t0:.1f} s)")
    if skipped:
        log(f"sweep: {skipped} configurations skipped at the --budget-s deadline")
    return results, skipped


def suggest_entry(target, ops, results, base, rows_list):
    """The launch_params entry the sweep supports: per row bucket (plain and fused) the configuration with
    the best geometric mean of time / the shape's best time over the shapes it ran on; per-shape
    overrides where a shape's own best (incl. an explicit SPLIT_K) is > 3% faster than that."""
    entry = json.loads(json.dumps(base))
    entry["measured"] = True
    entry["shapes"] = {}
    for silu, table in ((False, "rows"), (True, "silu_rows")):
        group = [op for op in ops if op.silu == silu]
        if not group:
            continue
        for rows in rows_list:
            per_op = [results.get((op.name, rows), {}) for op in group]
            per_op = [r for r in per_op if r]
            if not per_op:
                continue
            common = set.intersection(*(set(k for k in r if "SPLIT_K" not in json.loads(k)) for r in per_op))
            if not common:
                continue
            score = {k: geomean([r[k] / min(r.values()) for r in per_op]) for k in common}
            default = min(score, key=score.get)
            entry[table][str(rows)] = json.loads(default)
            for op in group:
                r = results.get((op.name, rows), {})
                if not r or default not in r:
                    continue
                best = min(r, key=r.get)
                if r[best] < 0.97 * r[default]:
                    cfg = json.loads(best)
                    diff = {k: v for k, v in cfg.items() if entry[table][str(rows)].get(k) != v}
                    name = launch_params.shape_name(op.n, op.k, op.silu)
                    entry["shapes"].setdefault(name, {})[str(rows)] = diff
    # the entry must pass the table's own validation
    text = json.dumps({k: entry[k] for k in ("rows", "silu_rows", "shapes")})
    launch_params.get_params(target, override=text)
    return entry
