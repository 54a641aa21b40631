"""Split-KV decode attention on a GPU at Qwen3.5-27B shapes (24 q / 4 kv heads x 256).

Against the float32 torch reference: every block size the hybrid cache produces, ragged context
lengths, bf16 / fp8 (hardware and software decode) / int8 per-token-head caches; CUDA-graph replay
with changing context lengths; one compiled kernel for every batch size.
"""
import pytest
import torch

from kernels.decode_attention import decode_attention, workspace_numel
from kernels.decode_attention.decode_attention import _decode_split_kernel, _merge_splits_kernel
from kernels.decode_attention.reference import paged_decode_reference
from kernels.kv_quant.layout import kv_cache_shape, split_kv_cache
from kernels.kv_quant.reference import quantize_per_token_head

pytestmark = pytest.mark.gpu

HQ, HKV, D = 24, 4, 256
DEV = "cuda"


def make_case(lens, block_size, kv_quant=None, seed=0, table_width=None):
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
    q = torch.randn(len(lens), HQ, D, device=DEV, generator=g).to(torch.bfloat16)
    k = torch.randn(num_blocks, block_size, HKV, D, device=DEV, generator=g) * 2
    v = torch.randn(num_blocks, block_size, HKV, D, device=DEV, generator=g)
    case = dict(q=q, block_table=table, seq_lens=torch.tensor(lens, dtype=torch.int32, device=DEV), scale=D**-0.5)
    if kv_quant is None:
        kv = torch.stack([k, v], dim=1).to(torch.bfloat16)
        case.update(k_cache=kv[:, 0], v_cache=kv[:, 1])
    else:
        kv = torch.zeros(kv_cache_shape(num_blocks, block_size, HKV, D), dtype=torch.uint8, device=DEV)
        views = split_kv_cache(kv, D)
        for x, codes, scales in ((k, views[0], views[2]), (v, views[1], views[3])):
            c, s = quantize_per_token_head(x, kv_quant)
            codes.copy_(c)
            scales.copy_(s)
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


def test_cuda_graph_replay_stays_correct_when_context_lengths_change():
    case = make_case([30000, 12000, 800, 5], 784)
    real_lens = case["seq_lens"].clone()
    ws = torch.empty(workspace_numel(4, HQ, HKV, D, DEV), dtype=torch.float32, device=DEV)
    out = torch.empty_like(case["q"])
    case["seq_lens"].fill_(1)  # as vLLM captures: seq_lens 1
    run(case, out=out, workspace=ws)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(case, out=out, workspace=ws)
    for lens in (real_lens, torch.tensor([5, 0, 30001, 784], dtype=torch.int32, device=DEV)):
        case["seq_lens"].copy_(lens)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(out, case)


def _compiled(kernel):
    return sum(len(cache[0]) for cache in kernel.device_caches.values())


def test_one_compiled_kernel_serves_every_batch_size():
    run(make_case([3000], 784, table_width=64))
    before = (_compiled(_decode_split_kernel), _compiled(_merge_splits_kernel))
    for batch in (2, 3, 16, 17, 64, 200):
        run(make_case([100 + 37 * i for i in range(batch)], 784, table_width=64))
    assert (_compiled(_decode_split_kernel), _compiled(_merge_splits_kernel)) == before
