"""Decode GEMV on a GPU at Qwen3.5-27B's shapes (kernels/gemv), no vLLM needed:

    python -m pytest -m gpu --noconftest tests/gpu/test_gemv_gpu.py

Against float64: every dense decode GEMM (and gate_up fused with SiLU-and-mul) at 1-8 rows, relative
error no worse than the platform GEMM's (F.linear; + a separate SiLU-and-mul) and within the per-element
bound derived in tests/test_gemv.py; bias, fp16, ragged N and K; split-K deterministic and replayable in a CUDA
graph; one compiled kernel per row bucket; the dispatch table measured on the device (first start
and cached start times).
"""
import math
import time

import pytest
import torch
import torch.nn.functional as F

from kernels.gemv import dispatch, gemv, launch_params, silu_and_mul
from kernels.gemv.bench import SHAPES
from kernels.gemv.gemv import _gemv_kernel, _reduce_splits_kernel

pytestmark = pytest.mark.gpu
DEV = "cuda"
U32 = 2.0**-24
U_OUT = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def make(n, k, rows, dtype=torch.bfloat16, bias=False, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    w = (torch.randn(n, k, generator=g, device=DEV) / math.sqrt(k)).to(dtype)
    x = torch.randn(rows, k, generator=g, device=DEV).to(dtype)
    b = torch.randn(n, generator=g, device=DEV).to(dtype) if bias else None
    return x, w, b


def reference(x, w, b, silu):
    y = x.double() @ w.double().T
    if b is not None:
        y = y + b.double()
    if silu:
        d = y.shape[-1] // 2
        y = y[:, :d] * torch.sigmoid(y[:, :d]) * y[:, d:]
    return y


def bound(x, w, b, silu):
    """tests/test_gemv.py's per-element bound: fp32 accumulation of K products + one output rounding."""
    k = x.shape[-1]
    a = x.double().abs() @ w.double().abs().T
    if b is not None:
        a = a + b.double().abs()
    acc = 2 * (k + 2) * U32 * a
    y = reference(x, w, b, False)
    u = U_OUT[x.dtype]
    if not silu:
        return u * y.abs() + (1 + u) * acc
    d = y.shape[-1] // 2
    g, up, eg, eu = y[:, :d], y[:, d:], acc[:, :d], acc[:, d:]
    sg = g * torch.sigmoid(g)
    out = sg * up
    return u * out.abs() + (1 + u) * (1.1 * eg * up.abs() + sg.abs() * eu + 1.1 * eg * eu + 16 * U32 * out.abs())


def rel(y, ref):
    return float((y.double() - ref).norm() / ref.norm())


def platform(x, w, b, silu):
    y = F.linear(x, w, b)
    return silu_and_mul(y) if silu else y


@pytest.mark.parametrize("name,n,k,silu", SHAPES, ids=[s[0].replace(" ", "") for s in SHAPES])
def test_real_shapes_match_float64_no_worse_than_the_platform(name, n, k, silu):
    x8, w, b = make(n, k, 8)
    for rows in (1, 2, 3, 4, 5, 8):
        x = x8[:rows]
        ref = reference(x, w, b, silu)
        ours = gemv(x, w, b, silu_mul=silu)
        e_ours, e_plat = rel(ours, ref), rel(platform(x, w, b, silu), ref)
        assert e_ours <= 1.1 * e_plat + 1e-7, (rows, e_ours, e_plat)
        excess = ((ours.double() - ref).abs() - bound(x, w, b, silu)).max().item()
        assert excess <= 0, (rows, excess)
        del ref


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_bias_and_both_dtypes(dtype):
    # the last two: N and K that no tile divides (masked K tail, clamped rows), compiled on the device
    for n, k, silu in ((5120, 6144, False), (96, 5120, False), (2 * 17408, 5120, True), (1003, 1000, False),
                       (2 * 501, 1000, True)):
        x8, w, b = make(n, k, 8, dtype=dtype, bias=True)
        for rows in (1, 4, 7):
            x = x8[:rows]
            ref = reference(x, w, b, silu)
            ours = gemv(x, w, b, silu_mul=silu)
            assert ((ours.double() - ref).abs() <= bound(x, w, b, silu)).all()
            assert rel(ours, ref) <= 1.1 * rel(platform(x, w, b, silu), ref) + 1e-7


def test_split_k_is_deterministic_and_replays_in_a_cuda_graph():
    x, w, _ = make(96, 5120, 2)
    entry = launch_params.get_params(launch_params.current_target())
    cfg = launch_params.config_for(launch_params.current_target(), 96, 5120, 2, entry=entry)
    n_tiles = -(-96 // cfg["BLOCK_N"])
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert cfg.get("SPLIT_K") or launch_params.num_splits(n_tiles, 5120, cfg["BLOCK_K"], sms, entry) > 1
    first = gemv(x, w)
    for _ in range(5):
        assert torch.equal(gemv(x, w), first)
    static_x = x.clone()
    g = torch.cuda.CUDAGraph()
    gemv(static_x, w)  # compiled outside the capture
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        out = gemv(static_x, w)
    x2, _, _ = make(96, 5120, 2, seed=5)
    static_x.copy_(x2)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, gemv(x2, w))


def _compiled(kernel):
    return sum(len(cache[0]) for cache in kernel.device_caches.values())


def test_one_compiled_kernel_per_row_bucket():
    x, w, _ = make(5120, 6144, 8)
    for b in launch_params.ROW_BUCKETS:  # what the dispatch's warm-up compiles
        gemv(x[:b], w)
    before = (_compiled(_gemv_kernel), _compiled(_reduce_splits_kernel))
    for rows in (3, 5, 6, 7):
        gemv(x[:rows], w)
    assert (_compiled(_gemv_kernel), _compiled(_reduce_splits_kernel)) == before


def test_dispatch_table_on_the_device(tmp_path):
    weights = {(n, k, silu): make(n, k, 1)[1] for _, n, k, silu in SHAPES}
    ident = dispatch.cache_identity(torch.cuda.get_device_name(0), {"torch": torch.__version__, "test": "gemv-gpu"})
    logs, capture_problems = [], []

    def build(cache_dir):
        tab = dispatch.DispatchTable("auto", ident, cache_dir=cache_dir, log=logs.append)
        calls = {"measure": 0}
        t0 = time.perf_counter()
        for (n, k, silu), w in weights.items():
            key = dispatch.ShapeKey(n, k, "bfloat16", False, silu)
            measure, warm, release = dispatch.device_measure(
                w, None, lambda x, ww, b, s=silu: gemv(x, ww, b, silu_mul=s),
                lambda x, ww, b, s=silu: platform(x, ww, b, s), log=capture_problems.append)

            def counted(bucket, m=measure):
                calls["measure"] += 1
                return m(bucket)

            tab.ensure(key, counted, warm)
            release()
        torch.cuda.synchronize()
        return tab, time.perf_counter() - t0, calls["measure"]

    first, t_first, n_first = build(tmp_path / "a")  # includes the Triton compiles of this process
    again, t_timing, _ = build(tmp_path / "b")  # kernels compiled: the timing cost alone
    cached, t_cached, n_cached = build(tmp_path / "b")
    print(f"\nfirst start {t_first:.2f} s (with compiles), timing alone {t_timing:.2f} s, cached {t_cached:.2f} s")
    print("\n".join(logs[: len(weights)]))
    assert not capture_problems, capture_problems  # both sides were timed in CUDA graphs
    assert n_first == 4 * len(weights) and n_cached == 0
    assert t_timing < 5.0 and t_cached < 0.5
    for entry in again.entries.values():
        for e in entry.values():
            assert e["triton_us"] and e["platform_us"] and e["triton_us"] > 0 and e["platform_us"] > 0
