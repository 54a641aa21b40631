"""The decode bench's parameter sweep (kernels/decode_attention/bench.py without --quick): the launch candidates per
KV width, the kv8 entry to suggest from their times, and the sweep over them and the split policy. A sweep over launch
parameters (BLOCK_N, num_warps, num_stages) and the split policy (programs_per_cu, min_split_tokens) picks one
configuration per KV width (kv8: the one fastest for software fp8, with the int8-fastest one's differences as its
"int8" options). The bench passes
its timing (``measure``) and shapes in, so --dry-run's toy shapes reach the sweep.
"""
import itertools
import time

import torch

from ..bench_common import geomean, log
from . import launch_params


def launch_grid():
    """(BLOCK_N, num_warps, num_stages[, waves_per_eu]) candidates per KV width, kept small: every one is a compile."""
    if torch.version.hip:
        grid = [(16, 4, 1, 2), (32, 4, 1, 1), (32, 4, 1, 2), (32, 8, 1, 2), (32, 4, 2, 2), (64, 4, 1, 2), (64, 8, 1, 2)]
        cfgs = [dict(BLOCK_N=bn, num_warps=w, num_stages=st, waves_per_eu=we, matrix_instr_nonkdim=16)
                for bn, w, st, we in grid]
        # page_loop buffers num_stages - 1 tiles (H200: 0.90x of the table's 8-bit time at BLOCK_N 64 / 3 stages);
        # compiled for gfx90a, int8 at BLOCK_N 32 takes 218 / 242 VGPRs and 16 / 32 KiB LDS at 2 / 3 stages, no spills
        paged = [dict(BLOCK_N=32, num_warps=4, num_stages=st, waves_per_eu=2, matrix_instr_nonkdim=16, page_loop=1)
                 for st in (2, 3)]
        # int8 x int8 QK^T (int8 caches; fp8 rows run as without it): K never converted, 181 VGPRs against 226 for
        # gfx90a at BLOCK_N 32 / 1 stage
        int8_qk = [dict(BLOCK_N=32, num_warps=4, num_stages=1, waves_per_eu=2, matrix_instr_nonkdim=16, int8_qk=1)]
        # even_splits (H200: 0.97-0.99x the 8-bit time, 1.03-1.07x bf16's at batch 4): tiles spread evenly over the
        # wanted splits, so every split of a short sequence has work
        even = [dict(c, even_splits=1) for c in paged + int8_qk]
        return {"kv16": cfgs, "kv8": cfgs + paged + int8_qk + even}
    kv16 = [(32, 4, 2), (32, 4, 3), (64, 4, 2), (64, 4, 3), (64, 8, 3), (128, 4, 2), (128, 8, 2), (128, 8, 3)]
    # kv8: (BLOCK_N, num_warps, num_stages, early_convert, page_loop)
    # (32, 4, 2|3, 1): 125 registers in compile_check (BLOCK_N 64: 146-167); (32, 4, 2, 1) ran
    # 0.84x of bf16 at batch 64 on the H200 (2026-12-02, sixth session) but slower than BLOCK_N 64 at batch 1-16.
    # page_loop 1 buffers num_stages - 1 tiles: (64, 4, 3, 1, 1) ran 0.90-0.91x of (64, 4, 2, 1, 0) overall on the
    # H200 (eighth session), slower at batch 16 (split waves)
    kv8 = [(64, 4, 2, 2, 0), (64, 4, 2, 1, 0), (64, 4, 2, 0, 0), (64, 4, 3, 0, 0), (32, 4, 2, 1, 0), (32, 4, 3, 1, 0),
           (64, 4, 3, 1, 1), (64, 4, 3, 0, 1), (32, 4, 4, 0, 1), (32, 4, 4, 1, 1), (32, 4, 5, 0, 1), (128, 4, 2, 0, 0)]
    # split_round explicit in every kv8 candidate (an override merges over the table's entry, so int8_qk comes from
    # the table's): "down" with page_loop,
    # whose shared memory leaves 2 programs per SM (ninth session: 0.76-0.81x of the round-up plan's time at batch 16,
    # 0.94x at batch 64)
    return {"kv16": [dict(BLOCK_N=bn, num_warps=w, num_stages=st) for bn, w, st in kv16],
            "kv8": [dict(BLOCK_N=bn, num_warps=w, num_stages=st, early_convert=e, page_loop=pl,
                         split_round="down" if pl else "up") for bn, w, st, e, pl in kv8]}


def kv8_entry(scored):
    """The kv8 entry to suggest from ``scored`` = [(config, {"int8_pth": [us, ...], "fp8_pth_sw": [us, ...]})]:
    the configuration fastest for fp8 (software decode, the DCU's path), with the int8-fastest one's differences
    as its ``"int8"`` options (int8_qk, which fp8 caches ignore, at its top level), so each kind runs at its own best;
    the jointly fastest configuration when the two differ in anything an int8 sub-entry cannot carry (the split
    plan: split_round, programs_per_cu)."""
    def fastest(*dtypes):
        return min(scored, key=lambda s: geomean([t for d in dtypes for t in s[1][d]]))[0]

    fp8, int8 = fastest("fp8_pth_sw"), fastest("int8_pth")
    defaults = launch_params.LAUNCH_DEFAULTS  # a key a candidate leaves out counts as what the launcher takes
    keys = set(fp8) | set(int8)
    own = {k: int8.get(k, defaults.get(k)) for k in sorted(keys)
           if int8.get(k, defaults.get(k)) != fp8.get(k, defaults.get(k))}
    if (any(k not in defaults and (k not in fp8 or k not in int8) for k in keys)
            or set(own) - {"int8_qk", *launch_params._INT8_KEYS}):
        return dict(fastest("int8_pth", "fp8_pth_sw"))
    entry = dict(fp8)
    if "int8_qk" in own:
        entry["int8_qk"] = own.pop("int8_qk")
    if own:
        entry["int8"] = own
    return entry


def sweep(pools, rows, measure, grid, sweep_shapes, split_shapes):
    """The entry the sweep supports (kv16, kv8, programs_per_cu, min_split_tokens); ``rows`` gets one row per
    candidate. ``measure(pools, dtype, shapes, override)``: us per shape; ``grid``: launch_grid()'s candidates."""
    best = {}
    # kv8 serves fp8 and int8: scored on int8 and on the software fp8 decode (the DCU's path), each kind's times kept
    # apart so the suggestion can give int8 its own launch options (kv8_entry)
    for kind, dtypes in (("kv16", ("bf16",)), ("kv8", ("int8_pth", "fp8_pth_sw"))):
        scored = []
        for cfg in grid[kind]:
            t0 = time.time()
            try:
                by_dtype = {dtype: measure(pools, dtype, sweep_shapes, {kind: cfg}) for dtype in dtypes}
            except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: record and go on
                rows.append(dict(sweep="launch", kv=kind, config=cfg, error=f"{type(e).__name__}: {str(e)[:120]}"))
                continue
            times = [t for dtype in dtypes for t in by_dtype[dtype]]
            scored.append((cfg, by_dtype))
            rows.append(dict(sweep="launch", kv=kind, dtypes=dtypes, config=cfg, shapes=sweep_shapes,
                             us=[round(t, 1) for t in times], geomean_us=round(geomean(times), 2)))
            log(f"sweep {kind} {cfg}: {[round(t, 1) for t in times]} us ({time.time() - t0:.1f} s)")
        if kind == "kv8":
            best[kind] = kv8_entry(scored)
        else:
            best[kind] = min(scored, key=lambda s: geomean(s[1]["bf16"]))[0]
    split_scored = []
    for ppc, msplit in itertools.product((1, 2, 3, 4, 8), (64, 128, 256, 512)):
        override = dict(kv16=best["kv16"], kv8=best["kv8"], programs_per_cu=ppc, min_split_tokens=msplit)
        times = measure(pools, "bf16", split_shapes, override) + measure(pools, "int8_pth", split_shapes, override)
        split_scored.append((geomean(times), ppc, msplit))
        rows.append(dict(sweep="splits", programs_per_cu=ppc, min_split_tokens=msplit, shapes=split_shapes,
                         us=[round(t, 1) for t in times], geomean_us=round(split_scored[-1][0], 2)))
        log(f"sweep splits ppc={ppc} min_split={msplit}: {[round(t, 1) for t in times]} us")
    _, ppc, msplit = min(split_scored)
    return dict(kv16=best["kv16"], kv8=best["kv8"], programs_per_cu=ppc, min_split_tokens=msplit)
