"""Microbenchmark: split-KV decode attention vs vLLM 0.18.1's unified_attention (as TRITON_ATTN calls it).

    python -m kernels.decode_attention.bench [--quick] [--out DIR]

Qwen3.5-27B attention shapes (24 q / 4 kv heads x 256), batch {1, 4, 16, 64} x context {4K, 8K, 16K,
32K}, KV dtypes bf16 (block 784), fp8 per-token-head with hardware and with software e4m3 decode,
int8 per-token-head (block 1664: patch 0002 rounds an int8 page to 128 tokens, kv_quant.layout.PAGE_ALIGN_TOKENS;
fp8 1552; --block-8bit N pages both with N). Every call is captured in a CUDA/HIP graph and replayed; the time
covers both stages. GB/s = KV bytes read (codes + scales for 8-bit) / time, compared with a measured
device copy (read + write bytes / time). Pages are scattered at random over a pool of 64 x 32K tokens.

First a sweep (bench_sweep.py) picks one configuration per KV width; the main table runs with it and the script
prints the launch options it suggests (VLLM_DCU_DECODE_PARAMS). --quick skips the sweep and uses the table (or
VLLM_DCU_DECODE_PARAMS).
--kv8 LABEL=JSON (repeatable, with --quick) times the 8-bit rows once per kv8 launch entry given, in the same
process as the bf16 rows, e.g. --kv8 'n64s3={"BLOCK_N":64,"num_stages":3}'.
A summary under the table gives, per row kind, the geometric mean of time / bf16's time per batch and of time /
the table entry's time (--kv8 rows); --compare JSON adds time / an earlier run's time per dtype (e.g. the kernel
before a change, `git archive REV kernels` run first in the same call).

--stage-times adds each stage's kernel time per call (torch profiler over the same graphs) and what is left of the
call's time beside them (launch gaps, the stages' ramp-up and tail): where batch 1's fixed cost goes. The profiler
runs after every row is timed (after it, replays cost ~2 us more per call in the same process).
--calls-per-graph N (N > 1) times graphs of N calls, each on its own pages, per call and without the L2 flush
do_bench puts before every replay: as the layers of a captured decode step follow each other (H200: bf16's fixed
cost per call 9.1 us instead of 12.8, 8-bit's 12.5 instead of 16.4; the 8-bit / bf16 ratios within 4%).
8-bit V is read as its cache stores it (kv_quant.layout: int8 by dim, tokens contiguous; fp8 by token);
--v-layouts token,dim times every 8-bit row with V read as if stored by token and by dim (rows [Vtok] / [Vdim] where
that is not the cache's own layout).

Baseline: the file named by VLLM_DCU_BASELINE_UA (0.18.1's triton_unified_attention.py, loaded
with stand-ins for its four vllm imports), else ``unified_attention`` of the installed vllm (make
sure it is an unpatched 0.18.1); without either the baseline columns stay empty.

Writes <date>-<device>-decode-attention[-<tag>].{json,md,png} into --out (default $OUT or bench/results/)
and prints the markdown table last.
"""
import importlib
import itertools
import json
import math
import os
import sys
import time
import types

import torch
import triton

from ..bench_common import graph_of, graph_ms, load_ua_file, log, result_base, write_report
from ..gemv.dispatch import time_on_device
from ..kv_quant.layout import QWEN35_27B_PAGE_TOKENS, V_BY_DIM, kv_cache_shape, split_kv_cache
from ..tuning.suggest import suggestion
from . import bench_sweep, launch_params
from .bench_args import parse_args
from .bench_report import (DTYPES, cost_fit, cost_markdown, load_rows, markdown, plot,  # noqa: F401 - the report's
                           splits_label, summary_markdown)
from .bench_sweep import kv8_entry, launch_grid  # noqa: F401 - kv8_entry: the suggestion's rule, tested here
from .decode_attention import decode_attention, workspace_numel

# The module, not the package's export of the same name (``from . import decode_attention`` gives the function):
# --merge-splits sets its stage-2 constant.
decode_attention_module = importlib.import_module(f"{__package__}.decode_attention")

HQ, HKV, D = 24, 4, 256
BATCHES = (1, 4, 16, 64)
CTXS = (4096, 8192, 16384, 32768)
BLOCK = dict(QWEN35_27B_PAGE_TOKENS)  # the engine's pages per cache kind (patch 0002); --block-8bit edits it
SCALE = 1.0 / 16
DEV = "cuda"


def dry_run_setup():
    """--dry-run: the whole flow on the CPU (Triton interpreter, no graphs) at toy shapes, to check
    the script itself before spending GPU time. Numbers from it mean nothing."""
    global HQ, HKV, D, BATCHES, CTXS, BLOCK, SCALE, DEV, SWEEP_SHAPES, SPLIT_SHAPES, launch_grid
    HQ, HKV, D, BATCHES, CTXS, BLOCK, DEV = 6, 2, 32, (1, 2), (40, 100), {"bf16": 48, "fp8": 32, "int8": 32}, "cpu"
    SCALE = D**-0.5
    SWEEP_SHAPES, SPLIT_SHAPES = ((1, 100),), ((2, 40),)
    grid = [dict(BLOCK_N=16, num_warps=4, num_stages=1), dict(BLOCK_N=32, num_warps=4, num_stages=1)]
    launch_grid = lambda: {"kv16": grid, "kv8": grid[:1]}  # noqa: E731
    # the tests' workarounds for Triton 3.6 interpreter bugs (numpy >= 2.4 loop bounds, bf16 tl.dot); the benchmark
    # runs from the repository root (python -m kernels.decode_attention.bench), where tests/ is importable
    import tests.triton_interp_compat  # noqa: F401


# --- baseline -----------------------------------------------------------------------------------

def load_unified_attention(try_installed=True):
    """The baseline: VLLM_DCU_BASELINE_UA (a file) if set, else the installed vllm's; (fn, source) or (None, why)."""
    path = os.environ.get("VLLM_DCU_BASELINE_UA")
    if path:
        if not os.path.isfile(path):
            sys.exit(f"error: VLLM_DCU_BASELINE_UA={path} is not a file")
        return load_ua_file(path), f"{path} (loaded with stand-ins for its vllm imports)"
    if not try_installed:
        return None, "no baseline (--dry-run without VLLM_DCU_BASELINE_UA)"
    try:
        from vllm.v1.attention.ops.triton_unified_attention import unified_attention
        import vllm

        return unified_attention, f"vllm {vllm.__version__} (installed)"
    except Exception as e:  # noqa: BLE001 - any failure means: no baseline
        return None, f"no baseline (vllm import failed: {type(e).__name__}: {e}; VLLM_DCU_BASELINE_UA not set)"


# --- setup --------------------------------------------------------------------------------------

def copy_bandwidth():
    if DEV == "cpu":
        return 10.0
    n = 2 * 1024**3
    a = torch.empty(n, dtype=torch.uint8, device=DEV)
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median")
    return 2 * n / (ms * 1e-3) / 1e9


class Pools:
    """One bf16 page pool and one per-token-head uint8 pool per 8-bit page size (BLOCK) a timed kind uses, made on
    its first case, each big enough for 64 x 32K tokens."""

    def __init__(self):
        max_tokens = max(BATCHES) * max(CTXS)
        nb16 = max(BATCHES) * math.ceil(max(CTXS) / BLOCK["bf16"])
        self.kv16 = torch.randn(nb16, 2, BLOCK["bf16"], HKV, D, dtype=torch.bfloat16, device=DEV)
        self.kv8 = {}  # page size -> _pool8's
        self.max_tokens = max_tokens

    @staticmethod
    def _pool8(bs):
        """(pool, (K codes, K scales, V scales), V views): one pool of random codes serves every 8-bit kind and V
        layout of its page size (timing only): V as an fp8 cache stores it (by token) and as an int8 cache does (by
        dim, tokens contiguous)."""
        nb8 = max(BATCHES) * math.ceil(max(CTXS) / bs)
        kv8 = torch.randint(0, 256, kv_cache_shape(nb8, bs, HKV, D), dtype=torch.uint8, device=DEV)
        kv8 &= 0x77  # no fp8 NaN codes (0x7F / 0xFF)
        k_codes, v_by_token, k_scales, v_scales = split_kv_cache(kv8, D, "fp8")
        k_scales.copy_(torch.rand(k_scales.shape, device=DEV) * 9e-3 + 1e-3)
        v_scales.copy_(torch.rand(v_scales.shape, device=DEV) * 9e-3 + 1e-3)
        return kv8, (k_codes, k_scales, v_scales), {"token": v_by_token, "dim": split_kv_cache(kv8, D, "int8")[1]}

    def case(self, dtype, batch, ctx, seed=0, v_layout=None, lens=None):
        """v_layout: "token" / "dim" reads the 8-bit V as if stored that way; None as the dtype's cache stores it.
        lens: (mode, fraction) of --lens; None: every sequence ctx tokens."""
        kind = dtype.split("_")[0]  # bf16, fp8, int8
        bs = BLOCK[kind]
        nblk = math.ceil(ctx / bs)
        if kind != "bf16" and bs not in self.kv8:
            self.kv8[bs] = self._pool8(bs)
        pool_blocks = (self.kv16 if kind == "bf16" else self.kv8[bs][0]).shape[0]
        g = torch.Generator(device=DEV).manual_seed(seed)
        bt = torch.randperm(pool_blocks, device=DEV, generator=g)[: batch * nblk].view(batch, nblk).to(torch.int32)
        q = torch.randn(batch, HQ, D, dtype=torch.bfloat16, device=DEV, generator=g)
        lengths = batch_lengths(batch, ctx, lens)
        seq_lens = torch.tensor(lengths, dtype=torch.int32, device=DEV)
        c = dict(q=q, block_table=bt, seq_lens=seq_lens, out=torch.empty_like(q))
        if kind == "bf16":
            k, v = self.kv16.unbind(1)
            c.update(k=k, v=v, kv_bytes=sum(lengths) * HKV * D * 2 * 2)
        else:
            _, (k, ks, vs), v_views = self.kv8[bs]
            v = v_views[v_layout or native_v_layout(dtype)]
            c.update(k=k, v=v, k_scales=ks, v_scales=vs, kv_quant=dtype.split("_")[0],
                     software_fp8=dtype.endswith("_sw"), kv_bytes=sum(lengths) * HKV * (D + 4) * 2)
        return c


def batch_lengths(batch, ctx, lens=None):
    """Sequence lengths of a timed batch (--lens): None every one ctx; ("spread", f) evenly from f x ctx to ctx (a
    served tier's mix, e.g. f 0.5 for 16-32K), in an order that puts the longest in the middle; ("one-long", f) the
    middle one ctx and the others f x ctx (one long request among short ones)."""
    if lens is None or batch == 1:
        return [ctx] * batch
    mode, frac = lens
    short = max(1, round(frac * ctx))
    if mode == "one-long":
        return [ctx if i == batch // 2 else short for i in range(batch)]
    spread = [round(short + (ctx - short) * i / (batch - 1)) for i in range(batch)]
    return spread[0::2] + spread[1::2][::-1]


def native_v_layout(dtype):
    """How the dtype's cache stores V (kv_quant.layout.V_BY_DIM)."""
    return "dim" if dtype.split("_")[0] in V_BY_DIM else "token"


def ours_fn(c, num_splits=None):
    kw = {}
    if "kv_quant" in c:
        kw = dict(k_scales=c["k_scales"], v_scales=c["v_scales"], kv_quant=c["kv_quant"],
                  software_fp8=c["software_fp8"])
    ws = torch.empty(workspace_numel(c["q"].shape[0], HQ, HKV, D, c["q"].device, kv8="kv_quant" in c,
                                     num_splits=num_splits), dtype=torch.float32, device=DEV)

    def fn():
        decode_attention(c["q"], c["k"], c["v"], c["block_table"], c["seq_lens"], SCALE, c["out"], workspace=ws,
                         num_splits=num_splits, **kw)
    return fn


def baseline_fn(ua, c, ctx):
    batch = c["q"].shape[0]
    thr, seg = 128 // HKV, 16  # TRITON_ATTN: seq_threshold_3D = 128 // kv heads, 16 segments
    so = torch.empty(thr, HQ, seg, triton.next_power_of_2(D), dtype=torch.float32, device=DEV)
    sm = torch.empty(thr, HQ, seg, dtype=torch.float32, device=DEV)
    se = torch.empty(thr, HQ, seg, dtype=torch.float32, device=DEV)
    cu_q = torch.arange(batch + 1, device=DEV, dtype=torch.int32)
    ones = torch.ones(batch, HKV, dtype=torch.float32, device=DEV)

    def fn():
        ua(c["q"], c["k"], c["v"], c["out"], cu_q, 1, c["seq_lens"], ctx, SCALE, True, (-1, -1), c["block_table"], 0,
           None, ones, ones, seq_threshold_3D=thr, num_par_softmax_segments=seg, softmax_segm_output=so,
           softmax_segm_max=sm, softmax_segm_expsum=se)
    return fn


def time_calls(fns, reps=20):
    """us per call of a CUDA/HIP graph that runs every fn of ``fns`` in turn (each on its own KV pages), timed
    with events around the replay, no cache flush between replays: as the calls of one layer after another sit in
    a captured decode step, launch overhead shared and the L2 holding the previous call's clean lines. The GEMV
    dispatch's timer, with 50 ms of replays first (clocks back up after a compile's idle time)."""
    if DEV == "cpu":
        return time_graph(fns[0])
    return time_on_device({"calls": lambda i: fns[i]()}, len(fns), reps=reps, min_calls=len(fns),
                          warmup_s=0.05)["calls"]


def time_graph(fn, rep=100):
    if DEV == "cpu":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    return graph_ms(fn, rep=rep) * 1e3  # us


STAGE_KERNELS = (("stage1_us", "_decode_split_kernel"), ("stage2_us", "_merge_splits_kernel"))


def stage_times(fns, reps=20):
    """Device time per call of each stage's kernel (stage 1: the splits, stage 2: their merge), from the profiler
    over replays of a graph of ``fns`` (one call each, as time_calls captures them; no L2 flush between replays, also
    where --calls-per-graph 1 times with do_bench's flush); what the call's time has beyond the two is launch gaps
    and the stages' ramp-up and tail. {} on the CPU, or where the profiler sees no kernels."""
    if DEV == "cpu":
        return {}
    from torch.profiler import ProfilerActivity, profile

    g = graph_of(fns)
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                g.replay()
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - a profiler that cannot trace here costs the columns, not the run
        log(f"stage times: profiler failed ({type(e).__name__}: {e}); no stage columns for this row")
        return {}
    out = {}
    for ev in prof.key_averages():
        total = getattr(ev, "device_time_total", None)
        if total is None:
            total = getattr(ev, "cuda_time_total", 0.0)
        for key, kernel in STAGE_KERNELS:
            if kernel in ev.key:
                out[key] = round(out.get(key, 0.0) + total / (reps * len(fns)), 2)
    del g
    return out


def profile_rows(profiled):
    """--stage-times: each timed row's stage columns, after every row has been timed. Once the profiler has run in
    a process, each later graph replay costs more (H200, 2026-12-04: +1.7-2.8 us per call at batch 1 for every row
    timed after the first profile, so an 8-bit / bf16 ratio there rose by up to 0.03; raw/2026-12-04-session25/
    call2, table against after2), and the timed columns must not carry that."""
    for r, run_config, cases in profiled:
        r.update(with_params(run_config, lambda: stage_times([ours_fn(c) for c in cases])))


# --- sweep --------------------------------------------------------------------------------------

SWEEP_SHAPES = ((1, 32768), (4, 16384), (16, 8192), (64, 8192))
SPLIT_SHAPES = ((1, 4096), (1, 8192), (1, 16384), (1, 32768), (4, 8192), (16, 8192), (64, 8192))


def with_params(override, fn_make):
    os.environ[launch_params.ENV_VAR] = json.dumps(override)
    try:
        return fn_make()
    finally:
        os.environ.pop(launch_params.ENV_VAR, None)


def measure(pools, dtype, shapes, override, rep=50):
    times = []
    for batch, ctx in shapes:
        c = pools.case(dtype, batch, ctx)
        times.append(with_params(override, lambda: time_graph(ours_fn(c), rep=rep)))
    return times


def sweep(pools, rows):
    """bench_sweep.sweep with this module's timing and shapes (--dry-run's at toy shapes)."""
    return bench_sweep.sweep(pools, rows, measure, launch_grid(), SWEEP_SHAPES, SPLIT_SHAPES)


def main(argv=None):
    args, opts = parse_args(argv, __doc__.split("\n")[0])
    compare_rows, lens, shape_filter = opts["compare_rows"], opts["lens"], opts["shape_filter"]
    kv8_variants, v_layouts, kv8_dtypes = opts["kv8_variants"], opts["v_layouts"], opts["kv8_dtypes"]
    if args.merge_splits is not None:
        decode_attention_module._MERGE_SPLITS = args.merge_splits
    if args.summary:
        rows = load_rows(args.summary, "--summary")
        print(summary_markdown(rows) + "\n" + cost_markdown(rows), end="")
        return
    if args.replot:
        with open(args.replot) as f:
            data = json.load(f)
        png = os.path.splitext(args.replot)[0] + ".png"
        plot(data["rows"], data["meta"]["copy_GBps"], png)
        print(f"wrote {png}")
        return
    if args.dry_run:
        if os.environ.get("TRITON_INTERPRET") != "1":
            sys.exit("error: --dry-run needs TRITON_INTERPRET=1 in the environment (set before Triton is imported)")
        dry_run_setup()
    elif not torch.cuda.is_available():
        sys.exit("error: bench needs a CUDA/HIP GPU (torch.cuda.is_available() is False)")
    global BATCHES, CTXS
    BATCHES = shape_filter.get("batches", BATCHES)
    CTXS = shape_filter.get("ctxs", CTXS)
    if args.block_8bit is not None:
        BLOCK["fp8"] = BLOCK["int8"] = args.block_8bit
    launch_params.get_params(launch_params.current_target())  # bad VLLM_DCU_DECODE_PARAMS fails here, once
    t_start = time.time()
    os.makedirs(args.out, exist_ok=True)
    props = (types.SimpleNamespace(name="cpu-dry-run", multi_processor_count=1) if DEV == "cpu"
             else torch.cuda.get_device_properties(0))
    target = launch_params.current_target()
    ua, ua_src = load_unified_attention(try_installed=not args.dry_run)
    log(f"device {props.name} ({target}, {props.multi_processor_count} CUs); baseline: {ua_src}")
    copy_gbps = copy_bandwidth()
    log(f"device copy bandwidth: {copy_gbps:.0f} GB/s")
    pools = Pools()

    sweep_rows = []
    user_env = os.environ.pop(launch_params.ENV_VAR, None)
    if args.quick:
        config = json.loads(user_env) if user_env else {}
    else:
        config = sweep(pools, sweep_rows)
        log(f"sweep done in {time.time() - t_start:.0f} s: {config}")
    entry = launch_params.get_params(target, override=json.dumps(config))
    for label, cfg in kv8_variants:  # a bad entry fails here, before any timing
        launch_params.get_params(target, override=json.dumps({**config, "kv8": cfg}))
    runs = [("bf16", None, config, None)]
    for layout in v_layouts or (None,):
        for label, cfg in [(None, None)] + kv8_variants:
            for dtype in kv8_dtypes:
                other = None if layout in (None, native_v_layout(dtype)) else {"dim": "Vdim", "token": "Vtok"}[layout]
                name = "|".join(x for x in (label, other) if x) or None
                runs.append((dtype, name, config if cfg is None else {**config, "kv8": cfg}, layout))
    n_calls = args.calls_per_graph

    def timed(make_fn, cases):
        return time_graph(make_fn(cases[0])) if n_calls == 1 else time_calls([make_fn(c) for c in cases])

    # Shape by shape, every run of the list in turn (bf16 first): the ratios of one cell come from timings taken
    # seconds apart, not from blocks of rows minutes apart (clocks and temperature drift between blocks).
    per_run, ours_bf16 = [[] for _ in runs], {}
    profiled = []  # --stage-times: (row, entry, cases), profiled once every row is timed (see profile_rows)
    for batch, ctx in itertools.product(BATCHES, CTXS):
        for run_rows, (dtype, variant, run_config, v_layout) in zip(per_run, runs):
            cases = [pools.case(dtype, batch, ctx, seed=i, v_layout=v_layout, lens=lens) for i in range(n_calls)]
            c = cases[0]
            us = with_params(run_config, lambda: timed(ours_fn, cases))
            gbps = c["kv_bytes"] / (us * 1e-6) / 1e9
            r = dict(dtype=dtype if variant is None else f"{dtype} [{variant}]", batch=batch, ctx=ctx,
                     block_size=c["k"].shape[1], us=round(us, 1),
                     GBps=round(gbps), pct_copy=round(100 * gbps / copy_gbps, 1),
                     # the launcher's own split plan under this run's entry
                     splits=with_params(run_config, lambda: splits_label(c)))
            if args.stage_times:
                profiled.append((r, run_config, cases))
            if dtype == "bf16":
                ours_bf16[(batch, ctx)] = us
                if ua is not None:
                    mine = c["out"].float().clone()
                    ua_us = timed(lambda cc: baseline_fn(ua, cc, ctx), cases)
                    r.update(baseline_us=round(ua_us, 1), speedup_vs_ua=round(ua_us / us, 2),
                             max_abs_diff_vs_ua=float((mine - c["out"].float()).abs().max()))
                    run_rows.append(dict(dtype="baseline_bf16", batch=batch, ctx=ctx, us=round(ua_us, 1),
                                         GBps=round(c["kv_bytes"] / (ua_us * 1e-6) / 1e9)))
            else:
                r["ratio_vs_bf16"] = round(us / ours_bf16[(batch, ctx)], 2)
            run_rows.append(r)
            log(f"{r['dtype']} batch {batch} ctx {ctx}: {us:.1f} us {gbps:.0f} GB/s")
    profile_rows(profiled)
    rows = [r for run_rows in per_run for r in run_rows]  # grouped by run, as the tables read them
    ua_us = {(r["batch"], r["ctx"]): r["us"] for r in rows if r["dtype"] == "baseline_bf16"}
    for r in rows:
        if r["dtype"] not in ("bf16", "baseline_bf16") and (r["batch"], r["ctx"]) in ua_us:
            r["baseline_us"] = ua_us[(r["batch"], r["ctx"])]
            r["speedup_vs_ua"] = round(ua_us[(r["batch"], r["ctx"])] / r["us"], 2)

    base = result_base(args.out, props.name, "decode-attention", args.tag)
    suggested = {k: config.get(k, entry[k]) for k in ("programs_per_cu", "min_split_tokens", "kv16", "kv8")}
    meta = dict(device=props.name, target=target, num_cus=props.multi_processor_count, copy_GBps=copy_gbps, lens=lens,
                baseline=ua_src, config=config, calls_per_graph=n_calls, v_layouts=v_layouts, swept=not args.quick,
                kv8_variants=dict(kv8_variants), torch=torch.__version__,
                triton=triton.__version__, command="python -m kernels.decode_attention.bench" +
                (" --quick" if args.quick else "") + (f" --tag {args.tag}" if args.tag else "") +
                "".join(f" --kv8 '{item}'" for item in args.kv8) +
                (f" --v-layouts {args.v_layouts}" if v_layouts else "") +
                (f" --kv8-dtypes {args.kv8_dtypes}" if kv8_dtypes != DTYPES[1:] else "") +
                (f" --calls-per-graph {n_calls}" if n_calls != 1 else "") +
                (" --stage-times" if args.stage_times else "") +
                (f" --merge-splits {args.merge_splits}" if args.merge_splits else "") +
                (f" --lens {args.lens}" if lens else "") +
                (f" --block-8bit {args.block_8bit}" if args.block_8bit is not None else "") +
                "".join(f" --{k} {','.join(map(str, v))}" for k, v in shape_filter.items()),
                seconds=round(time.time() - t_start))
    suggestion_fields, suggestion_md = suggestion("decode", target, {**entry, **suggested})
    meta.update(suggestion_fields)
    if args.compare:
        meta["command"] += f" --compare {args.compare}"
        meta["compared_with"] = args.compare
    md = markdown(meta, rows)
    md += ("\nSummary (geometric means over the contexts; x table: a --kv8 entry's rows over the same dtype's "
           "rows with the table's entry" + (f"; x compared: over {args.compare}" if args.compare else "") + "):\n\n"
           + summary_markdown(rows, compare_rows))
    md += "\nCost per token and fixed cost (least squares over the contexts, per batch):\n\n" + cost_markdown(rows)
    if not args.quick:
        md += suggestion_md
    write_report(base, dict(meta=meta, rows=rows, sweep=sweep_rows), md)
    try:
        plot(rows, copy_gbps, base + ".png")
    except ImportError as e:
        log(f"no PNG ({e}); make it where matplotlib is: python -m kernels.decode_attention.bench --replot {base}.json")
    log(f"wrote {base}.{{json,md,png}} in {time.time() - t_start:.0f} s")
    print(md)


if __name__ == "__main__":
    main()
