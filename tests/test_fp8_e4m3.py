"""OCP e4m3 codec (kernels/fp8_e4m3.py), software path, against torch's float8_e4m3fn.

Runs the Triton device functions in the CPU interpreter. The hardware path is compared
with the software path on a GPU in tests/gpu/test_kv_quant_gpu.py.
"""
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from fp8_codec_kernels import decode, encode  # noqa: E402  (after TRITON_INTERPRET: interpreted kernels)
from kernels.fp8_e4m3 import E4M3_MAX, use_software_fp8  # noqa: E402


def torch_encode(x: torch.Tensor) -> torch.Tensor:
    """Reference: saturate to +-448, then torch's round-to-nearest-even cast."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


ALL_CODES = torch.arange(256, dtype=torch.int32).to(torch.uint8)
FINITE = (ALL_CODES & 0x7F) != 0x7F


def test_decode_matches_torch_for_all_finite_codes():
    got = decode(ALL_CODES)
    want = ALL_CODES.view(torch.float8_e4m3fn).float()
    assert torch.equal(got[FINITE].view(torch.int32), want[FINITE].view(torch.int32))  # incl. -0.0


def test_decode_nan_codes_give_plus_minus_480():
    got = decode(torch.tensor([0x7F, 0xFF], dtype=torch.uint8))
    assert got.tolist() == [480.0, -480.0]


def test_decode_subnormals_are_multiples_of_2_pow_minus_9():
    got = decode(torch.arange(1, 8, dtype=torch.uint8))
    assert got.tolist() == [m * 2.0**-9 for m in range(1, 8)]


def _finite_values() -> torch.Tensor:
    return ALL_CODES[FINITE].view(torch.float8_e4m3fn).float()


def test_encode_round_trips_every_finite_code():
    vals = _finite_values()
    got = encode(vals)
    assert torch.equal(got, ALL_CODES[FINITE])


def test_encode_rounds_ties_to_even_like_torch():
    # midpoints between consecutive non-negative codes (normal and subnormal), both signs
    pos = torch.sort(_finite_values()[_finite_values() >= 0]).values.unique()
    mids = (pos[:-1].double() + pos[1:].double()) / 2
    mids = mids.float()
    assert torch.equal(mids.double(), (pos[:-1].double() + pos[1:].double()) / 2)  # exact in fp32
    x = torch.cat([mids, -mids])
    got, want = encode(x), torch_encode(x)
    assert torch.equal(got, want)
    # ties really go to the even code (spot check: 1.0625 is between 1.0 (0x38) and 1.125 (0x39))
    assert encode(torch.tensor([1.0625, 1.1875]).float()).tolist() == [0x38, 0x3A]


def test_encode_one_ulp_around_midpoints_matches_torch():
    pos = _finite_values()
    pos = torch.sort(pos[pos >= 0]).values.unique()
    mids = ((pos[:-1].double() + pos[1:].double()) / 2).float()
    up = torch.nextafter(mids, torch.full_like(mids, float("inf")))
    down = torch.nextafter(mids, torch.zeros_like(mids))
    x = torch.cat([up, down, -up, -down])
    assert torch.equal(encode(x), torch_encode(x))


def test_encode_saturates_instead_of_nan():
    big = torch.tensor([448.0, 449.0, 464.0, 465.0, 1e4, 3.3895e38, float("inf")])
    x = torch.cat([big, -big])
    got = encode(x)
    assert got.tolist() == [0x7E] * 7 + [0xFE] * 7
    assert torch.equal(got, torch_encode(x))


def test_encode_subnormal_and_underflow_range_matches_torch():
    # everything below the smallest normal (2^-6), down into fp32 denormals
    x = torch.cat([
        torch.linspace(0, 2.0**-6, 4097),
        torch.logspace(-45, -2, 2000, base=10.0),
        torch.tensor([1e-45, 2.0**-149, 2.0**-126, 2.0**-10, 2.0**-10 * 1.0000001]),
    ]).float()
    x = torch.cat([x, -x])
    assert torch.equal(encode(x), torch_encode(x))


def test_encode_random_fp32_matches_torch():
    g = torch.Generator().manual_seed(0)
    # log-uniform magnitudes over the whole e4m3 range and beyond, random signs, random mantissas
    mag = torch.exp2(torch.empty(200_000).uniform_(-30, 12, generator=g))
    sign = torch.where(torch.rand(200_000, generator=g) < 0.5, -1.0, 1.0)
    x = (mag * sign).float()
    assert torch.equal(encode(x), torch_encode(x))


def test_encode_negative_zero_keeps_sign():
    assert encode(torch.tensor([0.0, -0.0, -1e-30])).tolist() == [0x00, 0x80, 0x80]


def test_use_software_fp8_env_override(monkeypatch):
    monkeypatch.setenv("VLLM_DCU_FP8_SOFTWARE", "0")
    assert use_software_fp8() is False
    monkeypatch.setenv("VLLM_DCU_FP8_SOFTWARE", "1")
    assert use_software_fp8() is True
    monkeypatch.setenv("VLLM_DCU_FP8_SOFTWARE", "yes")
    with pytest.raises(ValueError, match="must be 0 or 1"):
        use_software_fp8()
    monkeypatch.delenv("VLLM_DCU_FP8_SOFTWARE")
    assert use_software_fp8() is True  # interpreter / no GPU picks software
