"""Microbenchmark: split-KV decode attention vs vLLM 0.18.1's unified_attention (as TRITON_ATTN calls it).

    python -m kernels.decode_attention.bench [--quick] [--out DIR]

Qwen3.5-27B attention shapes (24 q / 4 kv heads x 256), batch {1, 4, 16, 64} x context {4K, 8K, 16K,
32K}, KV dtypes bf16 (block 784), fp8 per-token-head with hardware and with software e4m3 decode,
int8 per-token-head (block 1664: patch 0002 rounds an int8 page to 128 tokens, kv_quant.layout.PAGE_ALIGN_TOKENS;
fp8 1552; --block-8bit N pages both with N). Every call is captured in a CUDA/HIP graph and replayed; the time
covers both stages. GB/s = KV bytes read (codes + scales for 8-bit) / time, compared with a measured
device copy (read + write bytes / time). Pages are scattered at random over a pool of 64 x 32K tokens.

First a sweep over launch parameters (BLOCK_N, num_warps, num_stages) and the split policy
(programs_per_cu, min_split_tokens) picks one configuration per KV width (kv8: the one fastest for software fp8,
with the int8-fastest one's differences as its "int8" options); the main table runs with
it and the script prints the launch options it suggests (VLLM_DCU_DECODE_PARAMS). --quick skips the sweep and uses the
table (or VLLM_DCU_DECODE_PARAMS). --kv8 LABEL=JSON (repeatable, with --quick) times the 8-bit rows once per kv8
launch entry given, in the same process as the bf16 rows, e.g. --kv8 'n64s3={"BLOCK_N":64,"num_stages":3}'.
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
import argparse
import datetime
import importlib.util
import itertools
import json
import logging
import math
import os
import sys
import time
import types

import torch
import triton

from ..gemv.dispatch import time_on_device
from ..kv_quant.layout import QWEN35_27B_PAGE_TOKENS, V_BY_DIM, kv_cache_shape, split_kv_cache
from . import launch_params
from . import decode_attention as decode_attention_module
from .decode_attention import decode_attention, launch_plan, workspace_numel
from ..results_io import save_figure, write_text
from ..tuning.suggest import suggestion

HQ, HKV, D = 24, 4, 256
BATCHES = (1, 4, 16, 64)
CTXS = (4096, 8192, 16384, 32768)
BLOCK = dict(QWEN35_27B_PAGE_TOKENS)  # the engine's pages per cache kind (patch 0002); --block-8bit edits it
DTYPES = ("bf16", "fp8_pth_hw", "fp8_pth_sw", "int8_pth")
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


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# --- baseline -----------------------------------------------------------------------------------

def _load_ua_file(path, extra_stubs=None, module_name="ua_baseline_0181"):
    """0.18.1's triton_unified_attention.py with stand-ins for its four vllm imports (and ``extra_stubs``, module
    name -> stand-in, for a patched file's further imports)."""
    stubs = {
        "vllm": types.ModuleType("vllm"),
        "vllm.logger": types.SimpleNamespace(init_logger=logging.getLogger),
        "vllm.model_executor.layers.batch_invariant": types.SimpleNamespace(vllm_is_batch_invariant=lambda: False),
        "vllm.platforms": types.SimpleNamespace(
            current_platform=types.SimpleNamespace(fp8_dtype=lambda: torch.float8_e4m3fn)),
        "vllm.triton_utils": types.SimpleNamespace(tl=triton.language, triton=triton),
        **(extra_stubs or {}),
    }
    saved = {k: sys.modules.get(k) for k in stubs}
    sys.modules.update(stubs)
    try:
        spec = importlib.util.spec_from_file_location(module_name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return mod.unified_attention


def load_unified_attention(try_installed=True):
    """The baseline: VLLM_DCU_BASELINE_UA (a file) if set, else the installed vllm's; (fn, source) or (None, why)."""
    path = os.environ.get("VLLM_DCU_BASELINE_UA")
    if path:
        if not os.path.isfile(path):
            sys.exit(f"error: VLLM_DCU_BASELINE_UA={path} is not a file")
        return _load_ua_file(path), f"{path} (loaded with stand-ins for its vllm imports)"
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


LENS_MODES = ("spread", "one-long")


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


def graph_of(fns):
    """A CUDA/HIP graph of one call of each fn, in order (each runs once before the capture: Triton compiles there)."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    return g


def time_graph(fn, rep=100):
    if DEV == "cpu":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    g = graph_of([fn])
    ms = triton.testing.do_bench(g.replay, warmup=20, rep=rep, return_mode="median")
    del g
    return ms * 1e3  # us


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

def splits_label(c):
    """The launcher's split plan for case ``c`` (the Gluon stage 1's where it takes the call): splits per sequence,
    or "b" and the programs per kv head that launch key balance shares out by length."""
    plan, _ = launch_plan(c["q"], c["k"], c["v"], c.get("kv_quant"))
    return f"b{plan.programs}" if plan.programs else plan.splits


def launch_grid():  # noqa: F811 - dry_run_setup's `global launch_grid` replaces it at toy shapes
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


SWEEP_SHAPES = ((1, 32768), (4, 16384), (16, 8192), (64, 8192))
SPLIT_SHAPES = ((1, 4096), (1, 8192), (1, 16384), (1, 32768), (4, 8192), (16, 8192), (64, 8192))


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


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


def sweep(pools, rows):
    best = {}
    # kv8 serves fp8 and int8: scored on int8 and on the software fp8 decode (the DCU's path), each kind's times kept
    # apart so the suggestion can give int8 its own launch options (kv8_entry)
    for kind, dtypes in (("kv16", ("bf16",)), ("kv8", ("int8_pth", "fp8_pth_sw"))):
        scored = []
        for cfg in launch_grid()[kind]:
            t0 = time.time()
            try:
                by_dtype = {dtype: measure(pools, dtype, SWEEP_SHAPES, {kind: cfg}) for dtype in dtypes}
            except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: record and go on
                rows.append(dict(sweep="launch", kv=kind, config=cfg, error=f"{type(e).__name__}: {str(e)[:120]}"))
                continue
            times = [t for dtype in dtypes for t in by_dtype[dtype]]
            scored.append((cfg, by_dtype))
            rows.append(dict(sweep="launch", kv=kind, dtypes=dtypes, config=cfg, shapes=SWEEP_SHAPES,
                             us=[round(t, 1) for t in times], geomean_us=round(geomean(times), 2)))
            log(f"sweep {kind} {cfg}: {[round(t, 1) for t in times]} us ({time.time() - t0:.1f} s)")
        if kind == "kv8":
            best[kind] = kv8_entry(scored)
        else:
            best[kind] = min(scored, key=lambda s: geomean(s[1]["bf16"]))[0]
    split_scored = []
    for ppc, msplit in itertools.product((1, 2, 3, 4, 8), (64, 128, 256, 512)):
        override = dict(kv16=best["kv16"], kv8=best["kv8"], programs_per_cu=ppc, min_split_tokens=msplit)
        times = measure(pools, "bf16", SPLIT_SHAPES, override) + measure(pools, "int8_pth", SPLIT_SHAPES, override)
        split_scored.append((geomean(times), ppc, msplit))
        rows.append(dict(sweep="splits", programs_per_cu=ppc, min_split_tokens=msplit, shapes=SPLIT_SHAPES,
                         us=[round(t, 1) for t in times], geomean_us=round(split_scored[-1][0], 2)))
        log(f"sweep splits ppc={ppc} min_split={msplit}: {[round(t, 1) for t in times]} us")
    _, ppc, msplit = min(split_scored)
    return dict(kv16=best["kv16"], kv8=best["kv8"], programs_per_cu=ppc, min_split_tokens=msplit)


# --- report -------------------------------------------------------------------------------------

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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="skip the parameter sweep")
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench/results")
    ap.add_argument("--dry-run", action="store_true", help="check the script on the CPU at toy shapes")
    ap.add_argument("--replot", metavar="JSON", help="only redraw the PNG of an earlier run's JSON (no GPU needed)")
    ap.add_argument("--summary", metavar="JSON", help="only print the summary and cost tables of an earlier run's "
                    "JSON (no GPU needed)")
    ap.add_argument("--tag", default="", help="appended to the output file names (keeps an earlier run of the day)")
    ap.add_argument("--kv8", action="append", default=[], metavar="LABEL=JSON",
                    help="with --quick: time the 8-bit rows with this kv8 entry too (repeatable)")
    ap.add_argument("--batches", help="with --quick: comma-separated batch sizes instead of 1,4,16,64")
    ap.add_argument("--ctxs", help="with --quick: comma-separated context lengths instead of 4096,...,32768")
    ap.add_argument("--v-layouts", help="comma-separated 8-bit V page layouts to time every 8-bit row with: token "
                    "([block_size, kv heads, head_dim]) and/or dim ([kv heads, head_dim, block_size]); default: each "
                    "cache's own (int8 by dim, fp8 by token)")
    ap.add_argument("--kv8-dtypes", default=",".join(DTYPES[1:]), help="with --quick: comma-separated 8-bit rows to "
                    f"time (of {', '.join(DTYPES[1:])}; bf16 always runs, the ratios' reference)")
    ap.add_argument("--stage-times", action="store_true", help="also time each stage's kernel per call with the "
                    "profiler (columns stage 1 / stage 2 us; the rest of a call's time is launch gaps and ramps)")
    ap.add_argument("--merge-splits", type=int, metavar="N", help="splits stage 2 merges per loop step (a power of "
                    "two, 16-256) instead of the kernel's own (decode_attention._MERGE_SPLITS)")
    ap.add_argument("--calls-per-graph", type=int, default=1, metavar="N",
                    help="1: one call per graph replay, L2 flushed by do_bench before each (the default); N > 1: a "
                    "graph of N calls on N different page sets, per-call time (as layers follow each other in a "
                    "captured decode step)")
    ap.add_argument("--lens", metavar="MODE:F", help="with --quick: sequence lengths of a batch other than ctx each: "
                    "spread:F evenly from F x ctx to ctx, one-long:F one at ctx and the rest at F x ctx (0 < F <= 1); "
                    "the ctx column is then the longest, GB/s counts the bytes of the actual lengths")
    ap.add_argument("--compare", metavar="JSON", help="an earlier run's JSON (e.g. the kernel before a change, run "
                    "in the same call): the summary gives this run's time over its time per dtype")
    ap.add_argument("--block-8bit", type=int, metavar="N", help="tokens per page of both 8-bit caches, a positive "
                    "multiple of 16 (default Qwen3.5-27B's: fp8 1552, int8 1664, where 1552 would start an int8 "
                    "cache's V row of a dim 16 x dim bytes off a 128-byte line)")
    args = ap.parse_args(argv)
    if args.block_8bit is not None and (args.block_8bit < 16 or args.block_8bit % 16):
        sys.exit(f"error: --block-8bit wants a positive multiple of 16; got {args.block_8bit}")
    compare_rows = load_rows(args.compare, "--compare") if args.compare else None
    lens = None
    if args.lens is not None:
        mode, _, frac = args.lens.partition(":")
        try:
            lens = (mode, float(frac))
        except ValueError:
            lens = None
        if lens is None or mode not in LENS_MODES or not 0 < lens[1] <= 1 or not args.quick:
            sys.exit(f"error: --lens wants spread:F or one-long:F with 0 < F <= 1, with --quick; got {args.lens!r}")
    shape_filter = {}
    for name, text in (("batches", args.batches), ("ctxs", args.ctxs)):
        if text is None:
            continue
        try:
            vals = tuple(int(x) for x in text.split(","))
        except ValueError:
            vals = ()
        if not vals or min(vals) < 1 or not args.quick:
            sys.exit(f"error: --{name} wants positive integers separated by commas, with --quick; got {text!r}")
        shape_filter[name] = vals
    kv8_variants = []
    for item in args.kv8:
        label, sep, text = item.partition("=")
        try:
            cfg = json.loads(text) if sep and label else None
        except json.JSONDecodeError:
            cfg = None
        if not isinstance(cfg, dict):
            sys.exit(f"error: --kv8 wants LABEL=JSON-object, got {item!r}")
        kv8_variants.append((label, cfg))
    if kv8_variants and not args.quick:
        sys.exit("error: --kv8 needs --quick (the sweep chooses its own kv8 entry)")
    v_layouts = tuple(args.v_layouts.split(",")) if args.v_layouts is not None else ()
    if args.v_layouts is not None and (not v_layouts or any(x not in ("token", "dim") for x in v_layouts)
                                       or len(set(v_layouts)) != len(v_layouts)):
        sys.exit(f"error: --v-layouts wants token and/or dim separated by commas, got {args.v_layouts!r}")
    kv8_dtypes = tuple(args.kv8_dtypes.split(","))
    if not kv8_dtypes or set(kv8_dtypes) - set(DTYPES[1:]) or len(set(kv8_dtypes)) != len(kv8_dtypes):
        sys.exit(f"error: --kv8-dtypes wants some of {','.join(DTYPES[1:])} separated by commas, "
                 f"got {args.kv8_dtypes!r}")
    if kv8_dtypes != DTYPES[1:] and not args.quick:
        sys.exit("error: --kv8-dtypes needs --quick (the sweep times every dtype)")
    if args.merge_splits is not None:
        if args.merge_splits not in (16, 32, 64, 128, 256):
            sys.exit(f"error: --merge-splits wants a power of two in 16..256, got {args.merge_splits}")
        decode_attention_module._MERGE_SPLITS = args.merge_splits
    if not 1 <= args.calls_per_graph <= 64:
        sys.exit(f"error: --calls-per-graph wants 1..64, got {args.calls_per_graph}")
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

    stamp = datetime.date.today().isoformat()
    dev = props.name.replace(" ", "-").lower()
    base = os.path.join(args.out, f"{stamp}-{dev}-decode-attention" + (f"-{args.tag}" if args.tag else ""))
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
    write_text(base + ".json", json.dumps(dict(meta=meta, rows=rows, sweep=sweep_rows), indent=1))
    md = markdown(meta, rows)
    md += ("\nSummary (geometric means over the contexts; x table: a --kv8 entry's rows over the same dtype's "
           "rows with the table's entry" + (f"; x compared: over {args.compare}" if args.compare else "") + "):\n\n"
           + summary_markdown(rows, compare_rows))
    md += "\nCost per token and fixed cost (least squares over the contexts, per batch):\n\n" + cost_markdown(rows)
    if not args.quick:
        md += suggestion_md
    write_text(base + ".md", md)
    try:
        plot(rows, copy_gbps, base + ".png")
    except ImportError as e:
        log(f"no PNG ({e}); make it where matplotlib is: python -m kernels.decode_attention.bench --replot {base}.json")
    log(f"wrote {base}.{{json,md,png}} in {time.time() - t_start:.0f} s")
    print(md)


if __name__ == "__main__":
    main()
