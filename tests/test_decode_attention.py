"""Split-KV decode attention (kernels/decode_attention) against the float64 torch reference.

Runs in the Triton CPU interpreter at small shapes (head_dim 32, a few heads); the full Qwen3.5
shapes run on a GPU in tests/gpu/test_decode_attention_gpu.py.
"""
import importlib
import json
import math
import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
import triton_interp_compat  # noqa: E402,F401

from kernels.decode_attention import decode_attention, launch_params, workspace_numel  # noqa: E402
from kernels.decode_attention.codes import codes_to_f16  # noqa: E402
from kernels.decode_attention.reference import paged_decode_reference  # noqa: E402
from kernels.kv_quant.reference import quantized_paged_cache  # noqa: E402
from tests.attention_checks import (  # noqa: E402
    assert_rel_close,
    huge_v_keys_below_the_max,
    subnormals_flushed,
    v_by_dim,
    v_by_token,
)
from tests.compile_checks import compile_check_rows  # noqa: E402

# (max abs error, error norm / reference norm): P and the output are rounded to the query dtype
TOL = {torch.float16: (2e-3, 1e-3), torch.bfloat16: (4e-2, 1e-2)}


def make_case(lens, block_size, hq=6, hkv=1, d=32, dtype=torch.float16, kv_quant=None, page_pad=0, seed=0,
              k_mag=2.0, v_mag=1.0, kv_fn=None):
    """Random paged cache + shuffled block table for sequences of ``lens`` tokens.

    Block-table entries past a sequence's last page are -1 (never to be read). ``page_pad`` adds
    elements between pages, as vLLM's hybrid (attention + mamba) layout does. K and V are standard
    normal times ``k_mag`` / ``v_mag``; ``kv_fn(q, k, v, table)`` may edit q (float32 copy), k and v
    ([num_blocks, block_size, kv_heads, d], float32) in place before they are stored."""
    g = torch.Generator().manual_seed(seed)
    nblk = [(n + block_size - 1) // block_size for n in lens]
    num_blocks = sum(nblk) + 2
    order = torch.randperm(num_blocks, generator=g)
    table = torch.full((len(lens), max(max(nblk), 1) + 1), -1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(nblk):
        table[b, :n] = order[used : used + n].to(torch.int32)
        used += n
    q = torch.randn(len(lens), hq, d, generator=g)
    k = torch.randn(num_blocks, block_size, hkv, d, generator=g) * k_mag
    v = torch.randn(num_blocks, block_size, hkv, d, generator=g) * v_mag
    if kv_fn is not None:
        kv_fn(q, k, v, table)
    q = q.to(dtype)
    case = dict(q=q, block_table=table, seq_lens=torch.tensor(lens, dtype=torch.int32), scale=d**-0.5)
    if kv_quant is None:
        page = 2 * block_size * hkv * d
        raw = torch.zeros(num_blocks * (page + page_pad), dtype=dtype)
        kv = raw.as_strided((num_blocks, 2, block_size, hkv, d), (page + page_pad, page // 2, hkv * d, d, 1))
        kv[:, 0] = k.to(dtype)
        kv[:, 1] = v.to(dtype)
        case.update(k_cache=kv[:, 0], v_cache=kv[:, 1])
    else:
        k_codes, v_codes, k_scales, v_scales = quantized_paged_cache(k, v, kv_quant)
        case.update(k_cache=k_codes, v_cache=v_codes, k_scales=k_scales, v_scales=v_scales, kv_quant=kv_quant)
    return case


def run(case, **kw):
    out = torch.full_like(case["q"], float("nan"))
    args = {k: v for k, v in case.items() if k not in ("q", "k_cache", "v_cache", "block_table", "seq_lens", "scale")}
    decode_attention(case["q"], case["k_cache"], case["v_cache"], case["block_table"], case["seq_lens"],
                     case["scale"], out, **args, **kw)
    return out


def reference(case):
    kw = {k: case[k] for k in ("k_scales", "v_scales", "kv_quant") if k in case}
    return paged_decode_reference(case["q"], case["k_cache"], case["v_cache"], case["block_table"],
                                  case["seq_lens"], case["scale"], **kw)


def assert_close(out, want, dtype):
    assert torch.isfinite(out).all()
    err = out.double() - want
    max_abs, rel = err.abs().max().item(), (err.norm() / want.norm()).item()
    assert max_abs < TOL[dtype][0] and rel < TOL[dtype][1], \
        f"max abs error {max_abs}, relative {rel}, limits {TOL[dtype]}"


@pytest.fixture
def params(monkeypatch):
    """Set VLLM_DCU_DECODE_PARAMS for one test."""
    def set_(**kw):
        monkeypatch.setenv(launch_params.ENV_VAR, json.dumps(kw))
    monkeypatch.delenv(launch_params.ENV_VAR, raising=False)
    return set_


# --- numerics ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_cache_matches_reference_for_ragged_lengths_in_an_odd_batch(dtype):
    case = make_case([1, 37, 100], block_size=16, hkv=2, hq=12, dtype=dtype)
    assert_close(run(case, num_splits=3), reference(case), dtype)


@pytest.mark.parametrize("kv_quant", ["fp8", "int8"])
def test_quantized_cache_matches_dequantized_reference_for_ragged_lengths(kv_quant):
    case = make_case([3, 70, 45], block_size=32, hkv=2, hq=12, dtype=torch.bfloat16, kv_quant=kv_quant)
    assert_close(run(case, num_splits=2, software_fp8=True), reference(case), torch.bfloat16)


@pytest.mark.parametrize("block_size,seq_len", [(784, 800), (1552, 1570)])
@pytest.mark.parametrize("kv_quant", [None, "int8"])
@pytest.mark.parametrize("page_loop", [0, 1])
def test_tiles_straddling_large_pages_read_each_token_from_its_own_page(params, block_size, seq_len, kv_quant,
                                                                         page_loop):
    # BLOCK_N 32 does not divide 784 or 1552: without page_loop one tile spans two pages; with it a page's last
    # tile overlaps the one before (its first 16 keys masked); 3 splits put split boundaries inside pages too. The
    # two pages of the sequence are not adjacent in memory.
    params(BLOCK_N=32, page_loop=page_loop)
    case = make_case([seq_len], block_size=block_size, d=32, kv_quant=kv_quant, seed=1)
    assert_close(run(case, num_splits=3, software_fp8=True), reference(case), torch.float16)


@pytest.mark.parametrize("kv_quant", [None, "fp8"])
@pytest.mark.parametrize("page_loop", [0, 1])
def test_v_stored_by_dim_gives_the_same_output_as_by_token(params, kv_quant, page_loop):
    # the kernel reads V through its head_dim stride: for the fp16 products, tokens contiguous within a page is as good
    # as dims contiguous, bit for bit
    params(kv8={"BLOCK_N": 16, "page_loop": page_loop}, kv16={"BLOCK_N": 16})
    case = make_case([3, 70, 45], block_size=32, hkv=2, hq=12, dtype=torch.bfloat16, kv_quant=kv_quant, seed=6)
    want = run(case, num_splits=2, software_fp8=True)
    by_dim = dict(case, v_cache=v_by_dim(case["v_cache"]))
    assert by_dim["v_cache"].stride(1) == 1 and torch.equal(by_dim["v_cache"], case["v_cache"])
    assert torch.equal(run(by_dim, num_splits=2, software_fp8=True), want)
    assert_close(want, reference(case), torch.bfloat16)


@pytest.mark.parametrize("int8_qk", [0, 1])
@pytest.mark.parametrize("page_loop", [0, 1])
def test_int8_caches_hold_v_by_dim_and_take_the_int8_pv_path(params, int8_qk, page_loop):
    # int8 caches hold V by dim (kv_quant.layout.V_BY_DIM): P' goes to an int8 x int8 product with V's raw codes. A
    # by-token copy of the same V takes the fp16 path: the two round differently (not a silent fallback) and both
    # stay within the bounds of the float64 reference
    params(kv8={"BLOCK_N": 16, "page_loop": page_loop, "int8_qk": int8_qk})
    case = make_case([3, 70, 45], block_size=32, hkv=2, hq=12, dtype=torch.bfloat16, kv_quant="int8", seed=6)
    assert case["v_cache"].stride(1) == 1
    int8_pv = run(case, num_splits=2)
    by_token = dict(case, v_cache=v_by_token(case["v_cache"]))
    assert by_token["v_cache"].stride(3) == 1 and torch.equal(by_token["v_cache"], case["v_cache"])
    fp16_pv = run(by_token, num_splits=2)
    want = reference(case)
    assert_close(int8_pv, want, torch.bfloat16)
    assert_close(fp16_pv, want, torch.bfloat16)
    assert not torch.equal(int8_pv, fp16_pv)


@pytest.mark.parametrize("kv_quant", [None, "int8", "fp8"])
def test_pages_smaller_than_a_tile_read_each_token_from_its_own_page(params, kv_quant):
    params(BLOCK_N=32)  # 16-token pages: one tile spans two or three pages
    case = make_case([70, 33], block_size=16, d=32, kv_quant=kv_quant, seed=2)
    assert_close(run(case, num_splits=2, software_fp8=True), reference(case), torch.float16)


@pytest.mark.parametrize("kv_quant", ["int8", "fp8"])
@pytest.mark.parametrize("page_loop", [0, 1])
@pytest.mark.parametrize("v_layout", ["token", "dim"])
def test_8bit_garbage_past_the_end_of_the_last_page_does_not_reach_the_output(params, kv_quant, page_loop, v_layout):
    # hybrid models share pages with other layers' state, so past a sequence's end a page may hold any bytes: e4m3
    # NaN codes (0x7F) and NaN / inf scales. BLOCK_N 32 over 48-token pages (page_loop: the pages' tiles overlap);
    # several splits per sequence, so split ranges start and end inside pages. V by dim with page_loop reads the
    # slots past the end themselves (contiguous tiles), where hardware e4m3 decode would make 0x7F a NaN.
    params(BLOCK_N=32, page_loop=page_loop)
    lens = [20, 47, 96, 50, 130]
    case = make_case(lens, block_size=48, hkv=2, hq=4, kv_quant=kv_quant, seed=5)
    for b, n in enumerate(lens):
        page = case["block_table"][b, (n - 1) // 48]
        tail = slice((n - 1) % 48 + 1, None)
        case["k_cache"][page, tail] = 0x7F
        case["v_cache"][page, tail] = 0x7F
        case["k_scales"][page, tail] = float("nan")
        case["v_scales"][page, tail] = float("inf")
    case["v_cache"] = (v_by_dim if v_layout == "dim" else v_by_token)(case["v_cache"])
    for software in (True, False):
        assert_close(run(case, num_splits=3, software_fp8=software), reference(case), torch.float16)


def test_garbage_past_the_end_of_the_last_page_does_not_reach_the_output():
    # rows past seq_len re-read the last token (no row mask on the loads): NaN there must not matter
    case = make_case([20, 45], block_size=32, hkv=1)
    for b, n in enumerate([20, 45]):
        page = case["block_table"][b, (n - 1) // 32]
        case["k_cache"][page, (n - 1) % 32 + 1 :] = float("nan")
        case["v_cache"][page, (n - 1) % 32 + 1 :] = float("nan")
    assert_close(run(case, num_splits=2), reference(case), torch.float16)


@pytest.mark.parametrize("kv_quant", ["fp8", "int8"])
@pytest.mark.parametrize("q_scale", [3e4, 1e-4])
def test_8bit_caches_take_queries_beyond_fp16_range(kv_quant, q_scale):
    # 8-bit caches multiply in fp16 with q scaled by a power of two: |q| of 1e5 or 1e-5 stays exact
    case = make_case([50, 9], block_size=16, hkv=1, dtype=torch.bfloat16, kv_quant=kv_quant)
    case["q"] = (case["q"].float() * q_scale).to(torch.bfloat16)
    case["scale"] = case["scale"] / q_scale
    assert_close(run(case, num_splits=2, software_fp8=True), reference(case), torch.bfloat16)


# --- 8-bit caches across the value range ----------------------------------------------------------
# 8-bit caches: V heads of any magnitude (the target: |V| anywhere in [1e-6, 1e5], |K| up to 6e4) come out
# within 1e-2 of the float64 reference on the dequantized cache (quantization error itself is not counted), for
# int8 and for fp8 with the software (integer) and the hardware e4m3 decode. P x V runs in fp16: a kernel that put
# the V scales into P (P x scale in fp16) loses V ~ 1e-6 to fp16 subnormals and saturates V ~ 1e5.
KV8 = [("int8", True), ("fp8", True), ("fp8", False)]
KV8_IDS = ["int8", "fp8-sw", "fp8-hw"]


@pytest.mark.parametrize("kv_quant,software", KV8, ids=KV8_IDS)
@pytest.mark.parametrize("k_mag", [2.0, 6e4])
@pytest.mark.parametrize("v_mag", [1e-6, 1e5])
def test_8bit_values_across_the_range(kv_quant, software, v_mag, k_mag):
    # |K| 6e4: scores far beyond fp16 before scaling (q goes into fp16 by a power of two, codes are exact, the
    # products accumulate in float32), softmax almost one-hot; |K| 2: P spread over many tokens. 3 splits for the
    # longer sequence, 3 for the shorter one: the merge combines partial outputs of heads of any magnitude.
    case = make_case([70, 45], block_size=16, hkv=2, hq=12, dtype=torch.bfloat16, kv_quant=kv_quant, k_mag=k_mag,
                     v_mag=v_mag, seed=12)
    assert_rel_close(run(case, num_splits=3, software_fp8=software), reference(case))


# --- int8 caches with int8 x int8 QK (launch key int8_qk) ---------------------------------------------------------
# q becomes a per-row int8 pair (q = sq (hi + lo / 256)), K's raw codes go to an int8 dot: the same bounds as the
# fp16 path against the float64 reference on the dequantized cache.

@pytest.mark.parametrize("page_loop", [0, 1])
def test_int8_qk_matches_the_reference_for_ragged_lengths(params, page_loop):
    params(kv8={"int8_qk": 1, "page_loop": page_loop, "BLOCK_N": 16})
    case = make_case([3, 70, 45], block_size=32, hkv=2, hq=12, dtype=torch.bfloat16, kv_quant="int8", seed=5)
    assert_close(run(case, num_splits=2), reference(case), torch.bfloat16)


@pytest.mark.parametrize("kv8", [{"int8_qk": 1}, {"page_loop": 1}], ids=["int8_qk", "page_loop"])
@pytest.mark.parametrize("k_mag", [2.0, 6e4])
@pytest.mark.parametrize("v_mag", [1e-6, 1e5])
def test_int8_qk_across_the_value_range(params, v_mag, k_mag, kv8):
    # int8 caches hold V by dim, so P x V is the int8 pair path too: P' is in [0, 1] whatever |V| is (the V factor
    # is in the scores), so its int8 pair needs no range of its own; with and without int8 QK and the page loop
    params(kv8=kv8)
    case = make_case([70, 45], block_size=16, hkv=2, hq=12, dtype=torch.bfloat16, kv_quant="int8", k_mag=k_mag,
                     v_mag=v_mag, seed=12)
    assert case["v_cache"].stride(1) == 1
    assert_rel_close(run(case, num_splits=3), reference(case))


@pytest.mark.parametrize("kv_quant,kv8", [("int8", {"int8_qk": 1, "page_loop": 1}), ("fp8", {"page_loop": 1}),
                                          ("fp8", {})])
def test_q_loaded_after_the_split_check_gives_the_same_output(params, kv_quant, kv8):
    # launch key q_early 0: an 8-bit program loads q only once it knows its split has work (as bf16 does); more grid
    # splits than the short sequence has tiles, so some programs return at once, and a padded slot (length 0)
    case = make_case([3, 70, 0, 45], block_size=32, hkv=2, hq=12, dtype=torch.bfloat16, kv_quant=kv_quant, seed=8)
    params(kv8={**kv8, "BLOCK_N": 16})
    early = run(case, num_splits=4)
    params(kv8={**kv8, "BLOCK_N": 16, "q_early": 0})
    late = run(case, num_splits=4)
    assert torch.equal(early, late)
    assert_close(late, reference(case), torch.bfloat16)
    # the key reaches the kernel (8-bit only: 16-bit caches always load q after the check)
    from kernels.decode_attention.planning import split_kernel_launch
    assert [split_kernel_launch({"BLOCK_N": 16, **kw}, 32, quant)[0]["Q_EARLY"]
            for kw, quant in (({}, 2), ({"q_early": 0}, 2), ({}, 1), ({}, 0))] == [True, False, True, False]


@pytest.mark.parametrize("kv_quant,kv8", [(None, {}), ("int8", {"int8_qk": 1, "page_loop": 1}),
                                          ("fp8", {"page_loop": 1}), ("fp8", {})])
def test_even_splits_match_the_reference(params, kv_quant, kv8):
    # launch key even_splits 1: 112 tokens = 7 tiles of 16 over 5 wanted splits are 2, 2, 1, 1, 1 tiles (cdiv's plan:
    # 4 splits of 2, 2, 2, 1); 3 tokens want 3 splits and get 1 (one tile); 0 = a padded slot
    case = make_case([112, 3, 0, 70], block_size=32, hkv=2, hq=12, dtype=torch.bfloat16, kv_quant=kv_quant, seed=9)
    width = "kv8" if kv_quant else "kv16"
    params(**{width: {**kv8, "BLOCK_N": 16, "even_splits": 1}})
    assert_close(run(case, num_splits=5), reference(case), torch.bfloat16)
    params(**{width: {**kv8, "BLOCK_N": 16, "even_splits": 1}}, min_split_tokens=16)  # the host's own plan
    assert_close(run(case), reference(case), torch.bfloat16)


def balanced_split_counts(lens, programs, max_splits, min_split_tokens, block_n):
    """What launch key balance gives each sequence (plain tiles of block_n, no page loop), in Python."""
    tiles = [-(-n // block_n) if n > 0 else 0 for n in lens]
    total = max(1, sum(tiles))

    def counts(share):
        return [max(1, min(-(-share * t // total), t, -(-n // min_split_tokens), max_splits))
                for n, t in zip(lens, tiles)]
    need = sum(counts(programs))
    return counts(programs if need <= programs else max(2 * programs - need, 1))


@pytest.mark.parametrize("kv_quant,kv8", [(None, {}), ("int8", {"int8_qk": 1, "page_loop": 1}),
                                          ("fp8", {"page_loop": 1}), ("fp8", {})])
@pytest.mark.parametrize("split_round,chunk", [("up", 256), ("down", 2)])
def test_balanced_plan_matches_the_reference_for_mixed_lengths(params, monkeypatch, kv_quant, kv8, split_round, chunk):
    # launch key balance: one long sequence, short ones and a padded slot (0) share 21 or 28 programs per kv head;
    # chunk 256 reads the 7 lengths once, chunk 2 two at a time (the loop a batch beyond 256 takes), the programs
    # numbered on across chunks
    monkeypatch.setattr(importlib.import_module("kernels.decode_attention.planning"), "BATCH_CHUNK", chunk)
    case = make_case([300, 3, 0, 70, 17, 5, 200], block_size=32, hkv=2, hq=12, dtype=torch.bfloat16,
                     kv_quant=kv_quant, seed=9)
    width = "kv8" if kv_quant else "kv16"
    params(**{width: {**kv8, "BLOCK_N": 16, "balance": 1, "split_round": split_round}}, min_split_tokens=16,
           programs_per_cu=48, max_splits=16)
    out = run(case)
    assert torch.equal(out[2], torch.zeros_like(out[2]))
    assert_close(out, reference(case), torch.bfloat16)
    # fewer tiles (2 + 1 + 3) than programs (24 or 21) and a shortest split (4 tokens) below a tile, as sm90's int8
    # entry has it (64 tokens, tiles of 128): no sequence gets more splits than tiles (an empty split's partial would
    # be 0 / 0); batch 1 and forced splits take the plan without balance in the same kernel
    params(**{width: {**kv8, "BLOCK_N": 16, "balance": 1, "split_round": split_round}}, min_split_tokens=4,
           programs_per_cu=48, max_splits=16)
    short = make_case([20, 3, 40], block_size=32, hkv=2, hq=12, dtype=torch.bfloat16, kv_quant=kv_quant, seed=3)
    assert_close(run(short), reference(short), torch.bfloat16)
    one = make_case([300], block_size=32, hkv=2, hq=12, dtype=torch.bfloat16, kv_quant=kv_quant, seed=2)
    assert_close(run(one), reference(one), torch.bfloat16)
    assert_close(run(case, num_splits=3), reference(case), torch.bfloat16)


@pytest.mark.parametrize("split_round,programs,want", [("up", 28, [10, 1, 1, 4, 2, 1, 9]),
                                                       ("down", 21, [8, 1, 1, 3, 1, 1, 6])])
def test_balanced_plan_gives_each_sequence_its_share_of_the_programs(params, split_round, programs, want):
    # the plan without balance gives each of the 7 sequences 4 (up) or 3 (down) of the 48 / 2 programs per kv head;
    # balance gives each sequence (19, 1, 0, 5, 2, 1, 13 tiles of 16 tokens) its part of them by tiles, rounded up
    # (28: 28 programs, max_splits 10 capping the first; 21: that would take 25, so the parts are of 21 - 4 = 17);
    # the workspace rows stage 1 writes are the splits of every sequence of more than one, in batch order from row 0
    # of each kv head
    lens = [300, 3, 0, 70, 17, 5, 200]
    hq, hkv, d = 12, 2, 32
    params(kv16={"BLOCK_N": 16, "balance": 1, "split_round": split_round}, min_split_tokens=16, programs_per_cu=48,
           max_splits=10)
    case = make_case(lens, block_size=32, hkv=hkv, hq=hq, dtype=torch.bfloat16, seed=4)
    need = workspace_numel(len(lens), hq, hkv, d, "cpu")
    # rounding up adds less than one program per sequence; first come two ints per sequence for stage 2, padded to
    # 16 bytes (7 sequences: 16 ints) so the partial outputs stay 16-byte aligned
    assert need == 16 + (programs + len(lens)) * hq * (d + 1)
    ws = torch.full((need,), float("nan"))
    assert_close(run(case, workspace=ws), reference(case), torch.bfloat16)
    counts = balanced_split_counts(lens, programs, 10, 16, 16)
    assert counts == want
    # what stage 1 handed stage 2: each sequence's first workspace row and split count
    firsts = [sum(counts[:i]) for i in range(len(counts))]
    assert ws[:2 * len(lens)].view(torch.int32).view(-1, 2).tolist() == [list(fc) for fc in zip(firsts, counts)]
    lse = ws[-(programs + len(lens)) * hq:].view(-1, hq)
    written, first = torch.zeros(lse.shape[0], dtype=torch.bool), 0
    for n in counts:
        if n > 1:
            written[first:first + n] = True
        first += n
    assert torch.equal(torch.isfinite(lse).all(dim=1), written)


def test_balanced_plan_leaves_equal_lengths_and_one_sequence_as_they_were(params):
    # equal lengths (40 tiles each): every sequence gets the 8 splits the plan without balance gives it, so stage 1
    # writes all 3 x 8 workspace rows of each kv head; batch 1 takes the plan without balance
    da = importlib.import_module("kernels.decode_attention.planning")
    params(kv16={"BLOCK_N": 16}, min_split_tokens=16, programs_per_cu=48, max_splits=10)
    assert da.split_plan(3, 12, 2, 32, torch.device("cpu"), None, False).splits == 8
    params(kv16={"BLOCK_N": 16, "balance": 1}, min_split_tokens=16, programs_per_cu=48, max_splits=10)
    assert da.split_plan(1, 12, 2, 32, torch.device("cpu"), None, False).programs == 0
    assert da.split_plan(3, 12, 2, 32, torch.device("cpu"), None, False).programs == 3 * 8
    assert balanced_split_counts([640] * 3, 24, 10, 16, 16) == [8] * 3
    case = make_case([640] * 3, block_size=32, hkv=2, hq=12, dtype=torch.bfloat16, seed=6)
    ws = torch.full((workspace_numel(3, 12, 2, 32, "cpu"),), float("nan"))
    assert_close(run(case, workspace=ws), reference(case), torch.bfloat16)
    lse = ws[-(24 + 3) * 12:].view(-1, 12)
    assert torch.isfinite(lse[:24]).all() and torch.isnan(lse[24:]).all()


def test_fp8_v_by_dim_takes_the_balanced_plan_as_by_token_does(params):
    # both layouts hand stage 2 each sequence's (first row, splits) at the front of the workspace, and the outputs
    # match (fp8 V by dim took the plan without balance until its page loop read contiguous slots: the kernel compiled
    # for the clamped rows stored past a shared-memory allocation on the H200, Triton 3.6)
    params(kv8={"BLOCK_N": 16, "balance": 1}, min_split_tokens=16, programs_per_cu=48, max_splits=10)
    lens = [300, 3, 70]
    case = make_case(lens, block_size=32, hkv=2, hq=12, dtype=torch.bfloat16, kv_quant="fp8", seed=5)
    counts = balanced_split_counts(lens, 3 * 8, 10, 16, 16)  # 48 / 2 kv heads / 3 sequences: 8 each without it
    handed = [x for i, n in enumerate(counts) for x in (sum(counts[:i]), n)]  # (first row, splits) per sequence
    for layout in (lambda v: v, v_by_dim):
        ws = torch.full((workspace_numel(3, 12, 2, 32, "cpu", kv8=True),), float("nan"))
        one = dict(case, v_cache=layout(case["v_cache"]))
        assert_close(run(one, workspace=ws), reference(case), torch.bfloat16)
        assert ws[:6].view(torch.int32).tolist() == handed


@pytest.mark.parametrize("q_scale", [3e4, 1e-4])
def test_int8_qk_takes_queries_of_any_scale(params, q_scale):
    params(kv8={"int8_qk": 1})
    case = make_case([50, 9], block_size=16, hkv=1, dtype=torch.bfloat16, kv_quant="int8")
    case["q"] = (case["q"].float() * q_scale).to(torch.bfloat16)
    case["scale"] = case["scale"] / q_scale
    assert_close(run(case, num_splits=2), reference(case), torch.bfloat16)


def test_int8_qk_with_zero_query_rows_and_fp8_caches_ignoring_it(params):
    case = make_case([40, 17], block_size=16, hkv=2, hq=12, dtype=torch.bfloat16, kv_quant="int8", seed=3)
    case["q"][0, :6] = 0  # a kv head whose q rows are all zero: uniform attention, no division by zero
    params(kv8={"int8_qk": 1})
    assert_close(run(case, num_splits=2), reference(case), torch.bfloat16)
    fp8 = make_case([40, 17], block_size=16, hkv=2, hq=12, dtype=torch.bfloat16, kv_quant="fp8", seed=3)
    with_key = run(fp8, num_splits=2, software_fp8=True)
    params()
    assert torch.equal(with_key, run(fp8, num_splits=2, software_fp8=True))


@pytest.mark.parametrize("k_mag,v_mag", [(6e4, 1e5), (6e4, 1e-6)])
def test_bf16_cache_across_the_value_range(k_mag, v_mag):
    case = make_case([70, 45], block_size=16, hkv=2, hq=12, dtype=torch.bfloat16, k_mag=k_mag, v_mag=v_mag, seed=12)
    assert_rel_close(run(case, num_splits=3), reference(case))


def _tile_magnitudes(mags, d, bias=True):
    """kv_fn for make_case: token t of sequence 0 gets V x mags[t // 16]; with ``bias``, its score is shifted by
    -ln(mags[t // 16]) (q[..., 0] = 4, K[..., 0] carries the shift), so every tile adds about as much to the
    output as any other and a tile computed badly shows in the error."""
    scale = d**-0.5

    def fn(q, k, v, table):
        if bias:
            q[..., 0] = 4.0
        block_size = k.shape[1]
        for t in range(16 * len(mags)):
            page, slot = divmod(t, block_size)
            blk = int(table[0, page])
            v[blk, slot] *= mags[t // 16]
            if bias:
                k[blk, slot, :, 0] = -math.log(mags[t // 16]) / (scale * 4.0) if mags[t // 16] > 0 else -30.0
    return fn


@pytest.mark.parametrize("kv_quant,software", KV8, ids=KV8_IDS)
def test_8bit_v_magnitude_changing_between_tiles_and_splits(params, kv_quant, software):
    # 16-token tiles, 2 splits of 4 tiles: V magnitudes 1e-6..1e-4 in the first split and 1e3..1e5 in the second,
    # each tile weighted to add as much as the others. The V factor changes from tile to tile within a split (the
    # accumulator is rescaled by old / new factor) and the two splits' partial outputs are 1e10 apart (the merge
    # must get them in their true units).
    params(BLOCK_N=16)
    mags = [1e-6, 1e-4, 1e-5, 3e-6, 1e5, 1e3, 3e4, 1e4]
    case = make_case([128, 20], block_size=16, hq=6, hkv=1, dtype=torch.bfloat16, kv_quant=kv_quant, seed=13,
                     kv_fn=_tile_magnitudes(mags, 32))
    assert_rel_close(run(case, num_splits=2, software_fp8=software), reference(case))


@pytest.mark.parametrize("kv_quant,software", KV8, ids=KV8_IDS)
def test_8bit_extreme_and_zero_v_tiles_give_finite_accurate_outputs(params, kv_quant, software):
    # one split over tiles of V ~ 1e37 (near bf16's largest), all-zero V (scales 0), V ~ 1e-30 and V ~ 1: no
    # 0/0 from a zero tile's factor and no overflow of the factor ratio (1e37 / 1e-30 is beyond float32)
    params(BLOCK_N=16)
    mags = [1e37, 0.0, 1e-30, 1.0]
    case = make_case([64, 5], block_size=16, hq=6, hkv=1, dtype=torch.bfloat16, kv_quant=kv_quant, seed=14,
                     kv_fn=_tile_magnitudes(mags, 32, bias=False))
    out = run(case, num_splits=1, software_fp8=software)
    assert_rel_close(out, reference(case))


@pytest.mark.parametrize("kv_quant,software", KV8, ids=KV8_IDS)
def test_8bit_huge_v_keeps_the_keys_below_the_max_when_subnormals_flush(params, kv_quant, software):
    # attention_checks.huge_v_keys_below_the_max: the form that failed on the H200 (one exponential) fails here
    # only when subnormals flush, as on a GPU
    params(BLOCK_N=16)
    case = make_case([256, 3], block_size=16, hq=6, hkv=1, d=32, dtype=torch.bfloat16, kv_quant=kv_quant, seed=21,
                     kv_fn=huge_v_keys_below_the_max(32))
    with subnormals_flushed():
        split1 = run(case, num_splits=1, software_fp8=software)
        split3 = run(case, num_splits=3, software_fp8=software)
    assert_rel_close(split1, reference(case))
    assert_rel_close(split3, reference(case))


@triton.jit
def _convert_kernel(codes_ptr, out_ptr, KV_QUANT: tl.constexpr):
    offs = tl.arange(0, 256)
    codes = tl.load(codes_ptr + offs[None, :])
    tl.store(out_ptr + offs[None, :], codes_to_f16(codes, KV_QUANT, True, False))


@pytest.mark.parametrize("kv_quant", ["fp8", "int8"])
def test_every_code_converts_exactly_to_fp16_with_integer_ops(kv_quant):
    codes = torch.arange(256, dtype=torch.uint8)
    out = torch.empty(256, dtype=torch.float16)
    _convert_kernel[(1,)](codes, out, KV_QUANT=1 if kv_quant == "fp8" else 2)
    if kv_quant == "fp8":  # value * 2^-8; subnormal codes included, NaN codes never written
        finite = (codes & 0x7F) != 0x7F
        assert torch.equal(out.float()[finite], codes.view(torch.float8_e4m3fn).float()[finite] / 256)
    else:
        assert torch.equal(out.float(), codes.view(torch.int8).float() / 128)


def test_more_splits_than_blocks_leaves_extra_programs_idle():
    case = make_case([40, 7], block_size=16, hkv=1)  # 3 and 1 tiles of 16
    assert_close(run(case, num_splits=64), reference(case), torch.float16)


def test_merge_of_more_splits_than_one_merge_step_holds():
    case = make_case([1100], block_size=48, hkv=1, hq=1, d=80)  # 69 tiles -> 69 splits, merged 64 at a time
    # the last splits (second merge step) get the largest scores, so the merge must rescale step one
    for t in range(1060, 1100):
        page, slot = divmod(t, 48)
        case["k_cache"][case["block_table"][0, page], slot, 0] = case["q"][0, 0]
    assert_close(run(case, num_splits=80), reference(case), torch.float16)


def test_single_token_context_and_empty_padded_slot():
    # seq_len 0 is how vLLM pads a CUDA-graph batch: the slot must come out as zeros, not NaN
    case = make_case([1, 0, 5], block_size=16, hkv=2, hq=4)
    out = run(case, num_splits=4)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert_close(out, reference(case), torch.float16)


def test_default_split_plan_matches_reference():
    case = make_case([90, 33], block_size=16, hkv=2, hq=12)
    assert_close(run(case), reference(case), torch.float16)


@pytest.mark.parametrize("kv_quant", ["fp8", "int8"])
def test_all_zero_heads_store_zero_scale_and_attend_without_nan(kv_quant):
    case = make_case([40], block_size=16, hkv=1, kv_quant=kv_quant)
    case["k_cache"][:, :5].zero_()
    case["k_scales"][:, :5].zero_()
    case["v_cache"][:, 3:9].zero_()
    case["v_scales"][:, 3:9].zero_()
    assert_close(run(case, num_splits=2, software_fp8=True), reference(case), torch.float16)


@pytest.mark.parametrize("hq,hkv", [(16, 1), (4, 4)])
def test_gqa_group_of_16_and_plain_multi_head(hq, hkv):
    case = make_case([21, 50], block_size=16, hq=hq, hkv=hkv)
    assert_close(run(case, num_splits=2), reference(case), torch.float16)


def test_strided_query_and_padded_hybrid_pages():
    # vLLM's q is a view into the fused qkv projection; hybrid models pad every page
    case = make_case([30, 64], block_size=32, hkv=2, hq=4, page_pad=96)
    qkv = torch.randn(2, 8, 32).to(torch.float16)
    qkv[:, :4] = case["q"]
    case["q"] = qkv[:, :4]
    assert not case["q"].is_contiguous()
    assert_close(run(case, num_splits=2), reference(case), torch.float16)


def test_non_power_of_two_head_dim():
    case = make_case([25, 3], block_size=16, hkv=1, hq=3, d=48)
    assert_close(run(case, num_splits=2), reference(case), torch.float16)


def test_preallocated_workspace_gives_the_same_output():
    case = make_case([50, 17, 80], block_size=16, hkv=2, hq=4)
    need = workspace_numel(3, 4, 2, 32, "cpu", num_splits=4)
    ws = torch.full((need,), float("nan"))
    a = run(case, num_splits=4, workspace=ws)
    b = run(case, num_splits=4)
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="workspace must be float32 1-D with >= "):
        run(case, num_splits=4, workspace=ws[: need - 1])


# --- launcher validation -------------------------------------------------------------------------

def _bad(case, match, **kw):
    with pytest.raises(ValueError, match=match):
        run(case, **kw)


def test_launcher_rejects_bad_inputs_with_one_clear_message():
    case = make_case([5], block_size=16, hkv=2, hq=4)
    _bad(dict(case, q=case["q"].float()), "q must be .* float16/bfloat16")
    _bad(dict(case, k_cache=case["k_cache"][:, :8]), "k_cache and v_cache must both be")
    _bad(dict(case, seq_lens=case["seq_lens"].long()), "seq_lens must be int32")
    _bad(dict(case, block_table=case["block_table"][:0]), "block_table must be int32")
    _bad(dict(case, q=case["q"][:, :3]), r"q heads \(3\) must be a multiple of kv heads \(2\)")
    _bad(case, "kv_quant must be one of", kv_quant="fp4")
    _bad(case, "kv_quant='int8' needs torch.uint8 caches", kv_quant="int8")
    _bad(case, r"num_splits must be an int in \[1, 65535\]", num_splits=0)
    _bad(case, r"num_splits must be an int in \[1, 65535\]", num_splits=70000)
    _bad(dict(case, k_scales=torch.ones(3)), "k_scales/v_scales are only used with")
    odd = make_case([5], block_size=24, hkv=2, hq=4)
    _bad(odd, "block size must be a multiple of 16, got 24")
    q8 = make_case([5], block_size=16, hkv=2, hq=4, kv_quant="fp8")
    _bad(dict(q8, v_scales=q8["v_scales"].double()), "needs v_scales float32")


# --- launch parameters ---------------------------------------------------------------------------

GLUON_LAUNCH = {"BLOCK_N": 128, "num_warps": 4, "num_stages": 2}  # the kv8 entry's gluon launch the tests turn on

def test_env_override_replaces_values_for_both_kv_widths(params):
    table_before = json.dumps(launch_params.PARAMS, sort_keys=True)
    params(BLOCK_N=64, kv8={"num_warps": 8}, programs_per_cu=3)
    entry = launch_params.get_params("sm90")
    assert entry["kv16"]["BLOCK_N"] == entry["kv8"]["BLOCK_N"] == 64
    assert entry["kv8"]["num_warps"] == 8 and entry["programs_per_cu"] == 3
    assert entry["measured"] is False
    assert json.dumps(launch_params.PARAMS, sort_keys=True) == table_before  # the table itself is untouched
    table_ppc = launch_params.PARAMS["sm90"]["programs_per_cu"]
    assert launch_params.get_params("sm90", override="")["programs_per_cu"] == table_ppc


def test_gluon_launch_fails_on_rocm_targets():
    with pytest.raises(ValueError, match="kv8.gluon .the Gluon stage 1. is CUDA-only, not valid on gfx936"):
        launch_params.get_params("gfx936", override=json.dumps({"kv8": {"gluon": GLUON_LAUNCH}}))


@pytest.mark.parametrize("text,match", [
    ("{BLOCK_N: 32}", "is not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    ('{"BLOCK_M": 32}', r"unknown key\(s\) \['BLOCK_M'\]"),
    ('{"BLOCK_N": 48}', "BLOCK_N must be a power of two >= 16"),
    ('{"num_warps": "4"}', "num_warps must be a positive integer"),
    ('{"kv8": {"tile": 1}}', "'kv8' must be an object with keys from"),
    ('{"waves_per_eu": 2}', "ROCm-only options, not valid on sm90"),
    ('{"kv16": {"early_convert": 1}}', "early_convert applies to kv8 only"),
    ('{"early_convert": 3}', "kv8.early_convert must be 0, 1 or 2"),
    ('{"kv8": {"page_loop": 2}}', "kv8.page_loop must be 0 or 1"),
    ('{"kv8": {"page_loop": true}}', "kv8.page_loop must be 0 or 1"),  # JSON true is not 1, for every key
    ('{"num_warps": true}', "num_warps must be a positive integer"),
    ('{"kv8": {"int8_qk": 2}}', "kv8.int8_qk must be 0 or 1"),
    ('{"kv16": {"int8_qk": 1}}', "int8_qk applies to kv8 only"),
    ('{"kv8": {"q_early": 2}}', "kv8.q_early must be 0 or 1"),
    ('{"kv16": {"q_early": 0}}', "q_early applies to kv8 only"),
    ('{"kv16": {"even_splits": 2}}', "kv16.even_splits must be 0 or 1"),
    ('{"kv8": {"balance": 2}}', "kv8.balance must be 0 or 1"),
    ('{"kv8": {"int8": {"balance": 1}}}', "'kv8.int8' must be an object with keys from"),  # the host plan
    ('{"split_round": "nearest"}', 'kv16.split_round must be "up" or "down"'),
    ('{"kv8": {"int8": {"split_round": "up"}}}', "'kv8.int8' must be an object with keys from"),  # the host plan
    ('{"kv8": {"int8": 2}}', "'kv8.int8' must be an object with keys from"),
    ('{"kv16": {"int8": {"num_warps": 2}}}', "'kv16' must be an object with keys from"),
    ('{"kv8": {"int8": {"num_warps": 0}}}', "kv8.num_warps must be a positive integer"),
    ('{"kv8": {"int8": {"BLOCK_N": 48}}}', "kv8.BLOCK_N must be a power of two >= 16"),
    ('{"kv8": {"int8": {"waves_per_eu": 2}}}', "ROCm-only options, not valid on sm90"),
    ('{"kv8": {"gluon": 1}}', "'kv8.gluon' must be an object with BLOCK_N, num_warps, num_stages"),
    ('{"kv8": {"gluon": {"BLOCK_N": 128, "num_warps": 8}}}', "'kv8.gluon' must be an object with BLOCK_N"),
    ('{"kv8": {"gluon": {"BLOCK_N": 32, "num_warps": 8, "num_stages": 2}}}', "kv8.gluon needs BLOCK_N in"),
    ('{"kv8": {"gluon": {"BLOCK_N": 128, "num_warps": 8, "num_stages": 1}}}', r"num_stages >= 2 \(a ring\)"),
    ('{"kv8": {"gluon": {"BLOCK_N": 128, "num_warps": 0, "num_stages": 2}}}', "kv8.gluon.num_warps must be a positive"),
    ('{"kv8": {"gluon": {"BLOCK_N": 64, "num_warps": 8, "num_stages": 2}}}', r"16 x num_warps <= BLOCK_N \(16 keys"),
    ('{"kv8": {"gluon": {"BLOCK_N": 128, "num_warps": 3, "num_stages": 2}}}', "num_warps must be a power of two"),
    ('{"kv16": {"gluon": {"BLOCK_N": 128, "num_warps": 8, "num_stages": 2}}}', "'kv16' must be an object with keys"),
])
def test_bad_env_override_fails_with_one_clear_error(text, match):
    with pytest.raises(ValueError, match=match):
        launch_params.get_params("sm90", override=text)


def test_early_convert_given_at_top_level_goes_to_kv8_only():
    entry = launch_params.get_params("sm90", override='{"early_convert": 0}')
    assert entry["kv8"]["early_convert"] == 0 and "early_convert" not in entry["kv16"]


def test_null_drops_a_rocm_option_and_nothing_else():
    entry = launch_params.get_params("gfx936", override='{"matrix_instr_nonkdim": null, "kv8": {"waves_per_eu": null}}')
    assert "matrix_instr_nonkdim" not in entry["kv16"] and "matrix_instr_nonkdim" not in entry["kv8"]
    assert "waves_per_eu" in entry["kv16"] and "waves_per_eu" not in entry["kv8"]
    with pytest.raises(ValueError, match="can be dropped with null, not BLOCK_N"):
        launch_params.get_params("gfx936", override='{"BLOCK_N": null}')


def test_dcu_entries_fit_64k_lds_and_are_marked_unmeasured():
    for target in ("gfx936", "gfx928"):
        entry = launch_params.get_params(target, override="")
        assert entry["measured"] is False
        for sub in ("kv16", "kv8"):
            p = entry[sub]
            assert p["matrix_instr_nonkdim"] == 16 and p["waves_per_eu"] >= 1
            assert launch_params.lds_bytes(p["BLOCK_N"], 256, p["num_stages"]) <= 65536


def test_dcu_int8_reads_v_by_dim_as_contiguous_runs_and_fp8_keeps_its_entry():
    """int8 pages hold V by dim: only the page loop reads a tile's V as one run (V_CONTIG with unclamped slots);
    without it Triton gathers the bytes one by one. The DCU's entry turns the page loop on for int8 caches only, at
    the int8 page size (1664 tokens) and down to pages of one tile; fp8 (V by token) launches as before."""
    from kernels.decode_attention.planning import split_kernel_launch

    for target in ("gfx936", "gfx928"):
        kv8 = launch_params.get_params(target, override="")["kv8"]
        for block_size in (1664, kv8["BLOCK_N"]):
            consts, options = split_kernel_launch(kv8, block_size, kv_quant=2, v_by_dim=True)
            assert consts["PAGE_LOOP"] and consts["V_CONTIG"] and consts["INT8_PV"], consts
            assert "page_loop" not in options and options["num_stages"] == kv8["num_stages"]
        consts, _ = split_kernel_launch(kv8, 16, kv_quant=2, v_by_dim=True)  # pages shorter than a tile: no loop
        assert not consts["PAGE_LOOP"]
        consts, _ = split_kernel_launch(kv8, 1552, kv_quant=1, v_by_dim=False)
        assert not consts["PAGE_LOOP"] and not consts["V_CONTIG"]


def test_lds_estimate_over_the_dcu_limit_is_rejected_at_launch(monkeypatch):
    monkeypatch.setattr(launch_params, "current_target", lambda device=None: "gfx936")
    monkeypatch.setenv(launch_params.ENV_VAR, '{"BLOCK_N": 128, "num_stages": 2}')
    case = make_case([5], block_size=16, hkv=1, hq=6, d=256)
    _bad(case, "need ~.* B of LDS at head_dim 256, limit 65536 B; lower BLOCK_N or num_stages")


def test_split_count_fills_the_chip_at_batch_1_and_depends_only_on_batch_and_device():
    entry = launch_params.get_params("sm90", override="")
    assert launch_params.num_splits(1, 4, 132, entry) * 4 >= 132  # batch 1: every SM busy
    assert launch_params.num_splits(64, 4, 132, entry) == 2
    assert launch_params.num_splits(1024, 4, 132, entry) == 1
    dcu = launch_params.get_params("gfx936", override="")
    assert launch_params.num_splits(1, 4, 80, dcu) * 4 >= 80


@pytest.mark.parametrize("batch,up,down", [(1, 66, 66), (4, 17, 16), (16, 5, 4), (64, 2, 1), (1024, 1, 1)])
def test_split_round_down_never_launches_more_programs_than_the_target(batch, up, down):
    entry = launch_params.get_params("sm90", override="")  # 2 programs per SM: 264 on 132 SMs
    assert launch_params.num_splits(batch, 4, 132, entry) == up
    assert launch_params.num_splits(batch, 4, 132, entry, round_down=True) == down
    assert batch * 4 * down <= 264 or down == 1


def test_a_width_may_set_its_own_programs_per_cu(params, monkeypatch):
    # the plan of 8-bit caches with kv8.programs_per_cu 3, bf16's with the entry's 2 (132 SMs, batch 4, 4 kv heads)
    da = importlib.import_module("kernels.decode_attention.planning")
    monkeypatch.setattr(launch_params, "current_target", lambda device=None: "sm90")
    monkeypatch.setattr(da, "num_compute_units", lambda device: 132)
    _plan, split_kernel_launch = da.split_plan, da.split_kernel_launch
    params(kv8={"programs_per_cu": 3})
    cpu = torch.device("cpu")
    plan8, plan16 = _plan(4, 24, 4, 256, cpu, None, kv8=True), _plan(4, 24, 4, 256, cpu, None, kv8=False)
    # 396 // 16 rows (split_round down) and ceil(264 / 16) splits per sequence, which sm90's launch key balance shares
    # out by length: 4 x 24 and 4 x 17 programs per kv head
    assert (plan8.programs, plan16.programs) == (4 * 24, 4 * 17)
    assert "programs_per_cu" not in split_kernel_launch(plan8.launch, 1552, 2)[1]  # host-side only, not for Triton
    with pytest.raises(ValueError, match="kv8.programs_per_cu must be a positive integer"):
        launch_params.get_params("sm90", override='{"kv8": {"programs_per_cu": 0}}')


def test_a_width_may_set_its_own_min_split_tokens(params):
    # kv8.min_split_tokens reaches the plan of 8-bit caches only, and both stages use it (output = reference)
    import importlib

    da = importlib.import_module("kernels.decode_attention.planning")
    params(kv8={"min_split_tokens": 96, "BLOCK_N": 16}, min_split_tokens=16)
    cpu = torch.device("cpu")
    assert da.split_plan(1, 4, 2, 32, cpu, None, kv8=True)[2] == 96
    assert da.split_plan(1, 4, 2, 32, cpu, None, kv8=False)[2] == 16
    assert "min_split_tokens" not in da.split_kernel_launch(da.split_plan(1, 4, 2, 32, cpu, None, kv8=True)[0], 48, 2)[1]
    case = make_case([300, 47, 128], block_size=48, hkv=2, hq=4, kv_quant="int8", seed=11)
    assert_close(run(case), reference(case), torch.float16)


def test_kv8_int8_options_apply_to_int8_caches_only(params):
    # kv8.int8 merges over kv8 for int8 caches (sm90: 2 warps); fp8 caches and the split plan take kv8 as it is
    import importlib

    da = importlib.import_module("kernels.decode_attention.planning")
    params(kv8={"num_warps": 4, "int8": {"num_warps": 2, "BLOCK_N": 32}})
    launch = launch_params.get_params("sm90")["kv8"]
    consts8, options8 = da.split_kernel_launch(launch, 1552, 2)
    consts_fp8, options_fp8 = da.split_kernel_launch(launch, 1552, 1)
    assert (options8["num_warps"], consts8["BLOCK_N"]) == (2, 32)
    assert (options_fp8["num_warps"], consts_fp8["BLOCK_N"]) == (4, launch["BLOCK_N"])
    assert "int8" not in options8 and "int8" not in options_fp8  # never a Triton option
    assert launch_params.get_params("sm90", override='{"kv8": {"int8": null}}')["kv8"].get("int8") is None


def test_kv8_int8_block_n_gives_the_reference_output(params):
    # BLOCK_N from kv8.int8 reaches both stages (the merge recomputes each sequence's split count from it)
    params(kv8={"BLOCK_N": 16, "page_loop": 1, "int8": {"BLOCK_N": 32}})
    case = make_case([300, 47, 128], block_size=48, hkv=2, hq=4, kv_quant="int8", seed=10)
    assert_close(run(case, num_splits=3), reference(case), torch.float16)


def test_split_round_down_gives_the_reference_output_and_its_workspace(params):
    params(kv8={"split_round": "down", "page_loop": 1, "BLOCK_N": 32})
    case = make_case([300, 47, 128], block_size=48, hkv=2, hq=4, kv_quant="int8", seed=8)
    need = workspace_numel(3, 4, 2, 32, "cpu", kv8=True)
    out = torch.full_like(case["q"], float("nan"))
    decode_attention(case["q"], case["k_cache"], case["v_cache"], case["block_table"], case["seq_lens"],
                     case["scale"], out, k_scales=case["k_scales"], v_scales=case["v_scales"], kv_quant="int8",
                     workspace=torch.empty(need))
    assert_close(out, reference(case), torch.float16)


# --- benchmark script ----------------------------------------------------------------------------

def bench_dry_run(tmp_path, monkeypatch, *args):
    """Run the decode bench's --dry-run with ``args`` into tmp_path (no unified-attention baseline); returns its JSON
    report and its markdown."""
    from kernels.decode_attention import bench

    monkeypatch.delenv("VLLM_DCU_BASELINE_UA", raising=False)
    try:
        bench.main(["--dry-run", *args, "--out", str(tmp_path)])
    finally:
        importlib.reload(bench)  # --dry-run rewrote the module's shapes
    return json.loads(next(tmp_path.glob("*.json")).read_text()), next(tmp_path.glob("*.md")).read_text()


@pytest.mark.slow
def test_bench_dry_run_writes_json_markdown_and_png(tmp_path, monkeypatch):
    report, md = bench_dry_run(tmp_path, monkeypatch)
    names = sorted(p.suffix for p in tmp_path.iterdir())
    assert names == [".json", ".md", ".png"]
    kinds = {r["dtype"] for r in report["rows"]}
    assert kinds == {"bf16", "fp8_pth_hw", "fp8_pth_sw", "int8_pth"}
    override = report["meta"]["suggested_override"]  # VLLM_DCU_DECODE_PARAMS's format, the tuned file's launch.decode
    assert launch_params.get_params("interpreter", override=json.dumps(override))["kv16"]["BLOCK_N"] in (16, 32)
    assert "VLLM_DCU_DECODE_PARAMS='" in md
    assert "| int8_pth | 2 | 100 |" in md


def test_bench_merge_splits_sets_the_kernel_modules_stage2_constant(tmp_path, monkeypatch):
    # the bench once set it on the package's export of the same name (the function), so the flag did nothing
    module = importlib.import_module("kernels.decode_attention.decode_attention")  # not the package's export
    monkeypatch.setattr(module, "_MERGE_SPLITS", module._MERGE_SPLITS)  # undone after the test
    report, _ = bench_dry_run(tmp_path, monkeypatch, "--quick", "--merge-splits", "32", "--batches", "1", "--ctxs", "40",
                              "--kv8-dtypes", "int8_pth")
    assert module._MERGE_SPLITS == 32 and "--merge-splits 32" in report["meta"]["command"]


def test_bench_times_graphs_of_calls_shape_by_shape_with_v_by_dim_rows(tmp_path, monkeypatch):
    report, md = bench_dry_run(tmp_path, monkeypatch, "--quick", "--calls-per-graph", "2", "--v-layouts", "token,dim",
                               "--batches", "1,2", "--ctxs", "40")
    assert report["meta"]["calls_per_graph"] == 2 and "--calls-per-graph 2" in report["meta"]["command"]
    kinds = [r["dtype"] for r in report["rows"]]
    # timed shape by shape, reported grouped by run (bf16 first, then the 8-bit kinds with V read by token, then by
    # dim); a row names the layout where it is not the cache's own (int8 caches hold V by dim, fp8 ones by token)
    assert kinds == [k for k in ("bf16", "fp8_pth_hw", "fp8_pth_sw", "int8_pth [Vtok]", "fp8_pth_hw [Vdim]",
                                 "fp8_pth_sw [Vdim]", "int8_pth") for _ in (1, 2)]
    assert all("ratio_vs_bf16" in r for r in report["rows"] if r["dtype"] != "bf16")
    assert "graphs of 2 calls on different pages" in md


def test_bench_times_batches_of_mixed_lengths_with_the_balanced_plan(tmp_path, monkeypatch):
    from kernels.decode_attention import bench

    assert bench.batch_lengths(5, 100, ("spread", 0.5)) == [50, 75, 100, 88, 62]  # the longest in the middle
    assert bench.batch_lengths(4, 100, ("one-long", 0.25)) == [25, 25, 100, 25]
    assert bench.batch_lengths(3, 100) == [100] * 3 and bench.batch_lengths(1, 100, ("spread", 0.5)) == [100]
    monkeypatch.setenv(launch_params.ENV_VAR, '{"balance": 1}')
    report, md = bench_dry_run(tmp_path, monkeypatch, "--quick", "--lens", "spread:0.5", "--kv8-dtypes", "int8_pth",
                               "--batches", "3", "--ctxs", "40")
    assert report["meta"]["lens"] == ["spread", 0.5] and "--lens spread:0.5" in report["meta"]["command"]
    bf16 = next(r for r in report["rows"] if r["dtype"] == "bf16")
    assert bf16["splits"] == "b3"  # interpreter: 4 programs on its one "CU" give 1 split to each of 3 x 2 kv heads
    # bytes of 20 + 40 + 30 tokens, not 3 x 40 (the dry run's 2 kv heads of head_dim 32, bf16 K and V)
    assert bf16["GBps"] == round(90 * 2 * 32 * 4 / (bf16["us"] * 1e-6) / 1e9)
    assert "Lengths `spread:0.5`" in md


@pytest.mark.parametrize("args,match", [(["--v-layouts", "tile"], "--v-layouts wants token and/or dim"),
                                        (["--v-layouts", "dim,dim"], "--v-layouts wants"),
                                        (["--calls-per-graph", "0"], "--calls-per-graph wants 1..64"),
                                        (["--merge-splits", "48"], "--merge-splits wants a power of two"),
                                        (["--kv8-dtypes", "int4_pth"], "--kv8-dtypes wants some of"),
                                        (["--kv8-dtypes", "int8_pth"], "--kv8-dtypes needs --quick"),
                                        (["--quick", "--lens", "spread:0"], "--lens wants spread:F or one-long:F"),
                                        (["--quick", "--lens", "ramp:0.5"], "--lens wants"),
                                        (["--lens", "spread:0.5"], "--lens wants .* with --quick"),
                                        (["--block-8bit", "100"], "--block-8bit wants a positive multiple of 16"),
                                        (["--block-8bit", "0"], "--block-8bit wants")])
def test_bench_rejects_bad_timing_options_with_one_line(args, match):
    from kernels.decode_attention import bench

    with pytest.raises(SystemExit, match=match):
        bench.main(args)


def _kv8_scored(*rows):
    return [(cfg, {"int8_pth": [i8], "fp8_pth_sw": [f8]}) for cfg, i8, f8 in rows]


def test_bench_pages_the_8bit_caches_with_block_8bit_tokens(tmp_path, monkeypatch):
    # --block-8bit: both 8-bit caches' page in tokens (an int8 cache's V rows by dim start on a line when it is a
    # multiple of 128); bf16 keeps its own
    report, md = bench_dry_run(tmp_path, monkeypatch, "--quick", "--kv8-dtypes", "int8_pth", "--batches", "1",
                               "--ctxs", "100", "--block-8bit", "64")
    assert {(r["dtype"], r["block_size"]) for r in report["rows"]} == {("bf16", 48), ("int8_pth", 64)}
    assert "--block-8bit 64" in report["meta"]["command"]


def test_bench_times_only_the_8bit_kinds_asked_for(tmp_path, monkeypatch):
    report, _ = bench_dry_run(tmp_path, monkeypatch, "--quick", "--kv8-dtypes", "int8_pth", "--batches", "1",
                              "--ctxs", "40")
    assert [r["dtype"] for r in report["rows"]] == ["bf16", "int8_pth"]
    assert "--kv8-dtypes int8_pth" in report["meta"]["command"]


def test_bench_sweep_suggests_int8_options_where_int8_is_fastest_with_another_config():
    from kernels.decode_attention import bench

    a = dict(BLOCK_N=64, num_warps=4, num_stages=3, page_loop=1, split_round="down")
    b = dict(a, num_warps=2)
    q = dict(BLOCK_N=32, num_warps=4, num_stages=3, int8_qk=1, split_round="down")  # leaves page_loop out
    # one config fastest for both kinds: suggested as it is
    assert bench.kv8_entry(_kv8_scored((a, 10.0, 10.0), (b, 11.0, 12.0))) == a
    # int8 fastest on 2 warps, fp8 on 4: fp8's config with int8's difference as its own options
    entry = bench.kv8_entry(_kv8_scored((a, 10.0, 10.0), (b, 9.0, 12.0)))
    assert entry == dict(a, int8={"num_warps": 2})
    # int8_qk goes to the top (fp8 caches ignore it); a key one side leaves out counts as its default
    entry = bench.kv8_entry(_kv8_scored((a, 10.0, 10.0), (q, 9.0, 12.0)))
    assert entry == dict(a, int8_qk=1, int8={"BLOCK_N": 32, "page_loop": 0})
    for e in (entry, dict(a, int8={"num_warps": 2})):  # what the sweep suggests is a valid entry
        launch_params.get_params("sm90", override=json.dumps({"kv8": e}))
    # a different split plan cannot be an int8 option: the jointly fastest config
    c = dict(a, split_round="up")
    assert bench.kv8_entry(_kv8_scored((a, 10.0, 10.0), (c, 8.0, 10.5))) == c
    assert bench.kv8_entry(_kv8_scored((a, 10.0, 9.0), (c, 9.5, 12.0))) == a


def test_bench_summary_gives_geomeans_against_bf16_the_table_and_an_earlier_run():
    from kernels.decode_attention import bench

    def rows(kind, times):
        return [dict(dtype=kind, batch=b, ctx=c, us=t) for (b, c), t in times.items()]

    cells = [(1, 4096), (1, 8192), (4, 4096), (4, 8192)]
    now = rows("bf16", dict.fromkeys(cells, 10.0)) + rows("int8_pth", dict(zip(cells, [8.0, 8.0, 5.0, 20.0]))) \
        + rows("int8_pth [E]", dict(zip(cells, [4.0, 4.0, 5.0, 20.0]))) \
        + [dict(dtype="baseline_bf16", batch=1, ctx=4096, us=99.0)]
    before = rows("int8_pth", dict.fromkeys(cells, 10.0))
    lines = bench.summary_markdown(now, before).splitlines()
    assert lines[0] == "| rows | x bf16, batch 1 | x bf16, batch 4 | x table | x compared |"
    table = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in lines[2:]}
    assert table["bf16"] == ["1", "1", "-", "- |"]
    # batch 4: geomean(0.5, 2.0) = 1; x compared: geomean(0.8, 0.8, 0.5, 2.0) = 0.64 ** 0.25
    assert table["int8_pth"] == ["0.800", "1.000", "-", "0.894 |"]
    # the variant against the table's rows: geomean(0.5, 0.5, 1, 1) = 0.707; against the earlier int8_pth rows
    assert table["int8_pth [E]"] == ["0.400", "1.000", "0.707", "0.632 |"]
    assert "baseline_bf16" not in table


def test_bench_cost_table_splits_time_into_per_token_and_fixed_parts(tmp_path, capsys):
    from kernels.decode_attention import bench

    # bf16: 10 us + 2 us per 1K tokens; int8: 12 us + 1.1 us per 1K at batch 1, one context at batch 4 (no fit)
    rows = [dict(dtype="bf16", batch=1, ctx=c, us=10 + 2 * c / 1024) for c in (4096, 8192, 16384)]
    rows += [dict(dtype="int8_pth", batch=1, ctx=c, us=12 + 1.1 * c / 1024) for c in (4096, 8192, 16384)]
    rows += [dict(dtype="int8_pth", batch=4, ctx=4096, us=30.0), dict(dtype="baseline_bf16", batch=1, ctx=4096, us=1)]
    per, fixed = bench.cost_fit([(4096, 18.0), (8192, 26.0)])
    assert per == pytest.approx(2.0) and fixed == pytest.approx(10.0)
    lines = bench.cost_markdown(rows).splitlines()
    head = "us / 1K tokens (x bf16) + fixed us"
    assert lines[0] == f"| rows | batch 1: {head} | batch 4: {head} |"
    assert lines[2:] == ["| bf16 | 2.00 + 10.0 | - |", "| int8_pth | 1.10 (0.55x) + 12.0 | - |"]
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"rows": rows}))
    bench.main(["--summary", str(path)])
    assert "| int8_pth | 1.10 (0.55x) + 12.0 | - |" in capsys.readouterr().out
    path.write_text("{}")
    with pytest.raises(SystemExit, match="not a decode bench JSON"):
        bench.main(["--summary", str(path)])


def test_bench_table_splits_a_call_into_its_stages_when_they_were_timed(monkeypatch):
    from kernels.decode_attention import bench

    meta = dict(device="d", command="c", copy_GBps=1000.0, baseline="none", target="t", config={}, swept=False)
    row = dict(dtype="int8_pth", batch=1, ctx=16384, splits=66, us=22.0, GBps=1500, pct_copy=36.0, ratio_vs_bf16=0.77)
    plain = bench.markdown(meta, [row]).splitlines()
    assert plain[-1].endswith("| 0.77 |") and "stage 1 us" not in "\n".join(plain)
    rows = [dict(row, stage1_us=15.5, stage2_us=2.5),
            dict(row, batch=64, stage1_us=40.0, us=41.0),  # one split per sequence: no stage 2 kernel
            dict(row, batch=4)]  # the profiler saw nothing
    lines = bench.markdown(meta, rows).splitlines()
    assert lines[-5].endswith("| x bf16 | stage 1 us | stage 2 us | rest us |") and lines[-4].count("---") == 13
    assert lines[-3].endswith("| 0.77 | 15.5 | 2.5 | 4.0 |")
    assert lines[-2].endswith("| 0.77 | 40.0 | 0.0 | 1.0 |")
    assert lines[-1].endswith("| 0.77 | - | - | - |")
    monkeypatch.setattr(bench, "DEV", "cpu")  # --dry-run's device: no profiler, no stage columns
    assert bench.stage_times([lambda: None]) == {}


def test_bench_profiles_stage_times_after_every_row_is_timed(tmp_path, monkeypatch):
    # once the profiler has run, later replays in the process cost more: no row may be timed after a profile
    from kernels.decode_attention import bench

    events = []
    real = bench.time_graph
    monkeypatch.setattr(bench, "time_graph", lambda fn, *a, **k: events.append("time") or real(fn, *a, **k))
    monkeypatch.setattr(bench, "stage_times", lambda fns, reps=20: events.append("profile") or {"stage1_us": 1.5})
    report, md = bench_dry_run(tmp_path, monkeypatch, "--quick", "--stage-times", "--kv8-dtypes", "int8_pth",
                               "--batches", "1,2", "--ctxs", "40")
    rows = report["rows"]
    assert len(rows) == 4 and events == ["time"] * 4 + ["profile"] * 4
    assert all(r["stage1_us"] == 1.5 for r in rows) and "| stage 1 us |" in md


def test_bench_compare_rejects_a_file_that_is_not_a_bench_json(tmp_path):
    from kernels.decode_attention import bench

    bad = tmp_path / "x.json"
    bad.write_text('{"rows": [{"dtype": "bf16"}]}')
    with pytest.raises(SystemExit, match="not a decode bench JSON"):
        bench.main(["--quick", "--compare", str(bad)])
    with pytest.raises(SystemExit, match="not a decode bench JSON"):
        bench.main(["--quick", "--compare", str(tmp_path / "missing.json")])


# --- the compiled kernel (not the interpreter) ---------------------------------------------------------------

def _compile_check_rows(*args):
    """compile_check's JSON rows with --tile-loop plus args."""
    return compile_check_rows("decode_attention", "--tile-loop", *args)


@pytest.mark.slow
def test_kernel_compiles_for_sm90_and_wave64_with_every_conversion_path():
    # the interpreter runs kernels as Python: a construct only the compiler refuses (a plain Python global in a
    # kernel, a type mismatch in a loop-carried value) shows only here
    rows = _compile_check_rows()
    assert len(rows) == 7 + 3
    for r in rows:
        assert "error" not in r, r
        assert r["shared"] <= (227 * 1024 if r["target"] == "sm90" else 64 * 1024), r
        if r["target"] == "sm90":  # --tile-loop: the tile loop's matrix instructions are the kind's own
            ops = r["tile_loop"]["ops"]
            assert ("IMMA" if r["variant"].startswith("int8") else "HMMA") in ops, r
            if r["variant"] == "fp8-hw ptx":
                assert ops.get("F2FP", 0) > 0, r  # the hardware e4m3 conversions sit in the loop
        else:  # wave64: K and V in 16-byte loads, never byte by byte (int8's V by dim: the DCU entry's page loop)
            assert r["loads_1b"] == 0 and r["loads_16b"] >= 2 and r["mfma"] > 0, r


@pytest.mark.slow
def test_gluon_stage1_compiles_for_sm90_without_spills():
    # launch key gluon: the Gluon stage 1 for int8 (V by dim) and fp8 (V by token), as their caches hold V
    rows = [r for r in _compile_check_rows("--target", "sm90", "--gluon", json.dumps(GLUON_LAUNCH))
            if "gluon" in r["variant"]]
    assert [r["variant"] for r in rows] == ["int8 gluon", "fp8-sw gluon", "fp8-hw gluon"]
    for r in rows:
        assert "error" not in r, r
        assert r["spills"] == 0 and r["shared"] <= 227 * 1024, r
        ops = r["tile_loop"]["ops"]
        assert "HMMA" in ops and "LDGSTS" in ops, r  # fp16 products, the cp.async ring
        assert "LDSM" in ops, r  # P^T (and fp8's V byte pairs) by ldmatrix.trans
        # F2FP: P's fp32 -> fp16 packs in every kind, and in fp8-hw each tile's 64 KB of e4m3 codes (2 per 8 codes)
        assert (ops.get("F2FP", 0) >= 128) == r["variant"].startswith("fp8-hw"), r


def test_int8_qk_takes_its_own_path(params):
    # not a silent fallback: the int8 products round differently from the fp16 ones (outputs close, not equal)
    case = make_case([70, 45], block_size=16, hkv=2, hq=12, dtype=torch.bfloat16, kv_quant="int8", seed=9)
    params(kv8={"int8_qk": 0})
    fp16_products = run(case, num_splits=2).float()
    params(kv8={"int8_qk": 1})
    int8_products = run(case, num_splits=2).float()
    assert not torch.equal(fp16_products, int8_products)
    assert (fp16_products - int8_products).abs().max() < 4e-2


# --- launch key gluon: where the Gluon stage 1 takes a call ------------------------------------------------------

def test_gluon_stage1_covers_cuda_ptx_8bit_calls_in_their_own_v_layout_with_pages_of_a_tile():
    from kernels.decode_attention import gluon_stage1
    from kernels.decode_attention.planning import gluon_supported

    ok = dict(kv_quant=1, ptx=True, v_by_dim=False, head_dim=256, group=6, block_size=1552, block_n=128,
              num_stages=2)
    assert gluon_supported(**ok) == gluon_stage1.GLUON
    # int8 with V by dim, as int8 caches hold it
    assert gluon_supported(**{**ok, "kv_quant": 2, "v_by_dim": True}) == gluon_stage1.GLUON
    # fp8's V is read by token as byte pairs of a token's dims: head_dim contiguous; by dim keeps the Triton kernel
    for change in (dict(ptx=False), dict(kv_quant=2), dict(kv_quant=0), dict(head_dim=96),
                   dict(head_dim=128), dict(group=17), dict(block_size=64), dict(block_size=1560), dict(block_n=32),
                   dict(num_stages=1), dict(v_by_dim=True), dict(v_dim_stride=2)):
        assert not gluon_supported(**{**ok, **change}), change


def test_gluon_without_the_balanced_plan_is_refused_naming_the_fix():
    # Triton 3.6 does not compile the Gluon stage 1 with BALANCE off (an LLVM assertion, found by the tuning command's
    # sweep on the H200 and reproduced by compile_check on the CPU): refused when the entry is read, not at a launch
    with pytest.raises(ValueError, match=r"kv8.gluon \(the Gluon stage 1\) needs kv8.balance 1; set kv8.gluon null"):
        launch_params.get_params("sm90", override='{"balance": 0}')
    assert launch_params.get_params("sm90", override='{"balance": 0, "kv8": {"gluon": null}}')["kv8"]["balance"] == 0


def test_gluon_key_off_cuda_runs_the_triton_kernel(params, monkeypatch):
    # the interpreter has no PTX conversions, so the key leaves every call to the Triton kernel, which still matches
    from kernels.decode_attention import gluon_stage1

    calls = []
    monkeypatch.setattr(gluon_stage1, "launch_gluon_stage1", lambda *a, **k: calls.append(k))
    params(kv8={"gluon": GLUON_LAUNCH, "balance": 1})  # the Gluon stage 1 takes the balanced plan only
    case = make_case([70, 45], block_size=32, hkv=2, hq=12, dtype=torch.bfloat16, kv_quant="fp8", seed=9)
    assert_close(run(case, num_splits=2), reference(case), torch.bfloat16)
    assert not calls


def test_gluon_launch_has_its_own_split_plan_and_the_workspace_holds_both(params):
    # the gluon object's programs_per_cu is the Gluon stage 1's own plan (the 8-bit calls it takes); the workspace a
    # graph preallocates must hold that plan and the Triton kernel's (the calls it does not cover: short pages, ...)
    da = importlib.import_module("kernels.decode_attention.planning")
    cpu = torch.device("cpu")
    params()
    without = workspace_numel(4, 24, 4, 256, cpu, kv8=True)
    params(kv8={"gluon": {**GLUON_LAUNCH, "programs_per_cu": 64}, "balance": 1})
    triton_plan = da.split_plan(4, 24, 4, 256, cpu, None, True)
    gluon_plan = da.split_plan(4, 24, 4, 256, cpu, None, True, gluon=True)
    assert gluon_plan.launch["BLOCK_N"] == 128 and "gluon" not in gluon_plan.launch
    assert triton_plan.launch["BLOCK_N"] != 128 and gluon_plan.rows(4) > triton_plan.rows(4)
    both = workspace_numel(4, 24, 4, 256, cpu, kv8=True)
    assert both == max(triton_plan.numel(4, 24, 256), gluon_plan.numel(4, 24, 256)) > without
