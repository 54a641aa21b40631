"""Patch 0007 in the patched vLLM tree, on the CPU: the hook in dispatch_unquantized_gemm, the custom
ops, the row routing (<= 8 rows: the measured side, more: the platform GEMM), the fused gate_up +
SiLU-and-mul in Qwen2MoeMLP, torch.compile, and the startup error for a bad VLLM_DCU_GEMV.

The GEMV runs in Triton's interpreter: tests add "cpu" to the op's device types and make the platform
look CUDA-like; timings are injected. The real device timing runs in tests/gpu/test_gemv_gpu.py.
"""
import json
import os
import subprocess
import sys
import types

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")
import triton_interp_compat  # noqa: E402,F401

from kernels.gemv.reference import gemv_reference  # noqa: E402

CUDA_LIKE = types.SimpleNamespace(is_cuda_alike=lambda: True, is_rocm=lambda: False, is_cpu=lambda: False,
                                  is_tpu=lambda: False, is_xpu=lambda: False)
N, K = 40, 48


@pytest.fixture
def hook(vllm_tree, monkeypatch, tmp_path):
    """vllm.dcu.gemv with a fresh table, the GEMV allowed on CPU tensors, a CUDA-like platform, and
    counters on both sides."""
    try:
        from vllm.dcu import gemv as dcu_gemv
        from vllm.model_executor.layers import utils
    except ImportError as e:
        pytest.fail(f"vllm.dcu.gemv is not in the patched tree ({e}): is 0007-dcu-decode-gemv.patch in patches/series?")
    import vllm.dcu_kernels.gemv as kernels_gemv

    monkeypatch.setenv("VLLM_DCU_GEMV_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(dcu_gemv, "_TABLES", {})
    monkeypatch.setattr(dcu_gemv, "DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(dcu_gemv, "current_platform", CUDA_LIKE)
    monkeypatch.setattr(utils, "current_platform", CUDA_LIKE)
    calls = {"gemv": 0, "platform": 0}
    real_gemv, real_platform = kernels_gemv.gemv, dcu_gemv.platform_linear

    def counted_gemv(*a, **kw):
        calls["gemv"] += 1
        return real_gemv(*a, **kw)

    def counted_platform(*a, **kw):
        calls["platform"] += 1
        return real_platform(*a, **kw)

    monkeypatch.setattr(kernels_gemv, "gemv", counted_gemv)
    monkeypatch.setattr(dcu_gemv, "platform_linear", counted_platform)
    return types.SimpleNamespace(mod=dcu_gemv, utils=utils, calls=calls, cache=tmp_path)


def weights(n=N, k=K, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=g) / k**0.5).half()


def close(y, ref):
    return float((y.double() - ref).norm() / ref.norm()) < 2e-3


def test_hook_returns_the_decode_gemm_on_cuda_and_rocm_unless_off(hook, monkeypatch):
    utils = hook.utils
    assert utils.dcu_gemv is hook.mod
    assert utils.dispatch_unquantized_gemm() is hook.mod.decode_unquantized_gemm
    monkeypatch.setattr(hook.mod, "ENABLED", False)  # VLLM_DCU_GEMV=off: upstream's choice, untouched
    assert utils.dispatch_unquantized_gemm() is utils.default_unquantized_gemm
    rocm = types.SimpleNamespace(**{**vars(CUDA_LIKE), "is_rocm": lambda: True})
    monkeypatch.setattr(utils, "current_platform", rocm)
    assert utils.dispatch_unquantized_gemm() is utils.rocm_unquantized_gemm


def test_up_to_8_rows_run_the_gemv_and_more_rows_the_platform(hook, monkeypatch):
    monkeypatch.setattr(hook.mod, "MODE", "triton")
    w = weights()
    gemm = hook.utils.dispatch_unquantized_gemm()
    y = gemm(None, torch.randn(16, K).half(), w)  # first sight (a profile run's batch): every bucket compiled
    assert hook.calls == {"gemv": 4, "platform": 1}
    for rows in range(1, 9):
        x = torch.randn(rows, K).half()
        before = dict(hook.calls)
        y = gemm(None, x, w)
        assert hook.calls["gemv"] == before["gemv"] + 1 and hook.calls["platform"] == before["platform"], rows
        assert close(y, gemv_reference(x, w))
    for rows in (9, 16):
        before = dict(hook.calls)
        y = gemm(None, torch.randn(rows, K).half(), w)
        assert hook.calls["platform"] == before["platform"] + 1 and hook.calls["gemv"] == before["gemv"]
    # a 3-D activation keeps its leading dims
    x3 = torch.randn(2, 3, K).half()
    assert close(gemm(None, x3, w), gemv_reference(x3, w))
    # unaligned input (a view starting one element in): the platform, no new Triton specialization
    xs = torch.randn(1, K + 1).half()[:, 1:]
    before = dict(hook.calls)
    gemm(None, xs, w)
    assert hook.calls["platform"] == before["platform"] + 1


def test_auto_mode_follows_the_measured_table_and_caches_it(hook, monkeypatch):
    # injected timings, in bucket order 1, 2, 4, 8: the GEMV faster at 1 and 2 rows only
    script = iter([{"triton": 10.0, "platform": 20.0}, {"triton": 10.0, "platform": 20.0},
                   {"triton": 30.0, "platform": 20.0}, {"triton": 30.0, "platform": 20.0}])
    monkeypatch.setattr(hook.mod.gemv_dispatch, "time_on_device", lambda calls, copies, **kw: next(script))
    w = weights()
    gemm = hook.mod.decode_unquantized_gemm
    gemm(None, torch.randn(32, K).half(), w)
    tab = hook.mod.table(w.device)
    assert [tab.choice(tab_key(hook), r) for r in range(1, 9)] == ["triton"] * 2 + ["platform"] * 6
    before = dict(hook.calls)
    gemm(None, torch.randn(2, K).half(), w)
    gemm(None, torch.randn(3, K).half(), w)
    assert hook.calls["gemv"] == before["gemv"] + 1 and hook.calls["platform"] == before["platform"] + 1
    files = list(hook.cache.glob("tuned/*.json"))
    assert len(files) == 1 and tab_key(hook).id in json.loads(files[0].read_text())["gemv"]
    # a new process (fresh tables, nothing loaded) reads the file: no timing at all
    monkeypatch.setattr(hook.mod, "_TABLES", {})
    hook.mod.decisions.reset()
    monkeypatch.setattr(hook.mod.gemv_dispatch, "time_on_device", lambda *a, **kw: pytest.fail("timed again"))
    gemm(None, torch.randn(32, K).half(), w)
    assert hook.mod.table(w.device).choice(tab_key(hook), 1) == "triton"


def tab_key(hook):
    return hook.mod.gemv_dispatch.ShapeKey(N, K, "float16")


def test_a_failing_measurement_falls_back_to_the_platform(hook, monkeypatch):
    def broken(*a, **kw):
        raise RuntimeError("no timer here")

    monkeypatch.setattr(hook.mod.gemv_dispatch, "time_on_device", broken)
    w = weights()
    x = torch.randn(1, K).half()
    y = hook.mod.decode_unquantized_gemm(None, x, w)
    assert close(y, gemv_reference(x, w))
    assert hook.mod.table(w.device).choice(tab_key(hook), 1) == "platform"


def test_custom_ops_have_fake_implementations(hook):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(5, K, dtype=torch.bfloat16)
        w = torch.empty(2 * N, K, dtype=torch.bfloat16)
        assert torch.ops.vllm.dcu_decode_gemm(x, w, None).shape == (5, 2 * N)
        assert torch.ops.vllm.dcu_decode_gemm_silu_mul(x, w, None).shape == (5, N)


def test_torch_compile_sees_one_op_and_does_not_recompile_by_rows(hook, monkeypatch):
    import torch._dynamo

    monkeypatch.setattr(hook.mod, "MODE", "triton")
    w = weights()
    gemm = hook.utils.dispatch_unquantized_gemm()
    torch._dynamo.reset()
    frames = []

    def backend(gm, example_inputs):
        frames.append([n.target for n in gm.graph.nodes if n.op == "call_function"])
        return gm.forward

    fn = torch.compile(lambda x: gemm(None, x, w) * 2, backend=backend, fullgraph=True)
    for rows in (16, 2, 5, 8):
        x = torch.randn(rows, K).half()
        torch._dynamo.mark_dynamic(x, 0)
        assert close(fn(x) / 2, gemv_reference(x, w))
    assert len(frames) == 1, frames  # one graph for every row count, no graph break
    op = torch.ops.vllm.dcu_decode_gemm
    assert op in frames[0] or op.default in frames[0], frames


class MergedColumnParallelLinear(torch.nn.Module):
    """Stands in for vLLM's class of that name (the hook checks the exact type name); calling it
    means the unfused path ran."""

    def __init__(self, weight):
        super().__init__()
        from vllm.model_executor.layers.linear import UnquantizedLinearMethod

        self.weight = weight
        self.bias = None
        self.quant_method = UnquantizedLinearMethod()
        self.gather_output = False
        self.skip_bias_add = False
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return torch.nn.functional.linear(x, self.weight), None


def mlp(gate_up):
    from vllm.model_executor.models.qwen2_moe import Qwen2MoeMLP

    def act(y):
        d = y.shape[-1] // 2
        return torch.nn.functional.silu(y[..., :d]) * y[..., d:]

    fake = types.SimpleNamespace(gate_up_proj=gate_up, act_fn=act, down_proj=lambda x: (x, None), expert_gate=None)
    return lambda x: Qwen2MoeMLP.forward(fake, x)


def test_qwen2_moe_mlp_runs_gate_up_and_silu_mul_as_one_op(hook, monkeypatch):
    monkeypatch.setattr(hook.mod, "MODE", "triton")
    w = weights(2 * N, K)
    gate_up = MergedColumnParallelLinear(w)
    for rows in (1, 8, 12):
        x = torch.randn(rows, K).half()
        y = mlp(gate_up)(x)  # down_proj is the identity here
        assert y.shape == (rows, N) and close(y, gemv_reference(x, w, silu_mul=True))
    assert gate_up.calls == 0
    assert hook.calls["gemv"] == 4 + 2  # warm-up of every bucket, then rows 1 and 8; rows 12: platform + SiLU-mul
    for mode_off in ("platform",):
        monkeypatch.setattr(hook.mod, "MODE", mode_off)
        mlp(gate_up)(torch.randn(2, K).half())
        assert gate_up.calls == 1
    monkeypatch.setattr(hook.mod, "MODE", "triton")
    monkeypatch.setattr(hook.mod, "SILU_MUL", False)
    mlp(gate_up)(torch.randn(2, K).half())
    assert gate_up.calls == 2


def test_wrapped_or_quantized_gate_up_keeps_the_unfused_path(hook, monkeypatch):
    monkeypatch.setattr(hook.mod, "MODE", "triton")
    gate_up = MergedColumnParallelLinear(weights(2 * N, K))
    gate_up.quant_method = object()  # e.g. an fp8 method
    mlp(gate_up)(torch.randn(2, K).half())
    assert gate_up.calls == 1
    gate_up = MergedColumnParallelLinear(weights(2 * N, K))
    gate_up.gather_output = True
    mlp(gate_up)(torch.randn(2, K).half())
    assert gate_up.calls == 1


def test_bad_mode_fails_when_vllm_imports_its_layers(vllm_tree):
    env = {**os.environ, "VLLM_DCU_GEMV": "fast"}
    proc = subprocess.run([sys.executable, "-c", "import vllm.model_executor.layers.utils"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last == "ValueError: VLLM_DCU_GEMV='fast' is not one of auto, triton, platform, off", proc.stderr[-2000:]


def test_torch_compile_traces_the_mlp_hook_into_one_op(hook, monkeypatch):
    import torch._dynamo
    from vllm.model_executor.models.qwen2_moe import Qwen2MoeMLP

    monkeypatch.setattr(hook.mod, "MODE", "triton")

    class Mlp(torch.nn.Module):
        forward = Qwen2MoeMLP.forward

        def __init__(self, w):
            super().__init__()
            self.gate_up_proj = MergedColumnParallelLinear(w)
            self.act_fn = None  # never called: the fused op covers it
            self.down_proj = lambda x: (x, None)
            self.expert_gate = None

    w = weights(2 * N, K)
    m = Mlp(w)
    torch._dynamo.reset()
    frames = []

    def backend(gm, example_inputs):
        frames.append([n.target for n in gm.graph.nodes if n.op == "call_function"])
        return gm.forward

    fn = torch.compile(m, backend=backend, fullgraph=True)
    for rows in (16, 3):
        x = torch.randn(rows, K).half()
        torch._dynamo.mark_dynamic(x, 0)
        assert close(fn(x), gemv_reference(x, w, silu_mul=True))
    op = torch.ops.vllm.dcu_decode_gemm_silu_mul
    assert len(frames) == 1 and (op in frames[0] or op.default in frames[0]), frames
    assert m.gate_up_proj.calls == 0
