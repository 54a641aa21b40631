"""Unified attention over fp8/int8_per_token_head caches (patch 0002) on a GPU at Qwen3.5-27B shapes
(24 q / 4 kv heads x 256, block 1552): mixed batches (2D kernel) and decode batches (3D kernel) against
the float64 reference over the same quantized cache; hardware and software e4m3 decode give identical
outputs; scales on S/P and dequantized tiles agree; end to end through the engine with each dtype.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.kv_quant import reshape_and_cache_per_token_head, split_kv_cache
from kernels.kv_quant.layout import kv_cache_shape
from kernels.kv_quant.reference import paged_attention_reference, relative_error
from tests.attention_checks import shuffled_block_table

pytestmark = pytest.mark.gpu

DEV = "cuda"
HQ, HKV, D, BS = 24, 4, 256, 1552
SEGMENTS = 16


@pytest.fixture(scope="module")
def unified_attention():
    from vllm.v1.attention.ops import triton_unified_attention as ua

    if "k_scale_cache" not in ua.unified_attention.__code__.co_varnames:
        pytest.fail("the vLLM under test lacks patch 0002 (unified_attention has no k_scale_cache)")
    return ua.unified_attention


def make_batch(query_lens, context_lens, kind, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    seq_lens = [c + q for c, q in zip(context_lens, query_lens)]
    table, num_blocks = shuffled_block_table(seq_lens, BS, g, spare=2)
    cache = torch.zeros(kv_cache_shape(num_blocks, BS, HKV, D), dtype=torch.uint8, device=DEV)
    views = split_kv_cache(cache, D, kind)
    for i, s in enumerate(seq_lens):
        pos = torch.arange(s, device=DEV)
        key = (torch.randn(s, HKV, D, device=DEV, generator=g) * 2).bfloat16()
        value = torch.randn(s, HKV, D, device=DEV, generator=g).bfloat16()
        reshape_and_cache_per_token_head(key, value, *views, table[i, pos // BS].long() * BS + pos % BS, kind)
    qsl = torch.tensor([0] + list(torch.tensor(query_lens).cumsum(0)), dtype=torch.int32, device=DEV)
    q = torch.randn(int(qsl[-1]), HQ, D, device=DEV, generator=g).bfloat16()
    return dict(cache=cache, views=views, table=table, qsl=qsl, q=q, max_q=max(query_lens),
                seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEV))


def run(unified_attention, b, kind, software_fp8=None, dequant_tiles=None):
    n = b["seq_lens"].shape[0]
    out = torch.full_like(b["q"], float("nan"))
    ones = torch.ones(n, HKV, device=DEV)
    so = torch.empty(32, HQ, SEGMENTS, D, device=DEV)
    sm = torch.empty(32, HQ, SEGMENTS, device=DEV)
    k_codes, v_codes, k_scales, v_scales = b["views"]
    unified_attention(b["q"], k_codes, v_codes, out, b["qsl"], b["max_q"], b["seq_lens"], int(b["seq_lens"].max()),
                      D**-0.5, True, (-1, -1), b["table"], 0, None, ones, ones, seq_threshold_3D=32,
                      num_par_softmax_segments=SEGMENTS, softmax_segm_output=so, softmax_segm_max=sm,
                      softmax_segm_expsum=torch.empty_like(sm), kv_quant=kind, k_scale_cache=k_scales,
                      v_scale_cache=v_scales, software_fp8=software_fp8, dequant_tiles=dequant_tiles)
    torch.cuda.synchronize()
    return out


CASES = [
    pytest.param([300, 1, 1, 37], [2000, 5000, 100, 0], id="mixed-2d"),
    pytest.param([1] * 6, [8191, 1, 1552, 1553, 3000, 40], id="decode-3d"),
]


@pytest.mark.parametrize("kind", ["fp8", "int8"])
@pytest.mark.parametrize("query_lens, context_lens", CASES)
def test_unified_attention_matches_reference(unified_attention, kind, query_lens, context_lens, record):
    b = make_batch(query_lens, context_lens, kind, seed=sum(context_lens))
    outs = {}
    for sw in ([True, False] if kind == "fp8" else [None]):
        outs[sw] = run(unified_attention, b, kind, software_fp8=sw)
    first = next(iter(outs.values()))
    assert torch.isfinite(first).all()
    for out in outs.values():
        assert torch.equal(out, first), "hardware and software e4m3 decode differ"
    want = paged_attention_reference(b["q"].float(), b["cache"], kind, b["table"], b["seq_lens"], b["qsl"], D**-0.5)
    err = relative_error(first.float(), want)
    record(rel_err=f"{err:.2e}")
    assert err < 1.5e-2, err
    tiles = run(unified_attention, b, kind, dequant_tiles=True)
    assert relative_error(tiles.float(), first.float()) < 1e-2


SCRIPT = Path(__file__).with_name("offline_generate.py")


@pytest.mark.parametrize("cache_dtype", ["fp8_per_token_head", "int8_per_token_head"])
def test_offline_generate_with_per_token_head_kv_cache(model_4l, run_env, harness, smoke_engine, tmp_path, record,
                                                       cache_dtype):
    kwargs = harness.engine_kwargs(model_4l, **smoke_engine)
    kwargs["kv_cache_dtype"] = cache_dtype
    out = tmp_path / "offline.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--engine-json", json.dumps(kwargs), "--out", str(out)],
                          env=run_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=540)
    assert proc.returncode == 0, f"offline generate failed ({proc.returncode}):\n" + "\n".join(
        proc.stdout.splitlines()[-60:])
    res = json.loads(out.read_text())
    record(engine_start_s=res["engine_start_s"], decode16_wall_s=res["calls"][1]["wall_s"])
    assert "NONE" not in res["cudagraph_mode"], res["cudagraph_mode"]
    for call in res["calls"]:
        for want, row in zip(call["max_tokens"], call["outputs"]):
            assert len(row["token_ids"]) == want and row["finish_reason"] == "length"
            assert row["n_logprobs"] == want and row["logprobs_finite"], (call["name"], row["prompt_len"])
    every = [t for call in res["calls"] for row in call["outputs"] for t in row["token_ids"]]
    assert len(set(every)) > 1, "every generated token is the same id (NaN logits?)"
