"""Split-KV decode attention on a GPU at Qwen3.5-27B shapes (24 q / 4 kv heads x 256).

Against the float32 torch reference: every block size the hybrid cache produces, ragged context
lengths, bf16 / fp8 (hardware and software decode) / int8 per-token-head caches; CUDA-graph replay
with changing context lengths; one compiled kernel for every batch size. 8-bit caches across the value
range (|V| 1e-6..1e5, V magnitudes changing between tiles and splits, |V| 1e37 and all-zero tiles,
|K| up to 6e4) against a float64 reference on the dequantized cache, PTX and portable conversions.
"""
import importlib
import json

import pytest
import torch
import triton
import triton.language as tl

from kernels.decode_attention import decode_attention, launch_params, workspace_numel
from kernels.decode_attention.codes import codes_to_f16
from kernels.decode_attention.triton_kernels import _decode_split_kernel, _merge_splits_kernel
from kernels.decode_attention.reference import paged_decode_reference
from kernels.kv_quant.reference import quantized_paged_cache
from tests.attention_checks import assert_rel_close, v_by_dim, v_by_token

pytestmark = pytest.mark.gpu
planning = importlib.import_module("kernels.decode_attention.planning")  # PTX_CONVERSIONS: the launch decision reads it
# these tests are the Triton stage 1's (the DCU's kernel): sm90's kv8 entry sends int8 and fp8 calls to the Gluon
# stage 1, so every test here drops that key; tests/gpu/test_decode_attention_gluon_gpu.py tests the Gluon one
TRITON_STAGE1 = {"kv8": {"gluon": None}}


def set_params(monkeypatch, params=None):
    """VLLM_DCU_DECODE_PARAMS = params with the Gluon key dropped (kv8.gluon null)."""
    params = dict(params or {})
    params["kv8"] = {**params.get("kv8", {}), **TRITON_STAGE1["kv8"]}
    monkeypatch.setenv(launch_params.ENV_VAR, json.dumps(params))


@pytest.fixture(autouse=True)
def _triton_stage1(monkeypatch):
    set_params(monkeypatch)

HQ, HKV, D = 24, 4, 256
DEV = "cuda"


def make_case(lens, block_size, kv_quant=None, seed=0, table_width=None, k_mag=2.0, v_mag=1.0, kv_fn=None):
    """``kv_fn(q, k, v, table)`` may edit q (float32), k and v (float32 [num_blocks, block_size, HKV, D]) in
    place before they are stored."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    nblk = [(n + block_size - 1) // block_size for n in lens]
    num_blocks = sum(nblk) + 3
    order = torch.randperm(num_blocks, device=DEV, generator=g).to(torch.int32)
    # vLLM's block table has a fixed width (max blocks per request); entries past a sequence are -1
    table = torch.full((len(lens), table_width or max(nblk) + 2), -1, dtype=torch.int32, device=DEV)
    used = 0
    for b, n in enumerate(nblk):
        table[b, :n] = order[used : used + n]
        used += n
    q = torch.randn(len(lens), HQ, D, device=DEV, generator=g)
    k = torch.randn(num_blocks, block_size, HKV, D, device=DEV, generator=g) * k_mag
    v = torch.randn(num_blocks, block_size, HKV, D, device=DEV, generator=g) * v_mag
    if kv_fn is not None:
        kv_fn(q, k, v, table)
    q = q.to(torch.bfloat16)
    case = dict(q=q, block_table=table, seq_lens=torch.tensor(lens, dtype=torch.int32, device=DEV), scale=D**-0.5)
    if kv_quant is None:
        kv = torch.stack([k, v], dim=1).to(torch.bfloat16)
        case.update(k_cache=kv[:, 0], v_cache=kv[:, 1])
    else:
        views = quantized_paged_cache(k, v, kv_quant)
        case.update(k_cache=views[0], v_cache=views[1], k_scales=views[2], v_scales=views[3], kv_quant=kv_quant)
    return case


def run(case, out=None, **kw):
    out = torch.full_like(case["q"], float("nan")) if out is None else out
    extra = {k: case[k] for k in ("k_scales", "v_scales", "kv_quant") if k in case}
    decode_attention(case["q"], case["k_cache"], case["v_cache"], case["block_table"], case["seq_lens"],
                     case["scale"], out, **extra, **kw)
    return out


def check(out, case):
    kw = {k: case[k] for k in ("k_scales", "v_scales", "kv_quant") if k in case}
    want = paged_decode_reference(case["q"], case["k_cache"], case["v_cache"], case["block_table"],
                                  case["seq_lens"], case["scale"], dtype=torch.float32, **kw)
    err = out.float() - want
    assert torch.isfinite(out).all()
    max_abs, rel = err.abs().max().item(), (err.norm() / want.norm()).item()
    assert max_abs < 4e-2 and rel < 1e-2, f"max abs {max_abs}, relative {rel}"


LENS = [1, 777, 5000, 16385, 3]


@pytest.mark.parametrize("block_size", [16, 784, 1552, 1568])
def test_bf16_cache_at_every_hybrid_block_size(block_size):
    case = make_case(LENS, block_size)
    check(run(case), case)


@pytest.mark.parametrize("kv_quant,software", [("fp8", False), ("fp8", True), ("int8", False)])
@pytest.mark.parametrize("block_size", [784, 1552])
def test_quantized_cache_matches_reference(kv_quant, software, block_size):
    case = make_case(LENS, block_size, kv_quant=kv_quant)
    check(run(case, software_fp8=software), case)


def test_software_and_hardware_fp8_decode_agree_bit_for_bit():
    case = make_case([4000, 99], 1552, kv_quant="fp8")
    assert torch.equal(run(case, software_fp8=True), run(case, software_fp8=False))


@pytest.mark.parametrize("num_splits", [1, 7, 200])
def test_forced_split_counts_agree_with_reference(num_splits):
    case = make_case([40000, 17, 900], 784)
    check(run(case, num_splits=num_splits), case)


def replay_steps(case, steps, kv8=False):
    """Capture one call in a CUDA graph at seq_lens 1 (as vLLM captures), then replay it for each (seq_lens,
    block_table) of ``steps`` and check each output against the reference; returns the last output."""
    batch = case["q"].shape[0]
    ws = torch.empty(workspace_numel(batch, HQ, HKV, D, DEV, kv8=kv8), dtype=torch.float32, device=DEV)
    out = torch.empty_like(case["q"])
    case["seq_lens"].fill_(1)
    run(case, out=out, workspace=ws)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(case, out=out, workspace=ws)
    for lens, table in steps:
        case["seq_lens"].copy_(lens)
        case["block_table"].copy_(table)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(out, case)
    return out


def test_cuda_graph_replay_stays_correct_when_context_lengths_change():
    case = make_case([30000, 12000, 800, 5], 784)  # rows of 39, 16, 2 and 1 pages
    real_lens, real_table = case["seq_lens"].clone(), case["block_table"].clone()
    # second step: sequences move between batch slots (their block-table rows move with them, as in
    # vLLM's persistent batch), one slot is padding, lengths grow within their pages
    moved = real_table[[3, 1, 0, 2]]
    out = replay_steps(case, ((real_lens, real_table),
                              (torch.tensor([5, 0, 30001, 784], dtype=torch.int32, device=DEV), moved)))
    assert torch.equal(out[1], torch.zeros_like(out[1]))


@pytest.mark.parametrize("kv_quant", [None, "int8", "fp8"])
def test_balanced_plan_follows_the_lengths_of_each_replay(monkeypatch, kv_quant):
    # launch key balance: a graph captured at seq_lens 1 shares the programs out by the lengths it replays with: one
    # long sequence among short ones, then the long one moved, one slot padded and the rest grown
    set_params(monkeypatch, {"balance": 1})
    case = make_case([40000, 700, 3000, 5, 1552, 9000], 784, kv_quant=kv_quant, seed=5)
    check(run(case), case)
    real_lens, real_table = case["seq_lens"].clone(), case["block_table"].clone()
    moved = real_table[[1, 0, 2, 3, 4, 5]]
    out = replay_steps(case, ((real_lens, real_table),
                              (torch.tensor([700, 40000, 0, 5, 1553, 9001], dtype=torch.int32, device=DEV), moved)),
                       kv8=kv_quant is not None)
    assert torch.equal(out[2], torch.zeros_like(out[2]))


def _compiled(kernel):
    return sum(len(cache[0]) for cache in kernel.device_caches.values())


def test_one_compiled_kernel_serves_every_batch_size():
    run(make_case([3000], 784, table_width=64))
    before = (_compiled(_decode_split_kernel), _compiled(_merge_splits_kernel))
    for batch in (2, 3, 16, 17, 64, 200):
        run(make_case([100 + 37 * i for i in range(batch)], 784, table_width=64))
    assert (_compiled(_decode_split_kernel), _compiled(_merge_splits_kernel)) == before


@pytest.mark.parametrize("kv_quant,software", [("fp8", False), ("fp8", True), ("int8", False)])
def test_ptx_code_conversions_agree_with_the_portable_triton_ones(monkeypatch, kv_quant, software):
    # CUDA converts codes with inline PTX; the DCU runs the portable Triton ops: same fp16 values
    case = make_case([7000, 1553, 20], 1552, kv_quant=kv_quant, seed=4)
    ptx = run(case, software_fp8=software)
    monkeypatch.setattr(planning, "PTX_CONVERSIONS", False)
    portable = run(case, software_fp8=software)
    check(portable, case)
    assert (ptx.float() - portable.float()).abs().max().item() <= 2e-3


@pytest.mark.parametrize("kv_quant,software", [("fp8", False), ("fp8", True), ("int8", False)])
@pytest.mark.parametrize("early_convert", [0, 1, 2])
def test_every_placement_of_the_code_conversion_matches_reference(monkeypatch, kv_quant, software, early_convert):
    set_params(monkeypatch, {"kv8": {"early_convert": early_convert}})
    case = make_case([5000, 1553, 3], 1552, kv_quant=kv_quant, seed=7)
    check(run(case, software_fp8=software), case)


@pytest.mark.parametrize("kv_quant,software", [(None, False), ("fp8", False), ("fp8", True)])
@pytest.mark.parametrize("early_convert", [0, 1, 2])
def test_v_stored_by_dim_gives_the_same_output_as_by_token(monkeypatch, kv_quant, software, early_convert):
    # pages holding V as [kv heads, head_dim, block_size] (tokens contiguous), read through V's head_dim stride: the
    # fp16 products give the same bits (int8 caches hold V by dim and take their own path: the test below), on the
    # entry's plan (balance included: with the clamped rows fp8 V by dim once compiled a store past a shared-memory
    # allocation there, found by compute-sanitizer)
    set_params(monkeypatch, {"kv8": {"early_convert": early_convert}})
    case = make_case([5000, 1553, 3], 1552, kv_quant=kv_quant, seed=8)
    want = run(case, software_fp8=software)
    by_dim = dict(case, v_cache=v_by_dim(case["v_cache"]))
    assert by_dim["v_cache"].stride(1) == 1
    assert torch.equal(run(by_dim, software_fp8=software), want)
    check(want, case)


@pytest.mark.parametrize("kv_quant,v_dim_convert", [(None, None), ("fp8", None), ("int8", None), ("fp8", 0),
                                                    ("fp8", 1)])
def test_garbage_past_the_end_of_the_last_page_never_reaches_the_output(monkeypatch, kv_quant, v_dim_convert):
    # rows past seq_len re-read the last token instead of being masked: NaN (bf16) or NaN-code (fp8
    # 0x7f) garbage in the unused slots of the last page must not matter. v_dim_convert: fp8 V by dim with this
    # early_convert; the page loop then reads V's slots past the end themselves (contiguous tiles), where the
    # hardware e4m3 decode would turn 0x7f into NaN (the interpreter's decode gives 480, so only a GPU sees it)
    if v_dim_convert is not None:
        set_params(monkeypatch, {"kv8": {"early_convert": v_dim_convert}})
    lens = [1000, 1553, 17]
    case = make_case(lens, 784 if kv_quant is None else 1552, kv_quant=kv_quant, seed=5)
    bs = case["k_cache"].shape[1]
    for b, n in enumerate(lens):
        page = case["block_table"][b, (n - 1) // bs]
        for cache in (case["k_cache"], case["v_cache"]):
            cache[page, (n - 1) % bs + 1 :] = float("nan") if kv_quant is None else 0x7F
        if kv_quant is not None:
            for scales in (case["k_scales"], case["v_scales"]):
                scales[page, (n - 1) % bs + 1 :] = float("nan")
    if v_dim_convert is not None:
        case["v_cache"] = v_by_dim(case["v_cache"])
    check(run(case, software_fp8=False), case)


@pytest.mark.parametrize("kv_quant", ["fp8", "int8"])
@pytest.mark.parametrize("q_scale", [3e4, 1e-4])
def test_8bit_caches_take_queries_beyond_fp16_range(kv_quant, q_scale):
    # 8-bit caches multiply in fp16: q is scaled by a power of two into range first
    case = make_case([3000, 90], 1552, kv_quant=kv_quant, seed=6)
    case["q"] = (case["q"].float() * q_scale).to(torch.bfloat16)
    case["scale"] = D**-0.5 / q_scale
    check(run(case), case)


# --- 8-bit caches across the value range (issue #15) ---------------------------------------------------
# Target: within 1e-2 (error norm / reference norm, per sequence) of a float64 reference on the dequantized cache
# (quantization error not counted; bf16 output rounding is ~3e-3) for |V| anywhere in 1e-6..1e5 and |K| up to 6e4,
# int8 and fp8 (hardware and software e4m3 decode), CUDA's PTX conversions and the portable ones the DCU runs.
KV8 = [("int8", False), ("fp8", False), ("fp8", True)]
KV8_IDS = ["int8", "fp8-hw", "fp8-sw"]


def check_rel(out, case):
    kw = {k: case[k] for k in ("k_scales", "v_scales", "kv_quant") if k in case}
    want = paged_decode_reference(case["q"], case["k_cache"], case["v_cache"], case["block_table"],
                                  case["seq_lens"], case["scale"], dtype=torch.float64, **kw)
    assert_rel_close(out, want)


@pytest.mark.parametrize("kv_quant,software", KV8, ids=KV8_IDS)
@pytest.mark.parametrize("ptx", [True, False], ids=["ptx", "portable"])
@pytest.mark.parametrize("k_mag", [2.0, 6e4])
@pytest.mark.parametrize("v_mag", [1e-6, 1e5])
def test_8bit_values_across_the_range(monkeypatch, kv_quant, software, ptx, k_mag, v_mag):
    monkeypatch.setattr(planning, "PTX_CONVERSIONS", ptx)
    case = make_case([16385, 5000, 17], 1552, kv_quant=kv_quant, seed=8, k_mag=k_mag, v_mag=v_mag)
    check_rel(run(case, software_fp8=software), case)
    check_rel(run(case, software_fp8=software, num_splits=1), case)  # one program per (sequence, kv head)


@pytest.mark.parametrize("k_mag,v_mag", [(6e4, 1e5), (6e4, 1e-6)])
def test_bf16_cache_across_the_value_range(k_mag, v_mag):
    case = make_case([16385, 17], 784, seed=8, k_mag=k_mag, v_mag=v_mag)
    check_rel(run(case), case)


def _chunk_magnitudes(groups, length, chunk=64, bias=True):
    """kv_fn for make_case: sequence 0 is cut into len(groups) equal parts; in part g, its chunk c (of ``chunk``
    tokens) gets V x groups[g][c % len(groups[g])]. With ``bias``, each token's score is shifted by -ln(its
    magnitude) (q[..., 0] = 4 in every head, K[..., 0] carries the shift), so every chunk adds about as much to
    the output and one computed badly shows."""
    def fn(q, k, v, table):
        bs = k.shape[1]
        t = torch.arange(length, device=DEV)
        part = t * len(groups) // length
        c = t // chunk
        width = max(map(len, groups))
        table_m = torch.tensor([[g[i % len(g)] for i in range(width)] for g in groups], device=DEV)
        sizes = torch.tensor([len(g) for g in groups], device=DEV)
        m = table_m[part, c % sizes[part]]
        blk, slot = table[0, t // bs].long(), t % bs
        v[blk, slot] *= m[:, None, None]
        if bias:
            q[..., 0] = 4.0
            shift = torch.where(m > 0, -torch.log(m.clamp_min(1e-38)), torch.full_like(m, -30.0))
            k[blk, slot, :, 0] = (shift / (D**-0.5 * 4.0))[:, None]
    return fn


@pytest.mark.parametrize("kv_quant,software", KV8, ids=KV8_IDS)
@pytest.mark.parametrize("num_splits", [None, 2, 7])
def test_8bit_v_magnitude_changing_between_tiles_and_splits(kv_quant, software, num_splits):
    # 1e-6..1e-4 in the first half of the sequence, 1e3..1e5 in the second, changing every 64 tokens, each chunk
    # weighted to add as much as the others: acc's V factor changes between tiles of a split, and the splits'
    # partial outputs are up to 1e11 apart when the merge combines them
    n = 9000
    groups = [[1e-6, 1e-4, 1e-5, 3e-6, 5e-5], [1e5, 1e3, 3e4, 1e4, 2e3]]
    case = make_case([n, 700], 1552, kv_quant=kv_quant, seed=9, kv_fn=_chunk_magnitudes(groups, n))
    check_rel(run(case, software_fp8=software, num_splits=num_splits), case)


@pytest.mark.parametrize("kv_quant,software", KV8, ids=KV8_IDS)
def test_8bit_extreme_and_zero_v_tiles_give_finite_accurate_outputs(kv_quant, software):
    # V ~ 1e37 (near bf16's largest), all-zero V (scales 0), V ~ 1e-30 and V ~ 1 in one split: no 0/0 from a zero
    # tile and no overflow of the factor ratio (1e37 / 1e-30 is beyond float32)
    n = 4 * 512
    case = make_case([n, 33], 1552, kv_quant=kv_quant, seed=10,
                     kv_fn=_chunk_magnitudes([[1e37], [0.0], [1e-30], [1.0]], n, bias=False))
    check_rel(run(case, software_fp8=software, num_splits=1), case)
    check_rel(run(case, software_fp8=software), case)


# --- int8 caches: QK^T as int8 x int8 products (launch key int8_qk, on in sm90's entry) ------------------------------
def _rel_errors(out, want):
    return [((out[b].double() - want[b]).norm() / want[b].norm()).item() for b in range(out.shape[0])]


@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("k_mag", [2.0, 6e4])
def test_int8_qk_costs_no_accuracy_against_the_fp16_path(monkeypatch, q_dtype, k_mag):
    # both paths against one float64 reference on the dequantized cache; fp16 q and out (rounding 2^-11, not bf16's
    # 2^-8) so a difference between the paths would show above the output's rounding
    case = make_case([16385, 5000, 17], 1552, kv_quant="int8", seed=11, k_mag=k_mag)
    case["q"] = case["q"].to(q_dtype)
    kw = {k: case[k] for k in ("k_scales", "v_scales", "kv_quant")}
    want = paged_decode_reference(case["q"], case["k_cache"], case["v_cache"], case["block_table"],
                                  case["seq_lens"], case["scale"], dtype=torch.float64, **kw)
    errs = {}
    for flag in (0, 1):
        set_params(monkeypatch, {"kv8": {"int8_qk": flag}})
        out = run(case)
        assert_rel_close(out, want)
        errs[flag] = _rel_errors(out, want)
    print(f"int8 KV, q {q_dtype}, |K| ~{k_mag:g}: relative error per sequence vs float64, fp16 path "
          f"{', '.join(f'{e:.2e}' for e in errs[0])}; int8_qk {', '.join(f'{e:.2e}' for e in errs[1])}")
    for e0, e1 in zip(errs[0], errs[1]):
        assert e1 <= 1.25 * e0 + 1e-4, f"int8_qk {e1:.3g} against the fp16 path's {e0:.3g}"


# --- int8 caches hold V by dim: P x V as int8 x int8 products (INT8_PV) --------------------------------------------
@pytest.mark.parametrize("q_dtype,v_mag", [(torch.float16, 1.0), (torch.bfloat16, 1e-6), (torch.bfloat16, 1e5)],
                         ids=["fp16", "bf16-small-v", "bf16-large-v"])
@pytest.mark.parametrize("k_mag", [2.0, 6e4])
def test_int8_pv_costs_no_accuracy_against_the_fp16_path(q_dtype, v_mag, k_mag):
    # the cache's V (by dim) takes the int8 x int8 P x V path, a by-token copy of it the fp16 path; both against one
    # float64 reference on the dequantized cache. fp16 q and out where the outputs fit fp16 (rounding 2^-11, so a
    # difference between the paths would show above the output's rounding), bf16 for |V| 1e-6 and 1e5
    case = make_case([16385, 5000, 17], 1552, kv_quant="int8", seed=13, k_mag=k_mag, v_mag=v_mag)
    case["q"] = case["q"].to(q_dtype)
    assert case["v_cache"].stride(1) == 1
    kw = {k: case[k] for k in ("k_scales", "v_scales", "kv_quant")}
    want = paged_decode_reference(case["q"], case["k_cache"], case["v_cache"], case["block_table"],
                                  case["seq_lens"], case["scale"], dtype=torch.float64, **kw)
    errs = {}
    for path, c in (("fp16", dict(case, v_cache=v_by_token(case["v_cache"]))), ("int8", case)):
        out = run(c)
        assert_rel_close(out, want)
        errs[path] = _rel_errors(out, want)
    print(f"int8 KV, q {q_dtype}, |K| ~{k_mag:g}, |V| ~{v_mag:g}: relative error per sequence vs float64, fp16 P x V "
          f"{', '.join(f'{e:.2e}' for e in errs['fp16'])}; int8 P x V {', '.join(f'{e:.2e}' for e in errs['int8'])}")
    for e0, e1 in zip(errs["fp16"], errs["int8"]):
        assert e1 <= 1.25 * e0 + 1e-4, f"int8 P x V {e1:.3g} against the fp16 path's {e0:.3g}"


@triton.jit
def _convert_kernel(codes_ptr, out_ptr, KV_QUANT: tl.constexpr, SOFTWARE: tl.constexpr, PTX: tl.constexpr):
    offs = tl.arange(0, 256)
    codes = tl.load(codes_ptr + offs[None, :])
    tl.store(out_ptr + offs[None, :], codes_to_f16(codes, KV_QUANT, SOFTWARE, PTX))


@pytest.mark.parametrize("kv_quant,software", [("fp8", False), ("fp8", True), ("int8", False)])
@pytest.mark.parametrize("ptx", [True, False])
def test_every_code_converts_exactly_to_fp16(kv_quant, software, ptx):
    codes = torch.arange(256, dtype=torch.uint8, device=DEV)
    out = torch.empty(256, dtype=torch.float16, device=DEV)
    _convert_kernel[(1,)](codes, out, KV_QUANT=1 if kv_quant == "fp8" else 2, SOFTWARE=software, PTX=ptx, num_warps=1)
    if kv_quant == "fp8":
        want = codes.view(torch.float8_e4m3fn).float() / 256
        finite = (codes & 0x7F) != 0x7F
        assert torch.equal(out.float()[finite], want[finite])
    else:
        assert torch.equal(out.float(), codes.view(torch.int8).float() / 128)
