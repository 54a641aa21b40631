"""Decode GEMV (kernels/gemv) against the float64 reference, in Triton's CPU interpreter at small shapes.

Error bound, per output element (checked element by element, not only in norm). The reference is
float64 on the same fp16/bf16 inputs, so only the kernel's own arithmetic counts:
  * products of two fp16 or bf16 numbers are exact in fp32 (11 + 11 and 8 + 8 significant bits <= 24);
  * K products, the bias and (split-K) the partial sums are added in fp32 in some order: at most
    K + 2 additions, each rounding by at most u32 = 2^-24 of a partial sum no larger than
    A = sum_k |x_k w_k| + |b|, so |y32 - y| <= gamma * A with gamma = (K + 2) u32 (doubled below
    for the tensor cores' accumulation on GPUs, which need not round to nearest);
  * one rounding to the output dtype: u_out * |y32| with u_out = 2^-8 (bf16), 2^-11 (fp16).
  => |y_out - y| <= u_out |y| + (1 + u_out) * 2 (K + 2) u32 A.
Fused SiLU-and-mul, out = silu(g) * u with g, u carrying the errors e_g, e_u above: |silu'| <= 1.1, so
|silu(g') u' - silu(g) u| <= 1.1 e_g |u| + |silu(g)| e_u + 1.1 e_g e_u, plus the fp32 exp / divide /
multiply (allowed 16 u32 relative, which also covers a GPU's approximate exp), then the output
rounding. Bounds are computed in float64 from the actual inputs (gemv_bound below).
"""
import json
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
import triton_interp_compat  # noqa: E402,F401

from kernels.gemv import gemv, launch_params, silu_and_mul  # noqa: E402
from kernels.gemv.reference import gemv_reference  # noqa: E402

@pytest.fixture(autouse=True)
def bf16_round_to_nearest(monkeypatch):
    """The Triton 3.6 interpreter converts fp32 to bf16 by truncation (relative error up to 2^-7),
    where the GPU backends round to nearest even (2^-8, the bound below). For these tests only,
    fp32 -> bf16 goes through torch's round-to-nearest-even conversion."""
    import numpy as np
    import triton.language as tl
    import triton.runtime.interpreter as interp

    original = interp._convert_float

    def convert(data, src, dst, rounding_mode):
        if src == tl.float32 and dst == tl.bfloat16:
            t = torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32)).to(torch.bfloat16)
            return t.view(torch.int16).numpy().view(np.uint16)
        return original(data, src, dst, rounding_mode)

    monkeypatch.setattr(interp, "_convert_float", convert)


U32 = 2.0**-24
U_OUT = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}

FMA1 = {"DOT": 0, "BLOCK_N": 8, "BLOCK_K": 16, "num_warps": 1, "num_stages": 1}
DOT = {"DOT": 1, "BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 1, "num_stages": 1}


def gemv_bound(x, w, b, silu_mul, dtype):
    """Per-element error bound of the kernel's output (module docstring)."""
    k = x.shape[-1]
    a = x.double().abs() @ w.double().abs().T
    if b is not None:
        a = a + b.double().abs()
    acc_err = 2 * (k + 2) * U32 * a
    y = gemv_reference(x, w, b)
    u_out = U_OUT[dtype]
    if not silu_mul:
        return u_out * y.abs() + (1 + u_out) * acc_err
    d = y.shape[-1] // 2
    g, u = y[..., :d], y[..., d:]
    eg, eu = acc_err[..., :d], acc_err[..., d:]
    silu_g = g * torch.sigmoid(g)
    out = silu_g * u
    err = 1.1 * eg * u.abs() + silu_g.abs() * eu + 1.1 * eg * eu + 16 * U32 * out.abs()
    return u_out * out.abs() + (1 + u_out) * err


def case(rows, n, k, dtype, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    return x, w, b


def check(y, x, w, b, silu_mul=False):
    ref = gemv_reference(x, w, b, silu_mul=silu_mul)
    assert y.dtype == x.dtype and y.shape == ref.shape
    err = (y.double() - ref).abs()
    bound = gemv_bound(x, w, b, silu_mul, x.dtype)
    worst = (err - bound).max().item()
    assert worst <= 0, f"error above the bound by {worst:.3e} (max error {err.max().item():.3e})"
    return err


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8])
def test_matches_float64_reference_at_every_row_count_with_the_table_params(rows, dtype):
    # odd N and K: no tile divides them (interpreter tiles: BLOCK_N 4 / 16, BLOCK_K 16)
    x, w, b = case(rows, 37, 83, dtype)
    check(gemv(x, w, b), x, w, b)
    check(gemv(x, w), x, w, None)


@pytest.mark.parametrize("cfg", [
    FMA1,
    {**FMA1, "SPLIT_K": 3},
    DOT,
    {**DOT, "SPLIT_K": 2},
    {**DOT, "BLOCK_K": 16, "SPLIT_K": 5},
], ids=["fma", "fma-split3", "dot", "dot-split2", "dot-split5"])
@pytest.mark.parametrize("rows", [1, 2, 7])
def test_each_inner_product_and_split_matches_reference(cfg, rows):
    x, w, b = case(rows, 21, 100, torch.bfloat16, seed=rows)
    check(gemv(x, w, b, config=cfg), x, w, b)


def test_even_k_and_n_smaller_than_one_tile():
    x, w, b = case(2, 5, 64, torch.float16)
    check(gemv(x, w, b, config=DOT), x, w, b)  # K a multiple of BLOCK_K: no K mask
    check(gemv(x, w, b, config={**FMA1, "BLOCK_N": 16}), x, w, b)


# --- pipelined K loop (K_STAGES) -----------------------------------------------------------------
# N = 37 and K = 83 (6 K tiles of 16): loops of 1-6 tiles, shorter than K_STAGES in some splits, a masked last tile.
# The interpreter ignores tl.range's num_stages, so this checks the loop's bounds and masks, not the pipelining.

K_STAGES = [
    {**FMA1, "K_STAGES": 2},
    {**FMA1, "K_STAGES": 3},
    {**FMA1, "K_STAGES": 4, "SPLIT_K": 3},
    {**DOT, "BLOCK_K": 16, "K_STAGES": 3},
    {**DOT, "K_STAGES": 4, "SPLIT_K": 2},
]
K_STAGES_IDS = ["fma-s2", "fma-s3", "fma-s4-split3", "dot-s3", "dot-s4-split2"]


@pytest.mark.parametrize("cfg", K_STAGES, ids=K_STAGES_IDS)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8])
def test_k_stages_match_reference(cfg, rows):
    x, w, b = case(rows, 37, 83, torch.bfloat16, seed=rows)
    check(gemv(x, w, b, config=cfg), x, w, b)
    check(gemv(x, w, config=cfg), x, w, None)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cfg", [None, FMA1, {**DOT, "SPLIT_K": 3}, K_STAGES[0], K_STAGES[4]],
                         ids=["table", "fma", "dot-split3", "fma-s2", "dot-s4-split2"])
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_fused_silu_mul_matches_reference(rows, cfg, dtype):
    x, w, b = case(rows, 2 * 19, 70, dtype, seed=rows)
    y = gemv(x, w, b, silu_mul=True, config=cfg)
    assert y.shape == (rows, 19)
    check(y, x, w, b, silu_mul=True)


def test_split_k_sums_in_a_fixed_order():
    x, w, b = case(4, 30, 200, torch.bfloat16)
    cfg = {**FMA1, "SPLIT_K": 4}
    first = gemv(x, w, b, config=cfg)
    for _ in range(2):
        assert torch.equal(gemv(x, w, b, config=cfg), first)
    # the same sum without a split differs only by fp32 rounding order, within the bound
    check(first, x, w, b)


def test_split_policy_fills_the_device_only_when_n_is_small():
    entry = {"programs_per_cu": 2, "max_splits": 16, "min_split_k": 512}
    # 5120 rows / 16 = 320 programs >= 2 x 132: no split; 96 rows: 6 tiles, split by K
    assert launch_params.num_splits(320, 5120, 512, 132, entry) == 1
    assert launch_params.num_splits(6, 5120, 512, 132, entry) == 10  # 5120 / min_split_k
    assert launch_params.num_splits(6, 5120, 1024, 132, entry) == 5  # K tiles
    assert launch_params.num_splits(1, 100000, 64, 132, {**entry, "max_splits": 8}) == 8




def test_sm90_table_pipelines_the_k_loop_only_where_measured():
    # one row of the N = 5120 shapes (bench --variants, 2026-12-02); the row bucket's tiles otherwise unchanged
    for k in (6144, 17408):
        cfg = launch_params.config_for("sm90", 5120, k, 1)
        assert cfg == {**launch_params.config_for("sm90", 4096, k, 1), "K_STAGES": 3}
        assert all("K_STAGES" not in launch_params.config_for("sm90", 5120, k, r) for r in (4, 8))
    assert "K_STAGES" not in launch_params.config_for("sm90", 16384, 5120, 1)
    assert "K_STAGES" not in launch_params.config_for("sm90", 5120, 6144, 1, silu_mul=True)
    # two rows (bench --variants --rows, ninth session): the FMA path, pipelined, for four shapes; the dot path elsewhere
    fma2 = {"DOT": 0, "BLOCK_N": 8, "num_warps": 4, "num_stages": 1}
    for n, k, silu, block_k, stages in ((5120, 6144, False, 256, 4), (5120, 17408, False, 256, 4),
                                        (34816, 5120, False, 512, 3), (34816, 5120, True, 256, 4)):
        assert launch_params.config_for("sm90", n, k, 2, silu_mul=silu) == {**fma2, "BLOCK_K": block_k, "K_STAGES": stages}
        # 3-4 rows keep the dot path
        assert launch_params.config_for("sm90", n, k, 3, silu_mul=silu)["DOT"] == 1
    for n, k in ((16384, 5120), (14336, 5120), (248320, 5120)):
        assert launch_params.config_for("sm90", n, k, 2)["DOT"] == 1
    # every entry passes the table's own checks (FMA accumulator registers per lane included)
    launch_params.get_params("sm90", override="")


def test_strided_and_3d_inputs_are_handled():
    x, w, b = case(6, 24, 40, torch.bfloat16)
    # rows with a stride (a column slice of a wider tensor) and a 3-D batch shape
    wide = torch.zeros(6, 100, dtype=torch.bfloat16)
    wide[:, 30:70] = x
    xs = wide[:, 30:70]
    assert not xs.is_contiguous()
    check(gemv(xs, w, b), x, w, b)
    y3 = gemv(x.view(2, 3, 40), w, b)
    assert y3.shape == (2, 3, 24)
    check(y3.view(6, 24), x, w, b)
    # x transposed storage (unit stride along rows, not K): copied, same result
    xt = x.t().contiguous().t()
    assert xt.stride(1) != 1
    check(gemv(xt, w, b), x, w, b)
    # weight rows with padding (row stride > K)
    wpad = torch.zeros(24, 48, dtype=torch.bfloat16)
    wpad[:, :40] = w
    check(gemv(x, wpad[:, :40], b), x, w, b)
    # preallocated out
    out = torch.empty(6, 24, dtype=torch.bfloat16)
    assert gemv(x, w, b, out=out) is out
    check(out, x, w, b)


@pytest.mark.parametrize("make,match", [
    (lambda x, w, b: gemv(x.float(), w.float()), "float16 or bfloat16"),
    (lambda x, w, b: gemv(x, w.half()), "dtype"),
    (lambda x, w, b: gemv(x[:, :30], w), "K = 30"),
    (lambda x, w, b: gemv(x.new_zeros(9, 40), w), "1..8 rows"),
    (lambda x, w, b: gemv(x.new_zeros(0, 40), w), "1..8 rows"),
    (lambda x, w, b: gemv(x, w.t().contiguous().t()), "contiguous along K"),
    (lambda x, w, b: gemv(x, w[:23], silu_mul=True), "even N"),
    (lambda x, w, b: gemv(x, w, b[:10]), "bias must be"),
    (lambda x, w, b: gemv(x, w, out=torch.empty(3, 24, dtype=torch.bfloat16)), "out must be"),
    (lambda x, w, b: gemv(x, w, config={**FMA1, "BLOCK_Q": 4}), "unknown key"),
    (lambda x, w, b: gemv(x, w, config={**DOT, "BLOCK_N": 8}), "BLOCK_N must be a power of two >= 16"),
    (lambda x, w, b: gemv(x, w, config={**FMA1, "BLOCK_K": 24}), "BLOCK_K must be a power of two"),
    (lambda x, w, b: gemv(x, w, config={**FMA1, "SPLIT_K": 0}), "SPLIT_K must be a positive integer"),
    (lambda x, w, b: gemv(x, w, config={**FMA1, "K_STAGES": 1.5}), "K_STAGES must be a positive integer"),
    (lambda x, w, b: gemv(x, w, config={**FMA1, "K_STAGES": 0}), "K_STAGES must be a positive integer"),
], ids=["fp32", "mixed-dtype", "k-mismatch", "9-rows", "0-rows", "weight-k-strided", "silu-odd-n", "bias-shape",
        "out-shape", "config-key", "dot-block-n", "block-k", "split-k", "k-stages", "k-stages-0"])
def test_bad_inputs_fail_with_one_clear_error(make, match):
    x, w, b = case(2, 24, 40, torch.bfloat16)
    with pytest.raises(ValueError, match=match) as info:
        make(x, w, b)
    assert "\n" not in str(info.value)


def test_silu_and_mul_kernel_matches_reference():
    g = torch.Generator().manual_seed(1)
    y = (torch.randn(5, 2 * 1100, generator=g) * 3).to(torch.bfloat16)  # 1100 > one 1024-wide block
    out = silu_and_mul(y)
    d = 1100
    ref = y[:, :d].double() * torch.sigmoid(y[:, :d].double()) * y[:, d:].double()
    assert out.shape == (5, d)
    assert ((out.double() - ref).abs() <= 2.0**-8 * ref.abs() + 16 * U32 * ref.abs() + 1e-30).all()
    with pytest.raises(ValueError, match=r"\[\.\.\., 2 \* d\]"):
        silu_and_mul(y[:, :3])


# --- launch parameters as data ---------------------------------------------------------------------

def test_every_target_entry_is_valid():
    for target in launch_params.PARAMS:
        entry = launch_params.get_params(target, override="")
        for b in launch_params.ROW_BUCKETS:
            for silu in (False, True):
                cfg = launch_params.config_for(target, 5120, 6144, b, silu, entry=entry)
                assert set(cfg) <= set(launch_params._LAUNCH_KEYS)
    assert launch_params.get_params("sm90", override="")["measured"] is True  # bench.py, 2026-12-02
    assert launch_params.get_params("sm90", override='{"num_warps": 8}')["measured"] is False  # an override is not measured


def test_row_buckets():
    assert [launch_params.row_bucket(r) for r in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    with pytest.raises(ValueError, match="1..8"):
        launch_params.row_bucket(9)


def test_env_override_applies_to_every_bucket_or_one():
    e = launch_params.get_params("sm90", override='{"BLOCK_K": 128}')
    assert all(c["BLOCK_K"] == 128 for c in (*e["rows"].values(), *e["silu_rows"].values()))
    assert e["measured"] is False
    e = launch_params.get_params("sm90", override='{"rows": {"1": {"DOT": 1, "BLOCK_N": 32}}, "programs_per_cu": 4}')
    assert e["rows"]["1"]["DOT"] == 1 and e["rows"]["1"]["BLOCK_N"] == 32 and e["programs_per_cu"] == 4
    assert e["rows"]["2"] == launch_params.PARAMS["sm90"]["rows"]["2"]


def test_shape_override_merges_over_the_bucket():
    ov = json.dumps({"shapes": {"5120x6144": {"1": {"SPLIT_K": 2}}, "34816x5120+silu": {"8": {"BLOCK_K": 128}}}})
    e = launch_params.get_params("sm90", override=ov)
    cfg = launch_params.config_for("sm90", 5120, 6144, 1, entry=e)
    # merged over the table's own entry for the shape (K_STAGES 3), not in place of it
    sm90 = launch_params.PARAMS["sm90"]
    assert cfg == {**sm90["rows"]["1"], **sm90["shapes"]["5120x6144"]["1"], "SPLIT_K": 2}
    # other buckets of the shape keep the table's entry (rows 2: its own override; rows 4: the bucket's)
    assert launch_params.config_for("sm90", 5120, 6144, 2, entry=e) == {**sm90["rows"]["2"], **sm90["shapes"]["5120x6144"]["2"]}
    assert launch_params.config_for("sm90", 5120, 6144, 4, entry=e) == sm90["rows"]["4"]
    assert launch_params.config_for("sm90", 34816, 5120, 7, silu_mul=True, entry=e)["BLOCK_K"] == 128
    assert "SPLIT_K" not in launch_params.config_for("sm90", 5120, 6144, 1, silu_mul=True, entry=e)


def test_rocm_null_drops_an_option():
    e = launch_params.get_params("gfx936", override='{"matrix_instr_nonkdim": null}')
    assert all("matrix_instr_nonkdim" not in c for c in e["rows"].values())


@pytest.mark.parametrize("text,match", [
    ("{", "not valid JSON"),
    ("[1]", "must be a JSON object"),
    ('{"BLOCKN": 16}', "unknown key"),
    ('{"BLOCK_N": 12}', "BLOCK_N must be a power of two"),
    ('{"rows": {"3": {"DOT": 1}}}', "row-bucket keys"),
    ('{"waves_per_eu": 2}', "ROCm-only"),
    ('{"num_warps": null}', "can be dropped with null"),
    ('{"programs_per_cu": 0}', "programs_per_cu must be a positive integer"),
    ('{"rows": {"8": {"DOT": 0, "BLOCK_N": 64}}}', "FMA accumulator would need"),
    ('{"shapes": {"5120-6144": {"1": {"SPLIT_K": 2}}}}', "shape key"),
])
def test_bad_override_fails_with_one_clear_error(text, match):
    with pytest.raises(ValueError, match=match) as info:
        launch_params.get_params("sm90", override=text)
    msg = str(info.value)
    assert "\n" not in msg
    assert launch_params.ENV_VAR in msg or "gemv" in msg.lower()
