"""Prefill attention (kernels/prefill_attention) against the float64 torch reference.

Runs in the Triton CPU interpreter at small shapes (head_dim 16-32, a few heads); the Qwen3.5-27B shapes run on a
GPU in tests/gpu/test_prefill_attention_gpu.py. Tolerances: the output is rounded to the query dtype and P is
rounded to it before the P.V product, so bf16 errors are a few 1e-3 relative (8 significant bits), fp16 errors
a few 1e-4; the 8-bit caches are compared with the reference on the dequantized cache, so quantization error
is not counted (only the kernel's own rounding).
"""
import importlib
import json
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
import triton_interp_compat  # noqa: E402,F401

from kernels.kv_quant.reference import quantized_paged_cache  # noqa: E402
from kernels.prefill_attention import launch_params, prefill_attention  # noqa: E402
from kernels.prefill_attention.reference import paged_prefill_reference  # noqa: E402
from tests.attention_checks import huge_v_keys_below_the_max, subnormals_flushed, v_by_dim  # noqa: E402
from tests.compile_checks import compile_check_rows  # noqa: E402

# (max abs error, error norm / reference norm)
TOL = {torch.float16: (4e-3, 2e-3), torch.bfloat16: (4e-2, 1.2e-2)}


def make_case(chunks, block_size, hq=6, hkv=1, d=32, dtype=torch.bfloat16, kv_quant=None, seed=0, k_mag=2.0,
              v_mag=1.0, q_mag=1.0, extra_rows=0, kv_fn=None):
    """Sequences given as (query chunk length, history length) with their K/V in a shuffled paged cache.

    Block-table entries past a sequence's last page are -1 (never read); pages of one sequence are scattered.
    ``extra_rows`` adds rows to q past the last sequence (vLLM pads the token dimension); they must stay
    untouched. ``kv_fn(q, k, v, table)`` may edit q (float32) and k, v ([num_blocks, block_size, kv_heads, d],
    float32) in place before they are stored."""
    g = torch.Generator().manual_seed(seed)
    lens = [c + h for c, h in chunks]
    nblk = [(n + block_size - 1) // block_size for n in lens]
    num_blocks = sum(nblk) + 2
    order = torch.randperm(num_blocks, generator=g)
    table = torch.full((len(lens), max(nblk) + 1), -1, dtype=torch.int32)
    used = 0
    for s, n in enumerate(nblk):
        table[s, :n] = order[used : used + n].to(torch.int32)
        used += n
    q_lens = torch.tensor([c for c, _ in chunks])
    cu = torch.zeros(len(chunks) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(q_lens, 0)
    q = torch.randn(int(cu[-1]) + extra_rows, hq, d, generator=g) * q_mag
    k = torch.randn(num_blocks, block_size, hkv, d, generator=g) * k_mag
    v = torch.randn(num_blocks, block_size, hkv, d, generator=g) * v_mag
    if kv_fn is not None:
        kv_fn(q, k, v, table)
    q = q.to(dtype)
    case = dict(q=q, cu_seqlens_q=cu, seq_lens=torch.tensor(lens, dtype=torch.int32), block_table=table,
                scale=d**-0.5)
    if kv_quant is None:
        kv = torch.zeros(num_blocks, 2, block_size, hkv, d, dtype=dtype)  # vLLM's TRITON_ATTN layout
        kv[:, 0] = k.to(dtype)
        kv[:, 1] = v.to(dtype)
        case.update(k_cache=kv[:, 0], v_cache=kv[:, 1])
    else:
        k_codes, v_codes, k_scales, v_scales = quantized_paged_cache(k, v, kv_quant)
        case.update(k_cache=k_codes, v_cache=v_codes, k_scales=k_scales, v_scales=v_scales, kv_quant=kv_quant)
    return case


_ARGS = ("q", "k_cache", "v_cache", "cu_seqlens_q", "seq_lens", "block_table", "scale")


def run(case, **kw):
    out = torch.full_like(case["q"], float("nan"))
    extra = {k: v for k, v in case.items() if k not in _ARGS}
    prefill_attention(case["q"], case["k_cache"], case["v_cache"], out, case["cu_seqlens_q"], case["seq_lens"],
                      case["block_table"], case["scale"], **extra, **kw)
    return out


def reference(case):
    kw = {k: case[k] for k in ("k_scales", "v_scales", "kv_quant") if k in case}
    return paged_prefill_reference(case["q"], case["k_cache"], case["v_cache"], case["cu_seqlens_q"],
                                   case["seq_lens"], case["block_table"], case["scale"], **kw)


def assert_close(out, want, dtype, rows=None):
    rows = out.shape[0] if rows is None else rows
    out, want = out[:rows], want[:rows]
    assert torch.isfinite(out).all(), "non-finite or unwritten output rows"
    err = out.double() - want
    max_abs, rel = err.abs().max().item(), (err.norm() / want.norm()).item()
    assert max_abs < TOL[dtype][0] and rel < TOL[dtype][1], f"max abs error {max_abs}, relative {rel}, limits {TOL[dtype]}"


def _rel(out, want):
    """Error norm / reference norm over the whole output."""
    return ((out.double() - want).norm() / want.norm()).item()


def p(block_m=16, block_n=16, **kw):
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=4, num_stages=1, **kw)


# --- numerics ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("block_m", [16, 64])
def test_ragged_chunks_with_histories_off_the_page_grid_match_reference(dtype, block_m):
    # chunk lengths 1 and 17 (not a multiple of the 2- or 10-token query tile nor of BLOCK_N 16), histories of
    # 0, 5, 23 and 37 tokens (not multiples of the 16-token page), pages shuffled
    case = make_case([(17, 5), (1, 37), (40, 0), (3, 23)], block_size=16, dtype=dtype, hq=12, hkv=2)
    assert_close(run(case, params=p(block_m)), reference(case), dtype)


@pytest.mark.parametrize("kv_quant,software_fp8", [("int8", False), ("fp8", True), ("fp8", False)])
def test_quantized_cache_matches_dequantized_reference(kv_quant, software_fp8):
    case = make_case([(17, 30), (1, 64), (9, 0)], block_size=32, kv_quant=kv_quant, hq=12, hkv=2, seed=3)
    assert_close(run(case, params=p(32), software_fp8=software_fp8), reference(case), torch.bfloat16)


@pytest.mark.parametrize("mirror", [0, 512], ids=["direct", "mirror"])
def test_v_read_through_its_head_dim_stride_by_token_or_by_dim(mirror):
    # int8 caches hold V by dim (tokens contiguous; kv_quant/layout.py V_BY_DIM), fp8 caches by token: the mirror
    # kernel and the direct path read V through its head_dim stride, so one cache's codes give the same output bit
    # for bit stored either way, except int8 V by dim on the direct path, whose P x V is int8 x int8 (rounded
    # differently, test_int8_v_by_dim_takes_the_int8_pv_product). With the mirror, the 70-token chunk goes through
    # it (one 256-token page) and the decode row and short chunk read the cache directly; head_dim 24 masks the
    # dims past it (BLOCK_D 32)
    pa_mod = importlib.import_module("kernels.prefill_attention.prefill_attention")
    chunks = [(70, 100), (1, 50), (20, 9)]
    kw = dict(params=p(16), mirror_params=p(16, 32), max_seqlen_k=170, mirror=mirror, software_fp8=True)
    for kv_quant in ("fp8", "int8"):
        case = make_case(chunks, block_size=48, kv_quant=kv_quant, d=24, hq=4, hkv=2, seed=40)
        native = case["v_cache"]
        if kv_quant == "int8":  # quantized_paged_cache's views, through split_kv_cache: V by dim
            assert native.stride()[1:] == (1, 24 * 48, 48)
            other = native.contiguous()  # the same codes by token
        else:
            assert native.stride()[1:] == (2 * 24, 24, 1)
            other = v_by_dim(native)
        assert torch.equal(other, native) and other.stride() != native.stride()
        outs = []
        for v_cache in (native, other):
            buf, _ = _nan_mirror(pa_mod, hkv=2, d=24)
            outs.append(run(dict(case, v_cache=v_cache), **kw))
            # the mirror kernel wrote sequence 0's V (170 tokens, moderate bf16 values) over the NaN fill of the
            # mirror's first page exactly when the mirror is on (buf is stored as fp16: an fp16 NaN until written)
            assert bool(torch.isnan(buf[0, 1, :170]).any()) == (mirror == 0)
        same = slice(0, 70 if mirror else 0) if kv_quant == "int8" else slice(None)  # rows V's layout cannot move
        assert torch.equal(outs[0][same], outs[1][same]), f"{kv_quant}: V by token and by dim give different outputs"
        for out in outs:
            assert_close(out, reference(case), torch.bfloat16)
    # K stays contiguous in head_dim: a K by dim is refused
    with pytest.raises(ValueError, match="k_cache must be contiguous in head_dim"):
        run(dict(case, k_cache=v_by_dim(case["k_cache"])), **kw)


@pytest.mark.parametrize("block_size,block_n", [(48, 32), (32, 32), (80, 16)])
def test_int8_v_by_dim_takes_the_int8_pv_product(block_size, block_n):
    # the direct path over an int8 cache (V by dim) runs P x V as int8 x int8 over windows of BLOCK_N contiguous
    # slots of one page; a page's last window overlaps the one before when BLOCK_N does not divide the page (48 and
    # 80 tokens), and its overlapping slots must count once. A by-token copy of V takes the fp16 product: the two
    # round differently (not a silent fallback), both within the float64 reference's bounds. Decode rows, a short
    # chunk and a chunk longer than a query tile; histories that end inside, at and one past a page's windows
    chunks = [(1, 95), (1, block_size - 1), (3, block_size), (40, 2 * block_size + 5), (1, 0)]
    case = make_case(chunks, block_size=block_size, kv_quant="int8", hq=12, hkv=2, seed=21)
    assert case["v_cache"].stride(1) == 1
    int8_pv = run(case, params=p(16, block_n))
    fp16_pv = run(dict(case, v_cache=case["v_cache"].contiguous()), params=p(16, block_n))
    want = reference(case)
    assert_close(int8_pv, want, torch.bfloat16)
    assert_close(fp16_pv, want, torch.bfloat16)
    assert not torch.equal(int8_pv, fp16_pv)


@pytest.mark.parametrize("kv_quant", ["int8", "fp8"])
def test_8bit_garbage_past_the_end_of_the_last_page_does_not_reach_the_output(kv_quant):
    # hybrid models share pages with other layers' state, so past a sequence's end a page may hold any bytes: e4m3
    # NaN codes (0x7F) and NaN / inf scales. The int8 product path reads whole windows of a page (past the end too,
    # masked by position), the others re-read the last token. 48-token pages, windows of 32 (overlapping)
    lens = [(1, 19), (1, 46), (5, 91), (20, 30)]
    case = make_case(lens, block_size=48, kv_quant=kv_quant, hq=4, hkv=2, seed=17)
    want = reference(case)
    for b, (c, h) in enumerate(lens):
        n = c + h
        page = case["block_table"][b, (n - 1) // 48]
        tail = slice((n - 1) % 48 + 1, None)
        case["k_cache"][page, tail] = 0x7F
        case["v_cache"][page, tail] = 0x7F
        case["k_scales"][page, tail] = float("nan")
        case["v_scales"][page, tail] = float("inf")
    for software in (True, False):
        assert_close(run(case, params=p(16, 32), software_fp8=software), want, torch.bfloat16)


@pytest.mark.parametrize("block_size,block_m,block_n", [(16, 16, 32), (48, 64, 16)], ids=["short-pages", "64-rows"])
def test_int8_v_by_dim_keeps_the_fp16_product_on_short_pages_or_large_query_tiles(block_size, block_m, block_n):
    # the int8 product reads whole windows of one page, and holds an int32 product tile beside the accumulator, so
    # pages shorter than BLOCK_N and query tiles over 32 rows keep the gathered fp16 path: bit-identical to a
    # by-token copy of V
    case = make_case([(9, 40), (1, 30)], block_size=block_size, kv_quant="int8", d=16, seed=6)
    by_dim = run(case, params=p(block_m, block_n))
    assert torch.equal(by_dim, run(dict(case, v_cache=case["v_cache"].contiguous()), params=p(block_m, block_n)))
    assert_close(by_dim, reference(case), torch.bfloat16)


def test_the_direct_launch_beside_the_mirror_takes_the_short_rows_tile(monkeypatch):
    # with the mirror on, the direct launch serves decode rows and short chunks: the table's kv8_short; with the
    # mirror off it serves every chunk: kv8. Distinct tiles in the interpreter's entry show which one each launch got
    pa_mod = importlib.import_module("kernels.prefill_attention.prefill_attention")
    entry = dict(launch_params.PARAMS["interpreter"], kv8=p(64, 16), kv8_short=p(16, 32), kv16=p(16, 32))
    monkeypatch.setitem(launch_params.PARAMS, "interpreter", entry)
    launch_params._CACHE.clear()
    got = []
    real = pa_mod._attend

    def spy(*args, **kw):
        got.append((args[12]["BLOCK_M"], args[12]["BLOCK_N"], kw.get("mirror", False)))
        return real(*args, **kw)

    monkeypatch.setattr(pa_mod, "_attend", spy)
    case = make_case([(70, 30), (1, 50)], block_size=48, kv_quant="int8", hq=4, hkv=1, seed=13)
    for mirror, want in ((512, [(16, 32, True), (16, 32, False)]), (0, [(64, 16, False)])):
        got.clear()
        _nan_mirror(pa_mod, hkv=1, d=case["q"].shape[-1])
        out = run(case, max_seqlen_k=100, mirror=mirror)
        assert got == want, mirror
        assert_close(out, reference(case), torch.bfloat16)
    launch_params._CACHE.clear()


def test_mixed_batch_of_decode_rows_and_prefill_chunks_matches_reference():
    # the shape of a serving step: decodes (one token each, long histories) beside one prefill chunk
    chunks = [(1, 90), (1, 33), (29, 50), (1, 1), (1, 64)]
    case = make_case(chunks, block_size=16, hq=12, hkv=2, seed=4)
    assert_close(run(case, params=p(32, 32)), reference(case), torch.bfloat16)


@pytest.mark.parametrize("kv_quant", [None, "int8"])
@pytest.mark.parametrize("block_size", [48, 784])
def test_key_tiles_straddling_pages_read_each_token_from_its_own_page(kv_quant, block_size):
    # BLOCK_N 32 does not divide 48 or 784: tiles span two pages, and with 16-token pages (below) three
    case = make_case([(20, block_size + 7)], block_size=block_size, kv_quant=kv_quant, d=16, seed=5)
    assert_close(run(case, params=p(16, 32), software_fp8=True), reference(case), torch.bfloat16)


def test_pages_smaller_than_a_key_tile():
    case = make_case([(9, 40), (30, 3)], block_size=16, d=16, seed=6)
    assert_close(run(case, params=p(32, 64)), reference(case), torch.bfloat16)


@pytest.mark.parametrize("chunk,history", [(4096, 0), (4095, 100)])
def test_full_4096_token_chunks_first_and_with_history(chunk, history):
    # the contest's chunk size (--max-num-batched-tokens 4096) and one short of it, at a head size small enough
    # for the interpreter; group 2, so a 128-row tile holds 64 tokens
    case = make_case([(chunk, history)], block_size=784, hq=2, hkv=1, d=16, seed=7)
    assert_close(run(case, params=p(128, 64)), reference(case), torch.bfloat16)


def test_padded_token_rows_past_the_last_sequence_are_not_written():
    case = make_case([(5, 10), (7, 0)], block_size=16, d=16, extra_rows=6, seed=8)
    out = run(case, params=p(16))
    assert torch.isnan(out[12:]).all()
    assert_close(out, reference(case), torch.bfloat16, rows=12)


def test_padded_rows_stay_untouched_when_the_metadata_buffers_go_on_past_the_batch():
    """vLLM passes query_start_loc, seq_lens and the block table as slices of persistent buffers, so what lies past
    the batch is whatever an earlier batch left there. The tiles of the padded rows must not read it: here it
    describes a plausible extra sequence, which the kernel would attend and write into the padded rows."""
    case = make_case([(5, 10), (7, 0)], block_size=16, d=16, extra_rows=6, seed=8)
    cu, lens, table = case["cu_seqlens_q"], case["seq_lens"], case["block_table"]
    cu_buf = torch.cat([cu, torch.tensor([cu[-1] + 6], dtype=torch.int32)])
    lens_buf = torch.cat([lens, torch.tensor([6], dtype=torch.int32)])
    table_buf = torch.cat([table, table[:1]])
    out = torch.full_like(case["q"], float("nan"))
    prefill_attention(case["q"], case["k_cache"], case["v_cache"], out, cu_buf[:3], lens_buf[:2], table_buf[:2],
                      case["scale"], params=p(16))
    assert torch.isnan(out[12:]).all()
    assert_close(out, reference(case), torch.bfloat16, rows=12)


def test_head_dim_not_a_power_of_two():
    case = make_case([(11, 20)], block_size=16, d=24, seed=9)
    assert_close(run(case, params=p(16)), reference(case), torch.bfloat16)


@pytest.mark.parametrize("kv_quant", [None, "int8", "fp8"])
def test_extreme_finite_inputs_give_finite_outputs(kv_quant):
    # scores beyond float32 and V near bf16's largest values: q is 1.2e19 everywhere and each key is +-1.2e19 in
    # every channel, so every product (1.44e38) is finite in float32 and each score's sum (2.3e39) overflows to one
    # side only (the kernel saturates S at +-3e38). Products or partial sums that overflow with both signs give
    # inf - inf inside the dot itself, NaN or not depending on how the hardware (or numpy's float32 matmul under
    # the CPU interpreter) splits the sum: no kernel-side saturation can reach that; tests/gpu runs |q|, |k| ~ 1e19
    # x randn at head_dim 256 on the device
    def same_magnitude(q, k, v, table):
        q.fill_(1.2e19)
        k.copy_(k[..., :1].sign().expand_as(k) * 1.2e19)

    case = make_case([(6, 20)], block_size=16, d=16, kv_quant=kv_quant, v_mag=1e37, seed=10, kv_fn=same_magnitude)
    out = run(case, params=p(16), software_fp8=True)
    assert torch.isfinite(out).all()
    assert out.abs().max() <= case["q"].new_tensor(4e37).float()


@pytest.mark.parametrize("kv_quant", ["int8", "fp8"])
@pytest.mark.parametrize("v_mag", [1e-6, 1e5])
def test_quantized_v_across_the_value_range(kv_quant, v_mag):
    # the 8-bit path keeps P in [0, 1] whatever the V scales (tiny V must not underflow, huge V not overflow)
    case = make_case([(13, 40)], block_size=16, kv_quant=kv_quant, d=16, v_mag=v_mag, k_mag=1000.0, seed=11)
    out = run(case, params=p(16), software_fp8=True)
    rel = _rel(out, reference(case))
    assert torch.isfinite(out).all() and rel < 1e-2, rel


@pytest.mark.parametrize("kv_quant", ["int8", "fp8"])
def test_8bit_huge_v_keeps_the_keys_below_the_max_when_subnormals_flush(kv_quant):
    # the decode test of the same name, for the direct 8-bit path (attention_checks.huge_v_keys_below_the_max)
    case = make_case([(3, 256)], block_size=16, kv_quant=kv_quant, d=32, seed=21, kv_fn=huge_v_keys_below_the_max(32))
    with subnormals_flushed():
        out = run(case, params=p(16), software_fp8=True)
    rel = _rel(out, reference(case))
    assert torch.isfinite(out).all() and rel < 1e-2, rel


@pytest.mark.parametrize("kv_quant", ["int8", "fp8"])
def test_all_zero_v_tile_after_large_v_stays_finite(kv_quant):
    # an all-zero V tile (scales 0) right after |V| ~1e5: its keys still carry probability (l counts them with their
    # own exponential) while their V factor is floored in the log (an earlier form rescaled acc by ~1e3 / 1e-38 = inf)
    case = make_case([(4, 60)], block_size=16, kv_quant=kv_quant, d=16, v_mag=1e5, seed=3)
    page = case["block_table"][0, 1]  # tokens 16-31: one whole 16-token key tile
    case["v_cache"][page].zero_()
    case["v_scales"][page].zero_()
    out = run(case, params=p(16), software_fp8=True)
    rel = _rel(out, reference(case))
    assert torch.isfinite(out).all() and rel < 1e-2, rel


# --- inputs and parameters -----------------------------------------------------------------------

def test_rejects_bad_inputs_with_one_clear_message():
    case = make_case([(4, 4)], block_size=16, d=16)
    args = [case[k] for k in _ARGS]
    out = torch.empty_like(case["q"])
    with pytest.raises(ValueError, match="block size must be a multiple of 16"):
        prefill_attention(case["q"], case["k_cache"][:, :8], case["v_cache"][:, :8], out, *args[3:])
    with pytest.raises(ValueError, match="out must be"):
        prefill_attention(case["q"], case["k_cache"], case["v_cache"], out.float(), *args[3:])
    with pytest.raises(ValueError, match="kv_quant must be one of"):
        prefill_attention(case["q"], case["k_cache"], case["v_cache"], out, *args[3:], kv_quant="int4")
    with pytest.raises(ValueError, match="needs k_scales"):
        prefill_attention(case["q"], case["k_cache"].view(torch.uint8)[..., :16], case["v_cache"].view(torch.uint8)[..., :16],
                          out, *args[3:], kv_quant="int8")
    with pytest.raises(ValueError, match="cu_seqlens_q must be int32"):
        prefill_attention(case["q"], case["k_cache"], case["v_cache"], out, case["cu_seqlens_q"].long(), *args[4:])


def test_empty_batch_is_a_no_op():
    case = make_case([(3, 3)], block_size=16, d=16)
    out = torch.full_like(case["q"], 7.0)
    prefill_attention(case["q"][:0], case["k_cache"], case["v_cache"], out[:0], case["cu_seqlens_q"],
                      case["seq_lens"], case["block_table"], case["scale"])
    assert (out == 7.0).all()


@pytest.mark.parametrize("text,msg", [
    ('{"BLOCK_M": 48}', "BLOCK_M must be a power of two"),
    ('{"BLOCK_Q": 4}', "unknown key"),
    ('{"waves_per_eu": 2}', "ROCm-only"),
    ("not json", "not valid JSON"),
    ('{"kv8": 3}', "'kv8' must be an object"),
])
def test_bad_param_overrides_fail_naming_the_problem(text, msg):
    with pytest.raises(ValueError, match=msg):
        launch_params.get_params("sm90", override=text)


def test_param_override_applies_to_both_widths_and_keeps_the_table():
    entry = launch_params.get_params("sm90", override='{"BLOCK_M": 64, "kv8": {"BLOCK_N": 32}}')
    assert entry["kv16"]["BLOCK_M"] == 64 and entry["kv8"]["BLOCK_M"] == 64 and entry["kv8"]["BLOCK_N"] == 32
    # the top level is for all widths; what it does not name stays the table's
    assert entry["kv8_short"] == dict(launch_params.PARAMS["sm90"]["kv8_short"], BLOCK_M=64)
    assert entry["measured"] is False
    short = launch_params.get_params("sm90", override='{"kv8_short": {"BLOCK_M": 32, "num_warps": 4}}')
    assert short["kv8_short"] == dict(launch_params.PARAMS["sm90"]["kv8_short"], BLOCK_M=32, num_warps=4)
    assert short["kv8"] == launch_params.PARAMS["sm90"]["kv8"]
    assert launch_params.PARAMS["sm90"]["kv16"]["BLOCK_M"] != 64 or launch_params.PARAMS["sm90"]["kv8"]["BLOCK_N"] != 32


def test_every_table_entry_is_valid():
    for target in launch_params.PARAMS:
        launch_params.get_params(target, override="")


def test_env_override_is_read(monkeypatch):
    monkeypatch.setenv(launch_params.ENV_VAR, json.dumps({"BLOCK_N": 32}))
    assert launch_params.get_params("interpreter")["kv16"]["BLOCK_N"] == 32


# --- 8-bit caches: the 16-bit mirror for long chunks -----------------------------------------------

def _nan_mirror(pa_mod, tokens=512, hkv=1, d=16):
    """The mirror buffer, allocated now and filled with NaN: a kernel that reads a slot the mirror kernel did not
    write gives NaN (the attention kernel reads whole page runs, so this covers the zero-filled page tails too)."""
    pa_mod.MIRRORS.clear()
    buf, scales = pa_mod.mirror_buffer(torch.device("cpu"), hkv, d, tokens)
    buf.fill_(float("nan"))
    scales.fill_(float("nan"))
    return buf, scales


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("kv_quant", ["int8", "fp8"])
def test_mirror_path_matches_reference_and_direct_path(kv_quant, dtype):
    pa_mod = importlib.import_module("kernels.prefill_attention.prefill_attention")

    # 2 mirror pages of 256 tokens: sequence 0 (70-token chunk, 170 tokens) takes one; sequence 2 (64-token chunk,
    # 364 tokens) needs two more and reads the cache directly, like the decode row and the 20-token chunk
    chunks = [(70, 100), (1, 50), (64, 300), (20, 9)]
    case = make_case(chunks, block_size=48, kv_quant=kv_quant, d=16, hq=6, hkv=1, seed=12, dtype=dtype)
    max_k = int(case["seq_lens"].max())
    codes, scales = _nan_mirror(pa_mod)
    mirrored = run(case, params=p(16), mirror_params=p(32, 32), max_seqlen_k=max_k, mirror=512, software_fp8=True)
    direct = run(case, params=p(16), max_seqlen_k=max_k, mirror=0, software_fp8=True)
    want = reference(case)
    # V goes through bf16 in the mirror (and P through q's dtype): bf16's tolerance for either q dtype
    assert_close(mirrored, want, torch.bfloat16)
    assert_close(direct, want, torch.bfloat16)
    # the mirror holds sequence 0's keys in its first page: each code's exact value (x 2^-7 for int8, 2^-8 for
    # e4m3) in q's dtype, and the scales unchanged; its values as code x scale rounded once to bf16 (to nearest on
    # a GPU; Triton's interpreter truncates, so within one bf16 step here); the rest of the page (keys 170-255,
    # which the last 32-key tile reads) zeros
    from kernels.kv_quant.reference import decode_codes

    pages = case["block_table"][0, :4].long()
    unit = 128.0 if kv_quant == "int8" else 256.0
    got_k = codes[0, 0].view(dtype)
    got_s = scales[0]  # [MIRROR_PAGE, kv_heads]
    want_codes = decode_codes(case["k_cache"][pages], kv_quant).reshape(-1, 1, 16)[:170].double() / unit
    assert torch.equal(got_k[:170].double(), want_codes)
    assert torch.equal(got_s[:170], case["k_scales"][pages].reshape(-1, 1)[:170])
    v_codes = decode_codes(case["v_cache"][pages], kv_quant).reshape(-1, 1, 16)[:170].float()
    want_v = (v_codes * case["v_scales"][pages].reshape(-1, 1, 1)[:170]).double()
    got_v = codes[0, 1, :170].view(torch.bfloat16).double()
    assert ((got_v - want_v).abs() <= want_v.abs() * 2.0**-7).all()
    assert (got_k[170:] == 0).all() and (got_s[170:] == 0).all() and (codes[0, 1, 170:] == 0).all()


def _mirrored(case, **kw):
    """``case`` through the mirror (every chunk >= MIRROR_MIN_QUERY fits), read from a NaN-filled buffer."""
    pa_mod = importlib.import_module("kernels.prefill_attention.prefill_attention")
    _nan_mirror(pa_mod, d=case["q"].shape[2])
    return run(case, params=p(16), mirror_params=p(16, 32), max_seqlen_k=int(case["seq_lens"].max()), mirror=512,
               software_fp8=True, **kw)


@pytest.mark.parametrize("kv_quant", ["int8", "fp8"])
def test_mirror_holds_large_keys_and_v_across_the_range(kv_quant):
    # |K| ~3e4 (where a bf16-valued K moved scores by whole nats) with tiny and huge V, and fp16 queries
    for seed, v_mag, dtype in ((30, 1e-6, torch.bfloat16), (31, 1e5, torch.bfloat16), (32, 1.0, torch.float16)):
        case = make_case([(70, 90)], block_size=16, kv_quant=kv_quant, d=16, k_mag=3e4, v_mag=v_mag, dtype=dtype,
                         seed=seed)
        out = _mirrored(case)
        assert torch.isfinite(out).all() and _rel(out, reference(case)) < 1e-2, (v_mag, dtype)


@pytest.mark.parametrize("kv_quant", ["int8", "fp8"])
def test_mirror_keeps_extreme_finite_inputs_finite(kv_quant):
    case = make_case([(64, 20)], block_size=16, d=16, kv_quant=kv_quant, q_mag=1e20, k_mag=1e20, v_mag=1e37,
                     seed=33)
    out = _mirrored(case)
    assert torch.isfinite(out).all()
    assert out.abs().max() <= case["q"].new_tensor(4e37).float()


def test_mirror_keeps_keys_below_the_max_when_subnormals_flush():
    case = make_case([(64, 200)], block_size=16, kv_quant="int8", d=32, seed=34,
                     kv_fn=huge_v_keys_below_the_max(32))
    with subnormals_flushed():
        out = _mirrored(case)
    assert torch.isfinite(out).all() and _rel(out, reference(case)) < 1e-2


def test_mirror_key_tiles_must_be_runs_of_one_mirror_page():
    pa_mod = importlib.import_module("kernels.prefill_attention.prefill_attention")
    case = make_case([(64, 40)], block_size=16, kv_quant="int8", d=16, seed=35)
    with pytest.raises(ValueError, match="BLOCK_N must divide MIRROR_PAGE"):
        run(case, params=p(16), mirror_params=p(16, 2 * pa_mod.MIRROR_PAGE), max_seqlen_k=104, mirror=512)


def test_mirror_flow_needs_a_host_max_length_and_serves_every_batch(monkeypatch):
    pa_mod = importlib.import_module("kernels.prefill_attention.prefill_attention")
    launched = []
    real = pa_mod._mirror_kernel

    class Spy:
        def __getitem__(self, grid):
            launched.append(grid)
            return real[grid]

    monkeypatch.setattr(pa_mod, "_mirror_kernel", Spy())
    case = make_case([(80, 20)], block_size=16, kv_quant="int8", d=16, seed=13)
    run(case, params=p(16), mirror=512)  # no max_seqlen_k: the grid cannot be sized without reading the device
    assert launched == []
    # a batch without a long chunk still runs the mirror flow (the same kernels for every batch), marking nothing
    short = make_case([(30, 20), (1, 5)], block_size=16, kv_quant="int8", d=16, seed=14)
    assert_close(run(short, params=p(16), mirror_params=p(16), mirror=512, max_seqlen_k=50), reference(short),
                 torch.bfloat16)
    assert len(launched) == 1


def test_bad_mirror_size_setting_fails_at_startup():
    from kernels.prefill_attention.prefill_attention import MIRROR_ENV, mirror_tokens

    assert mirror_tokens({}) == 32768 and mirror_tokens({MIRROR_ENV: "0"}) == 0
    with pytest.raises(ValueError, match=MIRROR_ENV):
        mirror_tokens({MIRROR_ENV: "lots"})


@pytest.mark.slow
@pytest.mark.parametrize("target", ["gfx936", "sm90"])
def test_table_entries_compile_within_the_targets_limits(target):
    # compiled for the real target (gfx90a stands in for the DCU's wave64), not run, in a process without the
    # interpreter: the DCU entries were chosen on paper, so at least they must fit 64 KiB of LDS without spilling;
    # the H200's fit its 227 KiB and pipeline their K/V loads
    rows = compile_check_rows("prefill_attention", "--target", target)
    # kv16 (bf16, the mirror), then the direct path's two tiles: kv8 and kv8_short
    assert [r["kv"] for r in rows] == ["bf16", "mirror"] + ["int8", "int8 by token", "fp8"] * 2
    for i, r in enumerate(rows):
        assert "error" not in r, r
        if target.startswith("gfx"):
            assert r["shared"] <= 65536 and r["spills"] == 0, r
        else:
            assert r["shared"] <= 232448 and r["async_copies"] > 0, r
            if r["kv"] in ("bf16", "mirror"):
                # what made the mirror as fast as bf16 on the H200 (prefill_attention.py, above MIRROR_MIN_QUERY): q
                # read from shared memory by the first dot, and a wgmma pipeline ptxas does not serialize
                assert r["q_operand"] == "smem" and r["serialized"] is None, r
            if i >= 5:  # kv8_short, the decode rows' tile (int8: the int8 products): nothing spilled
                assert r["spills"] == 0, r
        if i >= 5:  # kv8_short: K and V in vector loads, never byte by byte (int8's V by dim in token runs)
            assert r["loads_1b"] == 0, r


@pytest.mark.slow
def test_bench_dry_run_writes_its_table(tmp_path):
    # the benchmark's whole flow on the CPU at toy shapes (its numbers mean nothing there), with the baselines
    # loaded from a stand-in unified_attention file and the --kv filter
    import subprocess
    import sys
    from pathlib import Path

    ua = tmp_path / "ua.py"
    ua.write_text("def unified_attention(**kw):\n    kw['out'].zero_()\n")
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "kernels.prefill_attention.bench", "--dry-run", "--quick",
                           "--ua-file", str(ua), "--history", "0,40", "--chunk", "20", "--kv", "bf16,int8",
                           "--block-8bit", "64", "--out", str(tmp_path)], cwd=Path(__file__).resolve().parents[1],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(next(tmp_path.glob("*-prefill-attention-dry-run.json")).read_text())
    assert [(r["history"], r["kv"]) for r in doc["rows"]] == [(0, "bf16"), (0, "int8"), (40, "bf16"), (40, "int8")]
    assert doc["block_sizes"] == {"bf16": 32, "int8": 64, "fp8": 64}  # the dry run pages bf16 with 32
    odd = subprocess.run([sys.executable, "-m", "kernels.prefill_attention.bench", "--dry-run", "--block-8bit", "40"],
                         cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True)
    assert odd.returncode != 0 and odd.stderr.strip().splitlines() == [
        "error: --block-8bit wants a positive multiple of 16; got 40"]
    bad = subprocess.run([sys.executable, "-m", "kernels.prefill_attention.bench", "--dry-run", "--kv", "int8"],
                         cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "must include bf16" in bad.stderr
