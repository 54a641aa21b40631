"""Per-(token, head) KV cache write on a GPU: hardware vs software e4m3 paths bit-identical, kernel vs
torch reference bit-exact at Qwen3.5-27B shapes (4 kv heads x 256), no NaN/Inf for any finite bf16,
CUDA-graph replay with changing slots.
"""
import pytest
import torch

from kernels.kv_quant import reshape_and_cache_per_token_head, split_kv_cache
from kernels.kv_quant.layout import kv_cache_shape
from kernels.kv_quant.reference import dequantize_per_token_head, reshape_and_cache_reference
from tests.fp8_codec_kernels import decode, encode

pytestmark = pytest.mark.gpu

DEV = "cuda"
H, D = 4, 256


def _all_finite_bf16() -> torch.Tensor:
    x = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    return x[torch.isfinite(x.float())].to(DEV)


def test_hw_and_sw_e4m3_decode_bit_identical_for_every_finite_code(record):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).to(DEV)
    finite = (codes & 0x7F) != 0x7F
    hw = decode(codes, software=False, block=1024)
    sw = decode(codes, software=True, block=1024)
    assert torch.equal(hw[finite].view(torch.int32), sw[finite].view(torch.int32))
    assert torch.equal(hw[finite].view(torch.int32), codes[finite].view(torch.float8_e4m3fn).float().view(torch.int32))
    record(codes_checked=int(finite.sum()))


def test_hw_and_sw_e4m3_encode_bit_identical(record):
    g = torch.Generator(device=DEV).manual_seed(0)
    n = 4_000_000
    mag = torch.exp2(torch.empty(n, device=DEV).uniform_(-30, 12, generator=g))
    x = mag * torch.where(torch.rand(n, device=DEV, generator=g) < 0.5, -1.0, 1.0)
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    vals = codes[(codes & 0x7F) != 0x7F].view(torch.float8_e4m3fn).float()
    pos = torch.sort(vals[vals >= 0]).values.unique()
    mids = ((pos[:-1].double() + pos[1:].double()) / 2).float()
    x = torch.cat([x, _all_finite_bf16().float(), mids.to(DEV), -mids.to(DEV)])
    hw = encode(x, software=False)
    sw = encode(x, software=True)
    assert torch.equal(hw, sw)
    assert torch.equal(sw, x.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8))
    record(values_checked=x.numel())


def _case(t, nb, bs, seed, scale_k=2.0, scale_v=0.05):
    g = torch.Generator(device=DEV).manual_seed(seed)
    key = (torch.randn(t, H, D, device=DEV, generator=g) * scale_k).bfloat16()
    value = (torch.randn(t, H, D, device=DEV, generator=g) * scale_v).bfloat16()
    slots = torch.randperm(nb * bs, device=DEV, generator=g)[:t]
    slots[::7] = -1
    return key, value, slots


def _diff(got, want):
    """Where two caches differ: byte counts in the code and scale regions, worst scale ratio."""
    gk, _, gs, _ = split_kv_cache(got, D, "fp8")  # K and its scales: the same layout for every kind
    wk, _, ws, _ = split_kv_cache(want, D, "fp8")
    codes = int((gk != wk).sum())
    scales = int((gs != ws).sum())
    ratio = float((gs / ws.where(ws != 0, torch.ones_like(ws))).sub(1).abs().max()) if scales else 0.0
    return f"{int((got != want).sum())} bytes differ: K codes {codes}, K scales {scales} (worst rel {ratio:.3g})"


@pytest.mark.parametrize("kind", ["fp8", "int8"])
def test_write_kernel_matches_torch_reference_bit_exact(kind, record):
    nb, bs = 12, 784
    key, value, slots = _case(4096, nb, bs, seed=1)
    want = torch.full(kv_cache_shape(nb, bs, H, D), 0x5A, dtype=torch.uint8, device=DEV)
    reshape_and_cache_reference(key, value, want, slots, kind)
    paths = [True, False] if kind == "fp8" else [None]
    for software in paths:
        got = torch.full_like(want, 0x5A)
        reshape_and_cache_per_token_head(key, value, *split_kv_cache(got, D, kind), slots, kind, software_fp8=software)
        assert torch.equal(got, want), f"software_fp8={software}: {_diff(got, want)}"
    record(tokens=key.shape[0], paths=len(paths))


@pytest.mark.parametrize("kind", ["fp8", "int8"])
def test_write_kernel_every_finite_bf16_value_finite_and_paths_identical(kind):
    vals = _all_finite_bf16()
    n = vals.numel() // (H * D) * (H * D)
    g = torch.Generator(device=DEV).manual_seed(2)
    key = vals[torch.randperm(vals.numel(), device=DEV, generator=g)[:n]].view(-1, H, D)
    value = torch.sort(vals.float().abs()).values[:n].bfloat16().view(-1, H, D)  # tiny heads and huge heads
    t = key.shape[0]
    caches = []
    for software in ([True, False] if kind == "fp8" else [None]):
        cache = torch.zeros(kv_cache_shape(1, t, H, D), dtype=torch.uint8, device=DEV)
        reshape_and_cache_per_token_head(
            key, value, *split_kv_cache(cache, D, kind), torch.arange(t, device=DEV), kind, software_fp8=software
        )
        caches.append(cache)
    assert all(torch.equal(c, caches[0]) for c in caches[1:])
    k_codes, v_codes, k_scales, v_scales = split_kv_cache(caches[0], D, kind)
    for codes, scales in ((k_codes, k_scales), (v_codes, v_scales)):
        assert torch.isfinite(scales).all() and (scales >= 0).all()
        assert torch.isfinite(dequantize_per_token_head(codes, scales, kind)).all()
        if kind == "fp8":
            assert ((codes & 0x7F) != 0x7F).all()


@pytest.mark.parametrize("kind", ["fp8", "int8"])
def test_write_kernel_replays_in_cuda_graph_with_new_slots(kind):
    nb, bs, t = 8, 16, 32
    key, value, _ = _case(t, nb, bs, seed=3)
    slots = torch.zeros(t, dtype=torch.int64, device=DEV)
    cache = torch.zeros(kv_cache_shape(nb, bs, H, D), dtype=torch.uint8, device=DEV)
    views = split_kv_cache(cache, D, kind)
    reshape_and_cache_per_token_head(key, value, *views, slots, kind)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        reshape_and_cache_per_token_head(key, value, *views, slots, kind)
    for seed in (4, 5):
        g = torch.Generator(device=DEV).manual_seed(seed)
        slots.copy_(torch.randperm(nb * bs, device=DEV, generator=g)[:t])
        slots[::5] = -1
        cache.zero_()
        graph.replay()
        want = torch.zeros_like(cache)
        reshape_and_cache_reference(key, value, want, slots, kind)
        assert torch.equal(cache, want), _diff(cache, want)
