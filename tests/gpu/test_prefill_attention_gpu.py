"""Prefill attention on a GPU at Qwen3.5-27B shapes (24 q / 4 kv heads x 256), against a float64 reference.

Chunk lengths 1, 17, 4095 and 4096; histories off the page grid; several prefills and decodes in one batch;
shuffled pages of the engine's Qwen3.5-27B sizes (784 bf16, 1552 fp8, 1664 int8; int8 at 1552 too); bf16, int8 and
fp8 (hardware and software e4m3) caches, through the 16-bit mirror and read directly, with V as the 8-bit cache
stores it (int8 by dim, fp8 by token) and copied the other way (the same output bit for bit);
finite outputs for extreme finite inputs; the router's warmup compiles the only specialization, so varied
batches afterwards compile nothing; the engine's mirror (reserved with the model) holds a sequence of
max_model_len, or startup fails naming the knobs. Tolerances as in tests/test_prefill_attention.py (P and the output are
rounded to bf16; 8-bit caches are compared on their dequantized values).
"""
import importlib

import pytest
import torch

from dcu import prefill_attention as route
from kernels.kv_quant.layout import QWEN35_27B_PAGE_TOKENS, V_BY_DIM
from kernels.kv_quant.reference import quantized_paged_cache
from kernels.prefill_attention import prefill_attention
from kernels.prefill_attention.reference import paged_prefill_reference
from tests.attention_checks import v_by_dim

pytestmark = pytest.mark.gpu
pa_module = importlib.import_module("kernels.prefill_attention.prefill_attention")

HQ, HKV, D = 24, 4, 256
DEV = "cuda"
BLOCK = {None: QWEN35_27B_PAGE_TOKENS["bf16"], "int8": QWEN35_27B_PAGE_TOKENS["int8"],
         "fp8": QWEN35_27B_PAGE_TOKENS["fp8"]}  # the engine's pages: 784, 1664, 1552


def make_case(chunks, kv_quant=None, seed=0, block_size=None, q_mag=1.0, k_mag=2.0, v_mag=1.0):
    """(chunk, history) per sequence; pages shuffled over the cache; table rows padded with -1."""
    block_size = block_size or BLOCK[kv_quant]
    g = torch.Generator(device=DEV).manual_seed(seed)
    lens = [c + h for c, h in chunks]
    nblk = [-(-n // block_size) for n in lens]
    num_blocks = sum(nblk) + 3
    order = torch.randperm(num_blocks, device=DEV, generator=g).to(torch.int32)
    table = torch.full((len(lens), max(nblk) + 2), -1, dtype=torch.int32, device=DEV)
    used = 0
    for s, n in enumerate(nblk):
        table[s, :n] = order[used : used + n]
        used += n
    cu = torch.zeros(len(chunks) + 1, dtype=torch.int32, device=DEV)
    cu[1:] = torch.cumsum(torch.tensor([c for c, _ in chunks], device=DEV), 0)
    q = (torch.randn(int(cu[-1]), HQ, D, device=DEV, generator=g) * q_mag).to(torch.bfloat16)
    k = torch.randn(num_blocks, block_size, HKV, D, device=DEV, generator=g) * k_mag
    v = torch.randn(num_blocks, block_size, HKV, D, device=DEV, generator=g) * v_mag
    case = dict(q=q, cu=cu, seq_lens=torch.tensor(lens, dtype=torch.int32, device=DEV), table=table, max_k=max(lens))
    if kv_quant is None:
        kv = torch.stack([k, v], dim=1).to(torch.bfloat16)
        case.update(k=kv[:, 0], v=kv[:, 1])
    else:
        views = quantized_paged_cache(k, v, kv_quant)
        case.update(k=views[0], v=views[1], k_scales=views[2], v_scales=views[3], kv_quant=kv_quant)
    return case


def run(case, **kw):
    out = torch.full_like(case["q"], float("nan"))
    extra = {k: case[k] for k in ("k_scales", "v_scales", "kv_quant") if k in case}
    prefill_attention(case["q"], case["k"], case["v"], out, case["cu"], case["seq_lens"], case["table"], D**-0.5,
                      max_seqlen_k=case["max_k"], **extra, **kw)
    return out


def reference(case):
    kw = {k: case[k] for k in ("k_scales", "v_scales", "kv_quant") if k in case}
    return paged_prefill_reference(case["q"], case["k"], case["v"], case["cu"], case["seq_lens"], case["table"],
                                   D**-0.5, **kw)


def check(out, case, rel_tol=1.2e-2):
    assert torch.isfinite(out).all()
    want = reference(case)
    err = out.double() - want
    rel = (err.norm() / want.norm()).item()
    worst = (err.abs().max() / want.abs().max()).item()  # largest error against the output's scale
    assert rel < rel_tol and worst < 2e-2, f"relative {rel}, max abs / max |ref| {worst}"


@pytest.mark.parametrize("chunk,history", [(4096, 0), (4096, 3000), (4095, 16384 + 5), (17, 800), (1, 2000)])
def test_bf16_chunks_match_reference(chunk, history):
    check(run(make_case([(chunk, history)])), make_case([(chunk, history)]))


@pytest.mark.parametrize("mirror", [None, 0], ids=["bf16-mirror", "direct"])
@pytest.mark.parametrize("kv_quant,software", [("int8", False), ("fp8", False), ("fp8", True)])
def test_8bit_chunks_match_dequantized_reference(kv_quant, software, mirror):
    case = make_case([(4096, 1600)], kv_quant=kv_quant, seed=1)
    check(run(case, software_fp8=software, mirror=mirror), case)


@pytest.mark.parametrize("mirror", [None, 0], ids=["bf16-mirror", "direct"])
def test_int8_on_pages_that_are_not_a_multiple_of_128_tokens(mirror):
    # 1552-token pages (int8's before patch 0002 rounded them to 128 tokens): the direct path's windows of 128
    # contiguous slots leave 16 per page, and V's dim rows start off the 128-byte lines
    case = make_case([(4096, 1600), (1, 3200)], kv_quant="int8", seed=2, block_size=1552)
    check(run(case, mirror=mirror), case)


@pytest.mark.parametrize("kv_quant,software", [("int8", False), ("fp8", False), ("fp8", True)])
def test_8bit_mirror_with_large_keys_in_a_mixed_batch(kv_quant, software):
    # |K| ~3e4 with |V| ~1e5: the long chunk through the mirror (K codes in q's bf16, page-run key tiles), beside a
    # short chunk and a decode row (the direct path)
    case = make_case([(512, 700), (30, 9), (1, 40)], kv_quant=kv_quant, seed=5, v_mag=1e5, k_mag=3e4)
    check(run(case, software_fp8=software), case, rel_tol=1e-2)


@pytest.mark.parametrize("kv_quant,mirror", [(None, None), ("int8", None), ("int8", 4096)])
def test_several_prefills_and_decodes_in_one_batch(kv_quant, mirror):
    # with a 4096-token mirror only some long chunks fit; the rest read the 8-bit cache directly
    chunks = [(1, 5000), (300, 0), (1, 17), (1999, 785), (1, 1551), (64, 64), (70, 3000)]
    case = make_case(chunks, kv_quant=kv_quant, seed=2)
    check(run(case, software_fp8=True, mirror=mirror), case)


@pytest.mark.parametrize("mirror", [None, 0], ids=["mirror", "direct"])
@pytest.mark.parametrize("kv_quant,software", [("int8", False), ("fp8", False), ("fp8", True)])
def test_8bit_v_by_token_and_by_dim_give_identical_outputs(kv_quant, software, mirror):
    # int8 caches hold V by dim (tokens contiguous; kv_quant.layout.V_BY_DIM), fp8 caches by token: the mirror kernel
    # and the direct path read V through its head_dim stride, so the same codes stored the other way give the same
    # output, except int8 V by dim on the direct path (int8 x int8 P x V, rounded differently; both within the
    # reference's bounds). The 512-token chunk takes the mirror (when on), the short chunk and the decode row the
    # direct path
    case = make_case([(512, 1600), (30, 9), (1, 40)], kv_quant=kv_quant, seed=7)
    native = case["v"]
    assert (native.stride(1) == 1) == (kv_quant in V_BY_DIM)
    other = native.contiguous() if kv_quant in V_BY_DIM else v_by_dim(native)
    assert torch.equal(other, native) and other.stride() != native.stride()
    out = run(case, software_fp8=software, mirror=mirror)
    out_other = run(dict(case, v=other), software_fp8=software, mirror=mirror)
    same = slice(0, 512 if mirror is None else 0) if kv_quant in V_BY_DIM else slice(None)
    assert torch.equal(out_other[same], out[same])
    check(out, case)
    check(out_other, case)


def test_page_size_16():
    case = make_case([(100, 333), (1, 40)], block_size=16, seed=3)
    check(run(case), case)


@pytest.mark.parametrize("kv_quant", [None, "int8", "fp8"])
def test_extreme_finite_inputs_give_finite_outputs(kv_quant):
    case = make_case([(200, 300)], kv_quant=kv_quant, seed=4, q_mag=1e19, k_mag=1e19, v_mag=1e37)
    assert torch.isfinite(run(case, software_fp8=True)).all()


@pytest.mark.parametrize("kv_quant", ["int8", "fp8"])
@pytest.mark.parametrize("v_mag", [1e-6, 1e5])
def test_8bit_values_across_the_range(kv_quant, v_mag):
    case = make_case([(512, 700)], kv_quant=kv_quant, seed=5, v_mag=v_mag, k_mag=3e4)
    check(run(case), case, rel_tol=1e-2)


@pytest.mark.parametrize("mirror", [None, 0], ids=["mirror", "direct"])
@pytest.mark.parametrize("kv_quant", ["int8", "fp8"])
def test_8bit_all_zero_v_tiles_after_large_v_stay_finite(kv_quant, mirror):
    # a whole page of all-zero V (scales 0) after |V| ~1e5: finite, and the zero-V keys keep their probability
    case = make_case([(512, 3000)], kv_quant=kv_quant, seed=6, v_mag=1e5)
    page = case["table"][0, 1]  # the second page (int8 tokens 1664-3327, fp8 1552-3103): whole key tiles of zero V
    case["v"][page].zero_()
    case["v_scales"][page].zero_()
    check(run(case, mirror=mirror), case, rel_tol=1e-2)


def _compiled():
    kernels = (pa_module._prefill_kernel, pa_module._plan_mirror_kernel, pa_module._mirror_kernel)
    return sum(len(c[0]) for k in kernels for c in k.device_caches.values())


@pytest.mark.parametrize("cache_dtype,kv_quant", [("auto", None), ("int8_per_token_head", "int8"),
                                                  ("fp8_per_token_head", "fp8")])
def test_warmup_compiles_everything_later_batches_need(monkeypatch, cache_dtype, kv_quant):
    # the engine's shape as the metadata builder passes it; then batches of every kind a server sees. The router
    # must warm this checkout's kernel module (not an installed vllm.dcu_kernels copy) for the count to mean it.
    from kernels.kv_quant import layout
    from kernels.prefill_attention import MAX_GROUP

    monkeypatch.setattr(route, "_kernels", lambda: (prefill_attention, MAX_GROUP, layout))
    route.warmup(HQ, HKV, D, torch.bfloat16, cache_dtype, BLOCK[kv_quant], DEV)
    before = _compiled()
    for i, chunks in enumerate(([(4096, 0)], [(4096, 8192)], [(37, 9000), (1, 5)], [(1, 3)] * 3 + [(4000, 33)])):
        run(make_case(chunks, kv_quant=kv_quant, seed=10 + i))
    assert _compiled() == before, "a batch after warmup compiled a new specialization"


def _router_kwargs(case):
    """unified_attention's keyword arguments for a case (what TRITON_ATTN passes the router)."""
    out = torch.full_like(case["q"], float("nan"))
    kw = dict(q=case["q"], k=case["k"], v=case["v"], out=out, cu_seqlens_q=case["cu"], max_seqlen_q=int(
        (case["cu"][1:] - case["cu"][:-1]).max()), seqused_k=case["seq_lens"], max_seqlen_k=case["max_k"],
        softmax_scale=D**-0.5, causal=True, window_size=(-1, -1), block_table=case["table"], softcap=0,
        q_descale=None, k_descale=None, v_descale=None, alibi_slopes=None, output_scale=None, qq_bias=None,
        sinks=None, mm_prefix_range=None)
    if "kv_quant" in case:
        kw.update(kv_quant=case["kv_quant"], k_scale_cache=case["k_scales"], v_scale_cache=case["v_scales"])
    return kw


def test_engine_mirror_holds_a_sequence_of_max_model_len(monkeypatch):
    # max_model_len 40000: the impl's reserve_mirror sizes the mirror at 40192 tokens (and allocates it), warmup
    # uses that size, so a 256-token chunk after 36000 tokens of history (beyond the default 32768-token mirror)
    # goes through the mirror, not the direct path
    from kernels.kv_quant import layout
    from kernels.prefill_attention import MAX_GROUP

    monkeypatch.setattr(route, "_kernels", lambda: (prefill_attention, MAX_GROUP, layout))
    monkeypatch.setattr(route, "_ENGINE_MIRROR", {})
    monkeypatch.delenv(pa_module.MIRROR_ENV, raising=False)
    monkeypatch.setattr(route, "_mirror_api", lambda: pa_module)
    assert route.reserve_mirror(HQ, HKV, D, "int8_per_token_head", max_model_len=40000) == 40192
    allocated = torch.cuda.memory_allocated()
    route.warmup(HQ, HKV, D, torch.bfloat16, "int8_per_token_head", BLOCK["int8"], DEV)  # no max_model_len: reserved
    assert route._ENGINE_MIRROR == {"tokens": 40192}
    assert torch.cuda.memory_allocated() - allocated < 64 << 20, "warmup allocated a second mirror (157 MiB)"
    case = make_case([(256, 36000)], kv_quant="int8", seed=21)
    kw = _router_kwargs(case)
    route.route_unified_attention(lambda **_: pytest.fail("reached upstream"))(**kw)
    mirrored, direct = run(case, mirror=40192), run(case, mirror=0)
    assert torch.equal(kw["out"], mirrored) and not torch.equal(kw["out"], direct)
    check(kw["out"], case)


def test_engine_mirror_that_does_not_fit_fails_at_startup_naming_the_knobs(monkeypatch):
    from kernels.kv_quant import layout
    from kernels.prefill_attention import MAX_GROUP

    monkeypatch.setattr(route, "_kernels", lambda: (prefill_attention, MAX_GROUP, layout))
    monkeypatch.setattr(route, "_mirror_api", lambda: pa_module)
    monkeypatch.setattr(route, "_ENGINE_MIRROR", {})
    monkeypatch.delenv(pa_module.MIRROR_ENV, raising=False)
    with pytest.raises(RuntimeError, match="prefill mirror .* does not fit .*VLLM_DCU_PREFILL_KV8_MIRROR_TOKENS"):
        route.reserve_mirror(HQ, HKV, D, "int8_per_token_head", max_model_len=2**30)  # as vLLM builds the model
    with pytest.raises(RuntimeError, match="prefill mirror .* does not fit .*VLLM_DCU_PREFILL_KV8_MIRROR_TOKENS"):
        route.warmup(HQ, HKV, D, torch.bfloat16, "int8_per_token_head", BLOCK["int8"], DEV, max_model_len=2**30)
    assert route._ENGINE_MIRROR == {}
