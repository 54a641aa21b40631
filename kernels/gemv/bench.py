"""Microbenchmark: the decode GEMV vs the platform GEMM (F.linear: cuBLAS / hipBLASLt) at Qwen3.5-27B's shapes.

    python -m kernels.gemv.bench [--out DIR] [--quick] [--budget-s S] [--tag T] [--smoke] [--variants]

Every dense decode GEMM of Qwen3.5-27B (N x K, bf16, no bias) at 1, 2, 4 and 8 rows, plus gate_up
fused with SiLU-and-mul against F.linear followed by a separate SiLU-and-mul kernel. Needs only torch
and Triton (no vLLM). Every side is captured in a CUDA/HIP graph and replayed (median of 7 replays;
kernels/gemv/dispatch.py's timer, the one vLLM's dispatch uses at startup); weights smaller than
twice the L2 cache are rotated through enough copies that each call reads memory. GB/s = (W + x +
out) bytes / time; % = of a measured device copy (read + write bytes / time).

First a bounded sweep of launch parameters per (shape, row bucket) (--quick skips it and uses the
table or VLLM_DCU_GEMV_PARAMS; --budget-s caps it, default 150 s), then the main table with the
best configuration found, what the dispatch would pick (the GEMV must be > 1% faster), and the
relative error of both sides against float64. Prints the suggested launch options (VLLM_DCU_GEMV_PARAMS) for this
device, then the table last; writes <date>-<gpu>-gemv[-<tag>].{json,md} into --out (default $OUT or
bench/results/). On one H200 the whole run takes about 2-3 minutes, most of it Triton compiles.
--smoke runs the same code on the CPU (TRITON_INTERPRET=1) at toy shapes, to test the script.

--variants (issue #14, instead of the sweep and the main table): every shape above at one row, the
table's configuration against the same tiles, grid and split with the K loop plain or pipelined
K_STAGES 2 / 3 / 4 deep (variant_grid) and the platform GEMM, all sides of a shape timed in one
interleaved call; prints one line per side with % of copy bandwidth, time / platform and time / table
time, and the best side per shape. About 15 Triton compiles and well under 2 minutes on one H200;
writes <date>-<gpu>-gemv-variants.{json,md}.
--variants --try LABEL=JSON (repeatable) times named launch options instead of the K_STAGES grid: JSON is
merged over the table's entry of each row bucket, either one object for every bucket
('f8k3={"DOT":0,"BLOCK_N":8,"BLOCK_K":512,"K_STAGES":3}') or one per bucket ('{"2":{...},"4":{...}}', buckets
left out are not tried); --rows 1,2,4,8 and --shapes 5120x6144,... (N x K) choose the cases.
Every shape's first call also times the read roof: a Triton kernel that only streams W's bytes (sums them), in
three launch shapes (READ_ROOF), and torch.sum of W, so a GEMV's % of copy bandwidth can be read against what a
plain read of the same bytes reaches at that size under the same timing (a small W's ramp-up and tail weigh more).
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

from ..bench_common import log, parse_label_json, result_base, write_report
from ..tuning.suggest import suggestion
from . import bench_sweep, dispatch, launch_params
from .bench_report import markdown, rel_error, variants_markdown
from .bench_sweep import VARIANT_ROWS, VARIANT_STAGES, split_candidates, variant_grid  # noqa: F401 - tested here

# (name, N, K, fused SiLU-and-mul): every dense decode GEMM of Qwen3.5-27B at TP 1
SHAPES = list(launch_params.QWEN35_27B_GEMMS)
ROWS = (1, 2, 4, 8)
DTYPE = torch.bfloat16
DEV = "cuda"
SMOKE = False


def smoke_setup():
    """--smoke: the whole flow in Triton's CPU interpreter at toy shapes; the numbers mean nothing."""
    global SHAPES, ROWS, DEV, SMOKE
    SHAPES = [("small-n", 6, 96, False), ("b+silu", 2 * 20, 48, True)]
    ROWS, DEV, SMOKE = (1, 4), "cpu", True
    # the tests' workarounds for Triton 3.6 interpreter bugs (numpy >= 2.4 loop bounds, bf16 tl.dot); the benchmark
    # runs from the repository root (python -m kernels.gemv.bench), where tests/ is importable
    import tests.triton_interp_compat  # noqa: F401



# --- sweep grid ---------------------------------------------------------------------------------

def sweep_grid(bucket: int, rocm: bool = False, silu: bool = False) -> list:
    """Launch configurations tried for a row bucket (every distinct one is a Triton compile, so the grid
    is small). DOT configurations compile once for all buckets (x is padded to 16 rows)."""
    if SMOKE:
        return [{"DOT": 0, "BLOCK_N": 4, "BLOCK_K": 16, "num_warps": 1, "num_stages": 1},
                {"DOT": 1, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 1, "num_stages": 1}]
    if rocm:
        extra = {"matrix_instr_nonkdim": 16}
        dot = [(16, 256, 4, 2), (16, 512, 4, 1), (32, 128, 4, 2), (32, 256, 4, 2), (64, 128, 4, 2)]
        fma = [(8, 512, 4), (16, 512, 4), (16, 256, 4), (32, 256, 8), (16, 1024, 8)]
    else:
        extra = {}
        dot = [(16, 256, 4, 3), (16, 512, 4, 3), (32, 128, 4, 4), (32, 256, 4, 3), (64, 128, 4, 4), (64, 256, 8, 3)]
        fma = [(8, 512, 4), (16, 512, 4), (16, 256, 4), (32, 256, 4), (16, 1024, 8), (32, 512, 8)]
    grid = [dict(DOT=1, BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=s, **extra) for bn, bk, w, s in dot]
    fma_cfgs = [dict(DOT=0, BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=1) for bn, bk, w in fma]
    if silu:  # two W tiles and two accumulators per step: half the rows per program
        fma_cfgs = [dict(c, BLOCK_N=max(1, c["BLOCK_N"] // 2)) for c in fma_cfgs]
    lanes = 64 if rocm else 32
    for c in fma_cfgs if bucket <= 2 else []:
        # at 2 rows only tiles whose accumulators take <= 64 registers per lane (compiled for sm90, 128
        # took 210-215 registers in all)
        per_lane = bucket * c["BLOCK_N"] * c["BLOCK_K"] * (2 if silu else 1) // (c["num_warps"] * lanes)
        if bucket == 1 or per_lane <= 64:
            launch_params.check_config(dict(c), "sweep", rocm=rocm, rows=bucket, silu_mul=silu)
            grid.append(c)
    return grid



# --- the read roof (--variants): what a plain streaming read of the same weight reaches ------------------------------

# (elements per loop step, programs per SM; 0: one program per step, no loop, as an elementwise kernel launches).
# H200, 2026-12-02 (tenth session): the looped form with 4 programs per SM reached 66-92% of copy bandwidth, below
# the GEMV itself at every shape (one load in flight per program), so the roof is the best of these and torch.sum
READ_ROOF = ((8192, 4), (4096, 0), (8192, 0))


def _read_roof_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def read_roof(w_ptr, out_ptr, numel, chunk, BLOCK: tl.constexpr):
        """Sum of this program's ``chunk`` elements of w (a multiple of BLOCK), one float per program: every byte of
        w read once, nothing else (no x, no products beyond one add per element)."""
        start = tl.program_id(0).to(tl.int64) * chunk
        acc = tl.zeros([BLOCK], tl.float32)
        for off in range(0, chunk, BLOCK):
            idx = start + off + tl.arange(0, BLOCK)
            acc += tl.load(w_ptr + idx, mask=idx < numel, other=0.0).to(tl.float32)
        tl.store(out_ptr + tl.program_id(0), tl.sum(acc, axis=0))

    return read_roof


def num_sms() -> int:
    return 2 if SMOKE else torch.cuda.get_device_properties(0).multi_processor_count


def read_sides() -> dict:
    """{label: config} of the read roof's sides: {"BLOCK": b, "programs_per_sm": p} for the Triton read,
    {"torch.sum": "float32"} for torch's."""
    shapes = ((64, 2), (64, 0)) if SMOKE else READ_ROOF
    sides = {f"read b{b}" + (f"x{p}" if p else ""): {"BLOCK": b, "programs_per_sm": p} for b, p in shapes}
    return sides | {"read torch.sum": {"torch.sum": "float32"}}


def reference(op, rows):
    """float64 result of ``op`` on its inputs of ``rows`` rows (the fused op: silu(gate) * up)."""
    ref = op.x[rows].double() @ op.w[0].double().T
    if op.silu:
        d = op.n_out
        ref = ref[:, :d] * torch.sigmoid(ref[:, :d]) * ref[:, d:]
    return ref



def parse_tries(items: list) -> dict:
    """--try LABEL=JSON items -> {label: {bucket: options}} (one object for every bucket, or one per bucket)."""
    out = {}
    for item in items:
        label, val = parse_label_json(item, "--try", reserved=("table", "platform"))
        buckets = [str(b) for b in launch_params.ROW_BUCKETS]
        if set(val) <= set(buckets):
            per = {int(b): cfg for b, cfg in val.items()}
        else:
            per = {b: val for b in launch_params.ROW_BUCKETS}
        for b, cfg in per.items():
            if not isinstance(cfg, dict):
                raise ValueError(f"--try {label}: bucket {b} must be an object of launch options")
        out[label] = per
    return out


def variant_sides(table: dict, rows: int, tries: dict) -> dict:
    """Named configurations timed against the table entry: --try's (merged over the table) or the K_STAGES grid."""
    if not tries:
        return variant_grid(table)
    sides = {}
    bucket = launch_params.row_bucket(rows)
    for label, per in tries.items():
        if bucket in per:
            cfg = launch_params.check_config({**table, **per[bucket]}, f"--try {label} (rows {rows})")
            if cfg != table:
                sides[label] = cfg
    return sides


def run_variants(ops, target, copy_gbps, rows_list=(VARIANT_ROWS,), tries=None):
    """--variants: rows of the report, one per (shape, rows, side)."""
    out = []
    for op in ops:
        for rows in rows_list:
            table = launch_params.config_for(target, op.n, op.k, rows, op.silu)
            sides = {"table": table, **variant_sides(table, rows, tries or {})}
            calls = {"platform": op.platform(rows)}
            calls.update({name: op.triton(rows, cfg) for name, cfg in sides.items()})
            reads = read_sides() if rows == rows_list[0] else {}  # W's bytes alone: once per shape
            calls.update({name: op.read(cfg) for name, cfg in reads.items()})
            t = timed(calls, op.copies)
            ref = reference(op, rows)
            gb = op.bytes(rows) / 1e9
            best = min(sides, key=lambda name: t[name])
            for name, fn in calls.items():
                # the read roof moves W's bytes only; its % copy counts those
                pct = 100 * (2 * op.n * op.k / 1e9 if name in reads else gb) / (t[name] * 1e-6) / copy_gbps
                out.append({"op": op.name, "n": op.n, "k": op.k, "silu_mul": op.silu, "rows": rows, "side": name,
                            "config": reads.get(name) or sides.get(name), "us": round(t[name], 2), "pct": pct,
                            "ratio": t[name] / t["platform"], "vs_table": t[name] / t["table"],
                            "err": None if name in reads else rel_error(fn(0), ref), "best": name == best})
            del ref
            log(f"{op.name} rows {rows}: platform {t['platform']:.1f} us, table {t['table']:.1f} us, best {best} "
                f"{t[best]:.1f} us")
        op.free()
    return out


# --- setup and timing ---------------------------------------------------------------------------

class Op:
    """One GEMM of the table: weight copies (enough to exceed the L2), inputs per row bucket."""

    def __init__(self, name, n, k, silu, l2_bytes):
        self.name, self.n, self.k, self.silu = name, n, k, silu
        self.n_out = n // 2 if silu else n
        g = torch.Generator(device=DEV).manual_seed(n * 7 + k)
        w = (torch.randn(n, k, generator=g, device=DEV) / math.sqrt(k)).to(DTYPE)
        self.copies = 1 if SMOKE else dispatch.l2_copies(w.numel() * w.element_size(), l2_bytes)
        self.w = [w] + [w.clone() for _ in range(self.copies - 1)]
        self.x = {r: torch.randn(r, k, generator=g, device=DEV).to(DTYPE) for r in ROWS}

    def bytes(self, rows):
        return 2 * (self.n * self.k + rows * self.k + rows * self.n_out)

    def triton(self, rows, cfg):
        from .gemv import gemv

        x = self.x[rows]
        return lambda i: gemv(x, self.w[i], None, silu_mul=self.silu, config=cfg)

    def read(self, config: dict):
        """A read roof side (read_sides): each copy of W streamed once by ``programs_per_sm`` programs per SM,
        ``BLOCK`` elements a step (programs_per_sm 0: one program per BLOCK elements), or torch.sum in float32."""
        if "torch.sum" in config:
            return lambda i: self.w[i].sum(dtype=torch.float32).view(1)
        block, per_sm = config["BLOCK"], config["programs_per_sm"]
        kernel = _read_roof_kernel()
        numel = self.n * self.k
        programs = num_sms() * per_sm if per_sm else -(-numel // block)
        chunk = -(-numel // (programs * block)) * block
        out = torch.empty(programs, dtype=torch.float32, device=DEV)

        def run(i):
            kernel[(programs,)](self.w[i], out, numel, chunk, BLOCK=block, num_warps=1 if SMOKE else 8)
            return out  # per-program sums: they add up to W's sum

        return run

    def platform(self, rows):
        from .silu_mul import silu_and_mul

        x = self.x[rows]
        if self.silu:
            return lambda i: silu_and_mul(F.linear(x, self.w[i]))
        return lambda i: F.linear(x, self.w[i])

    def free(self):
        self.w, self.x = [], {}


def timed(calls: dict, copies: int) -> dict:
    if SMOKE:
        out = {}
        for name, fn in calls.items():
            fn(0)
            t0 = time.perf_counter()
            fn(0)
            out[name] = (time.perf_counter() - t0) * 1e6
        return out
    return dispatch.time_on_device(calls, copies, reps=7, log=log)


def copy_bandwidth():
    if SMOKE:
        return 10.0
    n = 2 * 1024**3
    a = torch.empty(n, dtype=torch.uint8, device=DEV)
    b = torch.empty_like(a)
    # timed eagerly: captured in a CUDA graph the copy becomes a memcpy node that the H200 ran at ~2760 GB/s (twice
    # on 2026-12-02, warm clocks too) against ~4270 GB/s for the same copy_ launched eagerly (decode bench, same call)
    for _ in range(20):
        b.copy_(a)
    torch.cuda.synchronize()
    us = dispatch.time_on_device({"copy": lambda i: b.copy_(a)}, 1, reps=15, min_calls=4, use_graph=False)["copy"]
    return 2 * n / (us * 1e-6) / 1e9  # a and b are freed on return


def sweep(ops, rocm, deadline, rows_out):
    """bench_sweep.sweep with this module's rows, grid and timer (--smoke's at toy shapes)."""
    return bench_sweep.sweep(ops, rocm, deadline, rows_out, ROWS, sweep_grid, timed)


def suggest_entry(target, ops, results, base):
    return bench_sweep.suggest_entry(target, ops, results, base, ROWS)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench/results")
    ap.add_argument("--quick", action="store_true", help="skip the sweep: launch_params / VLLM_DCU_GEMV_PARAMS")
    ap.add_argument("--budget-s", type=float, default=150.0, help="stop the sweep after this many seconds")
    ap.add_argument("--tag", default="", help="appended to the output file names")
    ap.add_argument("--smoke", action="store_true", help="check the script on the CPU (TRITON_INTERPRET=1)")
    ap.add_argument("--variants", action="store_true",
                    help="instead of the sweep and table: every shape at one row, table entry vs K_STAGES 2/3/4 vs "
                         "platform")
    ap.add_argument("--try", dest="tries", action="append", default=[], metavar="LABEL=JSON",
                    help="with --variants: time these launch options (merged over the table's) instead of K_STAGES")
    ap.add_argument("--rows", default=None, help=f"with --variants: comma-separated row counts (default {VARIANT_ROWS})")
    ap.add_argument("--shapes", default=None, help="with --variants: comma-separated NxK shapes (default: all)")
    args = ap.parse_args(argv)
    if args.smoke:
        if os.environ.get("TRITON_INTERPRET") != "1":
            sys.exit("error: --smoke needs TRITON_INTERPRET=1 in the environment (set before Triton is imported)")
        smoke_setup()
    if (args.tries or args.rows or args.shapes) and not args.variants:
        sys.exit("error: --try, --rows and --shapes go with --variants")
    try:
        tries = parse_tries(args.tries)
        rows_list = tuple(args.rows.split(",")) if args.rows else (str(VARIANT_ROWS),)
        if any(r not in {str(n) for n in ROWS} for r in rows_list):
            raise ValueError(f"--rows must be taken from {list(ROWS)}, got {args.rows!r}")
        rows_list = tuple(int(r) for r in rows_list)
        known = {f"{n}x{k}" for _, n, k, _ in SHAPES}
        shapes = set(args.shapes.split(",")) if args.shapes else None
        if shapes and shapes - known:
            raise ValueError(f"--shapes: unknown {sorted(shapes - known)}; known: {sorted(known)}")
    except ValueError as e:
        sys.exit(f"error: {e}")
    if not args.smoke and not torch.cuda.is_available():
        sys.exit("error: the bench needs a CUDA/HIP GPU (torch.cuda.is_available() is False); "
                 "--smoke runs it on the CPU")
    import triton

    t_start = time.time()
    target = launch_params.current_target(torch.device(DEV) if DEV == "cuda" else None)
    base = launch_params.get_params(target)  # a bad VLLM_DCU_GEMV_PARAMS fails here, once
    rocm = bool(torch.version.hip) or target.startswith("gfx")
    try:  # every --try merged over the table's entries, checked before any GPU time is spent
        for _, n, k, silu in SHAPES:
            for rows in rows_list:
                variant_sides(launch_params.config_for(target, n, k, rows, silu), rows, tries)
    except ValueError as e:
        sys.exit(f"error: {e}")
    if SMOKE:
        name, l2, platform = "cpu-smoke", 1 << 20, "torch CPU"
    else:
        props = torch.cuda.get_device_properties(0)
        name = props.name
        l2 = getattr(props, "L2_cache_size", 0) or 64 << 20
        platform = f"hipBLASLt/rocBLAS, HIP {torch.version.hip}" if rocm else f"cuBLAS, CUDA {torch.version.cuda}"
    log(f"device {name} (target {target}), L2 {l2 >> 20} MiB; torch {torch.__version__}, triton {triton.__version__}")
    copy_gbps = copy_bandwidth()
    log(f"device copy bandwidth: {copy_gbps:.0f} GB/s ({time.time() - t_start:.0f} s)")

    command = "python -m kernels.gemv.bench" + " ".join([""] + (argv if argv is not None else sys.argv[1:]))
    command = command.replace(f" --out {args.out}", "")
    # --shapes goes with --variants only (checked above)
    ops = [Op(op_name, n, k, silu, l2) for op_name, n, k, silu in SHAPES if shapes is None or f"{n}x{k}" in shapes]
    if args.variants:
        rows_out = run_variants(ops, target, copy_gbps, rows_list, tries)
        meta = {"device": name, "target": target, "copy_GBps": copy_gbps, "platform": platform,
                "torch": torch.__version__, "triton": triton.__version__, "command": command,
                "seconds": round(time.time() - t_start), "variant_rows": list(rows_list),
                "variant_K_STAGES": [] if tries else list(VARIANT_STAGES),
                "tries": {label: {str(b): c for b, c in per.items()} for label, per in tries.items()}}
        md = variants_markdown(meta, rows_out)
        base_path = result_base(args.out, name, "gemv-variants", args.tag)
        write_report(base_path, {"meta": meta, "rows": rows_out}, md)
        log(f"wrote {base_path}.{{json,md}} in {time.time() - t_start:.0f} s")
        print(md)
        return base_path

    sweep_rows, results, skipped = [], {}, 0
    if not args.quick:
        results, skipped = sweep(ops, rocm, t_start + args.budget_s, sweep_rows)
        entry = suggest_entry(target, ops, results, base)
        source = f"sweep (entry below; {skipped} configurations skipped at the time budget)"
        log(f"sweep done in {time.time() - t_start:.0f} s")
    else:
        entry = base
        source = f"launch_params['{target}']"
        if os.environ.get(launch_params.ENV_VAR):
            source += f" with {launch_params.ENV_VAR}"

    table = []
    for op in ops:
        for rows in ROWS:
            cfg = launch_params.config_for(target, op.n, op.k, rows, op.silu, entry=entry)
            t = timed({"triton": op.triton(rows, cfg), "platform": op.platform(rows)}, op.copies)
            ref = reference(op, rows)
            errs = (rel_error(op.triton(rows, cfg)(0), ref), rel_error(op.platform(rows)(0), ref))
            del ref
            gb = op.bytes(rows) / 1e9
            r = dict(op=op.name, n=op.n, k=op.k, silu_mul=op.silu, rows=rows, config=cfg,
                     triton_us=round(t["triton"], 2), platform_us=round(t["platform"], 2),
                     triton_GBps=gb / (t["triton"] * 1e-6), platform_GBps=gb / (t["platform"] * 1e-6),
                     ratio=t["triton"] / t["platform"], pick=dispatch.decide(t["triton"], t["platform"]),
                     triton_err=errs[0], platform_err=errs[1])
            r["triton_pct"] = 100 * r["triton_GBps"] / copy_gbps
            r["platform_pct"] = 100 * r["platform_GBps"] / copy_gbps
            table.append(r)
            log(f"{op.name} rows {rows}: GEMV {t['triton']:.1f} us ({r['triton_pct']:.0f}%), platform "
                f"{t['platform']:.1f} us ({r['platform_pct']:.0f}%) -> {r['pick']}")
        op.free()

    base_path = result_base(args.out, name, "gemv", args.tag)
    meta = dict(device=name, target=target, copy_GBps=copy_gbps, platform=platform, config_source=source,
                torch=torch.__version__, triton=triton.__version__, command=command,
                seconds=round(time.time() - t_start), swept=not args.quick, sweep_skipped=skipped)
    suggestion_md = ""
    if not args.quick:
        suggestion_fields, suggestion_md = suggestion("gemv", target, entry)
        meta.update(suggestion_fields)
    md = markdown(meta, table)
    write_report(base_path, dict(meta=meta, rows=table, sweep=sweep_rows), md + suggestion_md)
    log(f"wrote {base_path}.{{json,md}} in {time.time() - t_start:.0f} s")
    if suggestion_md:
        print(suggestion_md.strip("\n"))
    print(md)  # the table last
    return base_path


if __name__ == "__main__":
    main()
