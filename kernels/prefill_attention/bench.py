"""Microbenchmark: prefill attention kernel vs vLLM 0.18.1's unified attention, one Qwen3.5-27B layer.

    python -m kernels.prefill_attention.bench --ua-file FILE [--out DIR] [--history 0,4096,16384,32768]
        [--chunk 4096] [--quick] [--kv bf16,int8,...] [--block-8bit N] [--dry-run]

One sequence's prefill chunk (default 4096 tokens, the contest's --max-num-batched-tokens) after ``history`` cached
tokens, 24 q / 4 kv heads x 256, pages of 784 tokens (bf16), 1552 (fp8) or 1664 (int8: its pages hold V by dim and a
multiple of 128 tokens, as the engine's do: kv_quant/layout.py V_BY_DIM, PAGE_ALIGN_TOKENS; --block-8bit N pages both
8-bit kinds with N), scattered over the cache.
Every call is captured in a CUDA graph and replayed (median of triton.testing.do_bench). TFLOP/s counts the causal
work once: 4 * q_heads * head_dim * (chunk * history + chunk * (chunk + 1) / 2). The dense bf16 GEMM rate (8192^3
torch.matmul) is measured in the same run and every kernel is reported as a share of it.

Baselines come from ``--ua-file``: the series' triton_unified_attention.py without patch 0006 (0.18.1's kernel
with patch 0002's 8-bit path and patch 0005's tile settings), loaded with stand-ins for its vLLM imports, once
with upstream tiles (BLOCK_M 16, what 0.18.1 runs) and once with VLLM_DCU_PREFILL_BLOCK_M=64 (0005's setting).

First a sweep of launch parameters at the two longest histories picks one configuration per KV width (unless
--quick: the table's, or VLLM_DCU_PREFILL_PARAMS); the script prints the launch_params entry to paste.
The 8-bit kinds int8, fp8_hw and fp8_sw run the engine's flow: chunks of 64+ tokens read the 16-bit mirror, sized
as the engine sizes it (one sequence of the row's history + chunk, at least 32768 tokens; when set,
VLLM_DCU_PREFILL_KV8_MIRROR_TOKENS rules, as in the engine), shorter ones (``--chunk 1``: a decode row) the 8-bit
cache in the direct launch with the table's kv8_short tile; the ``_direct`` kinds always read the 8-bit cache, with
the kv8 tile (the mirror turned off); a last table gives every row's time as a multiple of bf16's per history. Each output is checked against unified attention's (relative error printed). Writes
``<date>-<gpu>-prefill-attention.{json,md}`` into --out (default $OUT or bench/results/); the table comes last.
``TRITON_INTERPRET=1 ... --dry-run`` runs the whole flow on the CPU at toy shapes (Triton interpreter) to check
the script itself; its numbers mean nothing.
"""
import argparse
import datetime
import math
import os
import shlex
import sys
import types

import torch
import triton

from ..bench_common import graph_ms
from ..kv_quant.cache_write import reshape_and_cache_per_token_head
from ..kv_quant.layout import QWEN35_27B_PAGE_TOKENS, kv_cache_shape, split_kv_cache
from ..results_io import write_result_pair
from ..tuning.suggest import suggestion
from . import launch_params
from .prefill_attention import MIRROR_DEFAULT_TOKENS, MIRROR_ENV, MIRROR_PAGE, prefill_attention

HQ, HKV, D = 24, 4, 256
BLOCK = dict(QWEN35_27B_PAGE_TOKENS)  # the engine's pages for Qwen3.5-27B (patch 0002); --block-8bit edits it
DEV = "cuda"
# name -> (kv quant kind, software e4m3 decode, mirror tokens: None = the default, 0 = read the 8-bit cache directly)
DTYPES = {"bf16": (None, False, None), "int8": ("int8", False, None), "fp8_hw": ("fp8", False, None),
          "fp8_sw": ("fp8", True, None), "int8_direct": ("int8", False, 0), "fp8_sw_direct": ("fp8", True, 0)}
SWEEP = {
    "kv16": [
        dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2),
        dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=3),
        dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2),
        dict(BLOCK_M=128, BLOCK_N=16, num_warps=8, num_stages=4),
        dict(BLOCK_M=64, BLOCK_N=64, num_warps=8, num_stages=2),
        dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=3),
    ],
    "kv8": [
        dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2),
        dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=3),
        dict(BLOCK_M=128, BLOCK_N=16, num_warps=8, num_stages=4),
        dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=3),
        dict(BLOCK_M=64, BLOCK_N=64, num_warps=8, num_stages=2),
    ],
}


def dry_run_setup():
    global HQ, HKV, D, BLOCK, DEV, SWEEP
    HQ, HKV, D, BLOCK, DEV = 6, 1, 16, {"bf16": 32, "int8": 48, "fp8": 48}, "cpu"
    SWEEP = {k: [dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
                 dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)] for k in SWEEP}
    # the tests' workarounds for Triton 3.6 interpreter bugs (numpy >= 2.4 loop bounds, bf16 tl.dot); the benchmark
    # runs from the repository root (python -m kernels.prefill_attention.bench), where tests/ is importable
    import tests.triton_interp_compat  # noqa: F401


# --- baselines ----------------------------------------------------------------------------------

def load_unified_attention(path, block_m=None):
    """``unified_attention`` of a triton_unified_attention.py file, with stand-ins for its vLLM imports (the
    patched file's ``vllm.dcu_kernels`` imports resolve to this repository's kernels); ``block_m`` sets patch
    0005's VLLM_DCU_PREFILL_BLOCK_M while the module is loaded (it is read at import)."""
    from .. import fp8_e4m3
    from ..bench_common import load_ua_file
    from ..kv_quant import dequant

    extra = {  # the series' file imports patch 0002's conversions from vllm.dcu_kernels
        "vllm.dcu_kernels": types.ModuleType("vllm.dcu_kernels"),
        "vllm.dcu_kernels.fp8_e4m3": fp8_e4m3,
        "vllm.dcu_kernels.kv_quant": types.ModuleType("vllm.dcu_kernels.kv_quant"),
        "vllm.dcu_kernels.kv_quant.dequant": dequant,
    }
    env = os.environ.get("VLLM_DCU_PREFILL_BLOCK_M")
    if block_m:
        os.environ["VLLM_DCU_PREFILL_BLOCK_M"] = str(block_m)
    else:
        os.environ.pop("VLLM_DCU_PREFILL_BLOCK_M", None)
    try:
        unified_attention = load_ua_file(path, extra, f"ua_bench_bm{block_m or 'up'}")
    finally:
        if env is None:
            os.environ.pop("VLLM_DCU_PREFILL_BLOCK_M", None)
        else:
            os.environ["VLLM_DCU_PREFILL_BLOCK_M"] = env
    if hasattr(unified_attention, "dcu_upstream"):
        sys.exit(f"error: {path} carries patch 0006's router; give the series' file without 0006")
    return unified_attention


# --- cases --------------------------------------------------------------------------------------

def make_case(history, chunk, kind, software, seed=0):
    block = BLOCK["bf16" if kind is None else kind]
    n = history + chunk
    pages = math.ceil(n / block)
    num_blocks = pages + 3
    g = torch.Generator(device=DEV).manual_seed(seed + n)
    table = torch.randperm(num_blocks, device=DEV, generator=g)[:pages].to(torch.int32).view(1, pages)
    q = torch.randn(chunk, HQ, D, device=DEV, generator=g).to(torch.bfloat16)
    case = dict(q=q, out=torch.empty_like(q), table=table, block=block, kind=kind, software=software,
                cu=torch.tensor([0, chunk], dtype=torch.int32, device=DEV),
                seq_lens=torch.tensor([n], dtype=torch.int32, device=DEV), history=history, chunk=chunk)
    if kind is None:
        kv = torch.randn(num_blocks, 2, block, HKV, D, device=DEV, generator=g).to(torch.bfloat16)
        case.update(k=kv[:, 0], v=kv[:, 1], ks=None, vs=None)
    else:
        cache = torch.zeros(kv_cache_shape(num_blocks, block, HKV, D), dtype=torch.uint8, device=DEV)
        views = split_kv_cache(cache, D, kind)  # as the engine's cache: int8 holds V by dim, fp8 by token
        total = num_blocks * block
        for start in range(0, total, 1 << 15):
            t = min(1 << 15, total - start)
            key = torch.randn(t, HKV, D, device=DEV, generator=g).to(torch.bfloat16)
            val = torch.randn(t, HKV, D, device=DEV, generator=g).to(torch.bfloat16)
            reshape_and_cache_per_token_head(key, val, *views, torch.arange(start, start + t, device=DEV), kind,
                                             software)
        case.update(k=views[0], v=views[1], ks=views[2], vs=views[3])
    return case


def run_ours(case, params, mirror_params=None, mirror=None):
    max_k = case["history"] + case["chunk"]
    return lambda: prefill_attention(case["q"], case["k"], case["v"], case["out"], case["cu"], case["seq_lens"],
                                     case["table"], D**-0.5, k_scales=case["ks"], v_scales=case["vs"],
                                     kv_quant=case["kind"], software_fp8=case["software"], params=params,
                                     mirror_params=mirror_params, max_seqlen_k=max_k, mirror=mirror)


def run_ua(fn, case):
    kw = {}
    if case["kind"] is not None:
        kw = dict(kv_quant=case["kind"], k_scale_cache=case["ks"], v_scale_cache=case["vs"],
                  software_fp8=case["software"])
    ones = torch.ones(1, HKV, device=DEV)
    max_k = case["history"] + case["chunk"]  # a host int: nothing may read the device inside a graph capture
    return lambda: fn(q=case["q"], k=case["k"], v=case["v"], out=case["out"], cu_seqlens_q=case["cu"],
                      max_seqlen_q=case["chunk"], seqused_k=case["seq_lens"], max_seqlen_k=max_k,
                      softmax_scale=D**-0.5, causal=True, window_size=(-1, -1), block_table=case["table"], softcap=0,
                      q_descale=None, k_descale=ones, v_descale=ones, **kw)


def time_ms(fn):
    if DEV == "cpu":
        fn()
        return float("nan")
    return graph_ms(fn)  # fn runs once, then a graph of it is replayed (bench_common)


def flops(history, chunk):
    return 4 * HQ * D * (chunk * history + chunk * (chunk + 1) / 2)


def gemm_tflops():
    if DEV == "cpu":
        return float("nan")
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    triton.testing.do_bench(lambda: a @ b, warmup=1000, rep=1000)  # clocks up from idle first
    ms = triton.testing.do_bench(lambda: a @ b, warmup=50, rep=500, return_mode="median")
    return 2 * 8192**3 / (ms * 1e-3) / 1e12


def rel_err(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


# --- main ---------------------------------------------------------------------------------------

def sweep(histories, chunk, log):
    best = {}
    for width, configs in SWEEP.items():
        kind = None if width == "kv16" else "int8"
        cases = [make_case(h, chunk, kind, False) for h in histories]
        rows = []
        for cfg in configs:
            try:  # the 8-bit launch parameters are for the direct path (decode rows, short chunks): no mirror
                t = [time_ms(run_ours(c, cfg, mirror=0)) for c in cases]
            except Exception as e:  # a configuration the compiler or the GPU rejects is a result too
                log(f"sweep {width} {cfg}: {type(e).__name__}: {str(e)[:200]}")
                continue
            total = sum(t)
            rows.append((total, cfg, t))
            log(f"sweep {width} {cfg}: " + ", ".join(f"{h // 1024}K {x:.3f} ms" for h, x in zip(histories, t)))
        if not rows:
            sys.exit(f"error: no {width} configuration ran")
        rows.sort(key=lambda r: r[0] if r[0] == r[0] else 0)
        best[width] = dict(rows[0][1])
        del cases
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ua-file", help="the series' triton_unified_attention.py without patch 0006 (baselines)")
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench/results")
    ap.add_argument("--history", default=None, help="history lengths (default 0,4096,16384,32768; --dry-run: 0,40)")
    ap.add_argument("--chunk", type=int, default=None, help="query chunk (default 4096; --dry-run: 20)")
    ap.add_argument("--quick", action="store_true", help="no sweep: the launch_params table's entry")
    ap.add_argument("--kv", default=",".join(DTYPES), help=f"KV variants to time (default all: {','.join(DTYPES)})")
    ap.add_argument("--block-8bit", type=int, metavar="N", help="tokens per page of both 8-bit caches, a positive "
                    "multiple of 16 (default the engine's Qwen3.5-27B pages: fp8 1552, int8 1664)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, toy shapes, Triton interpreter")
    a = ap.parse_args(argv)
    if a.history is None:
        a.history = "0,40" if a.dry_run else "0,4096,16384,32768"
    if a.chunk is None:
        a.chunk = 20 if a.dry_run else 4096
    if a.block_8bit is not None and (a.block_8bit < 16 or a.block_8bit % 16):
        sys.exit(f"error: --block-8bit wants a positive multiple of 16; got {a.block_8bit}")
    histories = [int(x) for x in a.history.split(",")]
    kvs = [x for x in a.kv.split(",") if x]
    if not kvs or set(kvs) - set(DTYPES) or "bf16" not in kvs:
        sys.exit(f"error: --kv takes names from {', '.join(DTYPES)} and must include bf16 (the ratios' base)")
    if a.dry_run:
        if os.environ.get("TRITON_INTERPRET") != "1":
            sys.exit("error: --dry-run needs TRITON_INTERPRET=1 in the environment (Triton picks the interpreter "
                     "when the kernels are imported)")
        dry_run_setup()
    elif not torch.cuda.is_available():
        sys.exit("error: no GPU (use --dry-run to check the script on the CPU)")
    if a.block_8bit is not None:
        BLOCK["int8"] = BLOCK["fp8"] = a.block_8bit
    if a.ua_file and not os.path.isfile(a.ua_file):
        sys.exit(f"error: --ua-file {a.ua_file} is not a file")
    lines = []

    def log(msg):
        print(msg, flush=True)
        lines.append(msg)

    gpu = "cpu" if DEV == "cpu" else torch.cuda.get_device_name().replace(" ", "-").lower()
    ua = {}
    if a.ua_file:
        ua = {"upstream (BLOCK_M 16)": load_unified_attention(a.ua_file),
              "0005 BLOCK_M 64": load_unified_attention(a.ua_file, block_m=64)}
    gemm = gemm_tflops()
    log(f"dense bf16 GEMM 8192^3: {gemm:.0f} TFLOP/s")
    target = "interpreter" if DEV == "cpu" else launch_params.current_target(torch.device(DEV))
    if a.quick:
        entry = launch_params.get_params(target)
        best = {"kv16": dict(entry["kv16"]), "kv8": dict(entry["kv8"])}
    else:
        best = sweep(histories[-2:], a.chunk, log)
    # the direct launch beside the mirror (decode rows, short chunks, a sequence the mirror cannot hold) takes the
    # table's kv8_short, as in the engine; the sweep is over long chunks and does not choose it
    best["kv8_short"] = dict(launch_params.get_params(target)["kv8_short"])
    log(f"chosen: {best}")

    rows = []
    for h in histories:
        for name, (kind, software, mirror) in DTYPES.items():
            if name not in kvs or (DEV == "cpu" and name == "fp8_hw"):
                continue
            case = make_case(h, a.chunk, kind, software)
            params = best["kv16" if kind is None else "kv8" if mirror == 0 else "kv8_short"]
            if kind is not None and mirror is None and not os.environ.get(MIRROR_ENV, "").strip():
                # the engine's size (dcu/prefill_attention.engine_mirror_tokens); the variable, when set, rules
                mirror = max(MIRROR_DEFAULT_TOKENS, -(-(h + a.chunk) // MIRROR_PAGE) * MIRROR_PAGE)
            ms = time_ms(run_ours(case, params, best["kv16"], mirror))
            ours = case["out"].clone()
            row = dict(history=h, chunk=a.chunk, kv=name, ours_ms=ms, launch=params, flops=flops(h, a.chunk))
            for label, fn in ua.items():
                case["out"].zero_()
                row[f"{label} ms"] = time_ms(run_ua(fn, case))
                row[f"err vs {label}"] = rel_err(ours, case["out"])
            rows.append(row)
            log(f"{h // 1024}K {name}: ours {ms:.3f} ms " +
                " ".join(f"{k}={v:.3g}" for k, v in row.items() if k.endswith("ms") and k != "ours_ms"))
            del case
    by = {(r["history"], r["kv"]): r for r in rows}
    for r in rows:
        r["tflops"] = r["flops"] / (r["ours_ms"] * 1e-3) / 1e12
        r["gemm_share"] = r["tflops"] / gemm
        r["vs_bf16"] = r["ours_ms"] / by[(r["history"], "bf16")]["ours_ms"]

    date = datetime.date.today().isoformat()
    stem = f"{date}-{gpu}-prefill-attention" + ("-dry-run" if a.dry_run else "")
    cmd = "python -m kernels.prefill_attention.bench " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:]))
    md = [f"# Prefill attention, one Qwen3.5-27B layer ({HQ} q / {HKV} kv heads x {D}), {a.chunk}-token chunk", "",
          f"`{cmd}`", "", f"GPU {gpu}; dense bf16 GEMM {gemm:.0f} TFLOP/s; chosen {best}", "",
          "| history | KV | ours ms | TFLOP/s | % of GEMM | x bf16 | " + " | ".join(f"{k} ms | ours / it" for k in ua) + " |",
          "|---:|---|---:|---:|---:|---:|" + "---:|---:|" * len(ua)]
    for r in rows:
        md.append(f"| {r['history']} | {r['kv']} | {r['ours_ms']:.3f} | {r['tflops']:.0f} | {100 * r['gemm_share']:.0f}% | "
                  f"{r['vs_bf16']:.2f} | " + " | ".join(f"{r[k + ' ms']:.3f} | {r['ours_ms'] / r[k + ' ms']:.2f}" for k in ua)
                  + " |")
    names = list(dict.fromkeys(r["kv"] for r in rows))
    md += ["", f"Time as a multiple of bf16's ({a.chunk}-token chunk; columns: history):", "",
           "| KV | " + " | ".join(f"{h // 1024}K" if h % 1024 == 0 else str(h) for h in histories) + " |",
           "|---|" + "---:|" * len(histories)]
    for n in names:
        md.append(f"| {n} | " + " | ".join(f"{by[(h, n)]['vs_bf16']:.2f}" if (h, n) in by else "" for h in histories)
                  + " |")
    md += ["", "Relative error of ours vs each baseline's output (same inputs): " +
           ", ".join(f"{r['history'] // 1024}K {r['kv']}: " + "/".join(f"{r['err vs ' + k]:.1e}" for k in ua)
                     for r in rows), "", "Log:", "", "```", *lines, "```"]
    suggestion_fields, suggestion_md = suggestion("prefill", target, {**launch_params.get_params(target), **best})
    md += suggestion_md.split("\n")
    doc = dict(command=cmd, gpu=gpu, gemm_tflops=gemm, chosen=best, rows=rows, target=target, block_sizes=dict(BLOCK),
               **suggestion_fields)
    path = write_result_pair(a.out, stem, doc, md)
    print("\n".join(md[:md.index("Log:")]))  # the tables and the error lines
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
