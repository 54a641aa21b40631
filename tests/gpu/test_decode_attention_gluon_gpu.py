"""The Gluon stage 1 of the fp8 decode (launch key gluon, kernels/decode_attention/gluon_stage1.py) on a GPU.

Each test turns the key on through VLLM_DCU_DECODE_PARAMS, checks that the Gluon kernel really ran (a spy on its
launcher) and compares with the float32 / float64 references as the Triton kernel's tests do: ragged lengths around
the tile size, hybrid page sizes (tiles straddling pages), forced and balanced splits, garbage past the end of the
last page, the value range, and the Triton kernel's own output; fp8 (V by token, as fp8 caches hold it) with hardware
and software e4m3, int8 (V by dim, as int8 caches hold it). fp8 with V by dim and short pages stay on the Triton
kernel.
"""
import importlib
import json

import pytest
import torch

from kernels.decode_attention import launch_params
from tests.attention_checks import v_by_dim
from tests.gpu.test_decode_attention_gpu import check, check_rel, make_case, run

pytestmark = pytest.mark.gpu
gluon_module = importlib.import_module("kernels.decode_attention.gluon_stage1")

CONFIGS = {  # the kv8 entry's gluon launch: sm90's (4 warps, 2 m-tiles of keys each), 16 keys per warp, BLOCK_N 64
    "b128w4s2": {"BLOCK_N": 128, "num_warps": 4, "num_stages": 2, "programs_per_cu": 1},
    "b128w8s2": {"BLOCK_N": 128, "num_warps": 8, "num_stages": 2, "programs_per_cu": 1},
    "b64w4s3": {"BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
}


@pytest.fixture(params=list(CONFIGS))
def gluon_on(request, monkeypatch):
    """Turns the key on and counts the Gluon launches."""
    monkeypatch.setenv(launch_params.ENV_VAR, json.dumps({"kv8": {"gluon": CONFIGS[request.param]}}))
    calls = []
    real = gluon_module.launch_gluon_stage1

    def spy(*args, **kw):
        calls.append(kw)
        return real(*args, **kw)

    monkeypatch.setattr(gluon_module, "launch_gluon_stage1", spy)
    return calls


# (kind, software e4m3): fp8 caches hold V by token, int8 caches by dim (kv_quant.layout.V_BY_DIM)
KINDS = [("fp8", False), ("fp8", True), ("int8", False)]
KIND_IDS = ["fp8-hw", "fp8-sw", "int8"]


@pytest.mark.parametrize("kv_quant,software", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("block_size", [128, 784, 1552])
def test_gluon_stage1_matches_reference_at_ragged_lengths(gluon_on, kv_quant, software, block_size):
    case = make_case([1, 127, 128, 129, 777, 5000, 16385, 3], block_size, kv_quant=kv_quant, seed=1)
    check(run(case, software_fp8=software), case)
    assert gluon_on, "the Gluon stage 1 did not run"


@pytest.mark.parametrize("kv_quant,software", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("num_splits", [1, 2, 7, 200])
def test_gluon_stage1_forced_splits(gluon_on, kv_quant, software, num_splits):
    case = make_case([16385, 300, 4099], 1552, kv_quant=kv_quant, seed=2)
    check(run(case, software_fp8=software, num_splits=num_splits), case)
    assert gluon_on


@pytest.mark.parametrize("kv_quant,software", KINDS, ids=KIND_IDS)
def test_gluon_stage1_agrees_with_the_triton_kernel(gluon_on, monkeypatch, kv_quant, software):
    case = make_case([9000, 1, 33, 20000], 784, kv_quant=kv_quant, seed=3)
    got = run(case, software_fp8=software)
    assert gluon_on
    monkeypatch.setenv(launch_params.ENV_VAR, json.dumps({"kv8": {"gluon": None}}))
    n = len(gluon_on)
    want = run(case, software_fp8=software)
    assert len(gluon_on) == n  # the Triton kernel this time
    err = (got.float() - want.float()).norm() / want.float().norm()
    assert err < 5e-3, f"relative difference {err.item():.2e}"


@pytest.mark.parametrize("kv_quant,software", KINDS, ids=KIND_IDS)
def test_gluon_stage1_ignores_garbage_past_the_end_of_the_last_page(gluon_on, kv_quant, software):
    # 0x7f is NaN to the hardware e4m3 decode and NaN scales past the end: 0 x NaN would reach the output if such a
    # slot were read (int8's V by dim reads its codes, finite, and their P' is 0)
    lens = [1000, 1553, 17, 130]
    case = make_case(lens, 1552, kv_quant=kv_quant, seed=5)
    bs = case["k_cache"].shape[1]
    for b, n in enumerate(lens):
        page = case["block_table"][b, (n - 1) // bs]
        for cache in (case["k_cache"], case["v_cache"]):
            cache[page, (n - 1) % bs + 1:] = 0x7F
        for scales in (case["k_scales"], case["v_scales"]):
            scales[page, (n - 1) % bs + 1:] = float("nan")
    check(run(case, software_fp8=software), case)
    assert gluon_on


@pytest.mark.parametrize("kv_quant,software", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("k_mag,v_mag", [(2.0, 1e-6), (6e4, 1e5), (6e4, 1e-6)])
def test_gluon_stage1_across_the_value_range(gluon_on, kv_quant, software, k_mag, v_mag):
    case = make_case([16385, 5000, 17], 1552, kv_quant=kv_quant, seed=8, k_mag=k_mag, v_mag=v_mag)
    check_rel(run(case, software_fp8=software), case)
    check_rel(run(case, software_fp8=software, num_splits=1), case)
    assert gluon_on


def test_gluon_stage1_takes_queries_beyond_fp16_range(gluon_on):
    case = make_case([3000, 90], 1552, kv_quant="fp8", seed=6)
    case["q"] = (case["q"].float() * 3e4).to(torch.bfloat16)
    case["scale"] = 256**-0.5 / 3e4
    check(run(case), case)
    assert gluon_on


@pytest.mark.parametrize("kv_quant,block_size,v_layout", [("fp8", 16, "token"), ("int8", 16, "dim"),
                                                        ("fp8", 1552, "dim")])
def test_short_pages_and_fp8_v_by_dim_keep_the_triton_kernel(gluon_on, kv_quant, block_size, v_layout):
    # where the Gluon stage 1 does not apply (pages shorter than BLOCK_N; fp8 with V by dim, a layout no fp8 cache
    # holds), the Triton kernel runs
    case = make_case([3000, 90], block_size, kv_quant=kv_quant, seed=7)
    if v_layout == "dim" and kv_quant == "fp8":
        case["v_cache"] = v_by_dim(case["v_cache"])
    check(run(case), case)
    assert not gluon_on
