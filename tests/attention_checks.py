"""Checks and cases the decode and prefill attention tests share (CPU interpreter and GPU alike): importing this
module sets nothing up (no TRITON_INTERPRET), so the GPU tests use it too."""
import contextlib

import numpy as np
import torch


def assert_rel_close(out, want, rel_tol=1e-2, worst_tol=2e-2):
    """Finite, and per sequence (first dim): error norm / reference norm < rel_tol and the largest error <
    worst_tol x max |reference| (scale-free, per sequence: outputs span 1e-6 to 1e37 and may differ between
    sequences)."""
    assert torch.isfinite(out).all(), "non-finite output"
    for b in range(out.shape[0]):
        err = out[b].double() - want[b]
        rel = (err.norm() / want[b].norm()).item()
        worst = (err.abs().max() / want[b].abs().max()).item()
        assert rel < rel_tol and worst < worst_tol, \
            f"sequence {b}: relative {rel:.3g} (limit {rel_tol}), worst {worst:.3g} (limit {worst_tol})"


@contextlib.contextmanager
def subnormals_flushed():
    """float32 subnormals flushed to zero in this thread (x86 FTZ/DAZ, which numpy and so Triton's interpreter
    obey), as GPUs flush them in the kernels' exponentials and products; the interpreter keeps them otherwise."""
    if not torch.set_flush_denormal(True):
        raise AssertionError("this CPU cannot flush subnormals (torch.set_flush_denormal); the test needs x86 FTZ/DAZ")
    try:
        assert np.float32(1e-39) * np.float32(1.0) == 0.0
        yield
    finally:
        torch.set_flush_denormal(False)


def huge_v_keys_below_the_max(d, block_size=16):
    """kv_fn for make_case (sequence 0, >= 256 tokens): V x 1e37 and keys 1..255 ~8 nats below key 0 (q[..., 0] = 4,
    K[..., 0] carries the shift). log2 of the 8-bit V factor is then ~115, so exp2(score - m) of those keys falls
    under float32's normal range while P x factor does not: a kernel that derives P x factor or l from the former
    loses ~8% of the probability mass where subnormals flush (3% error on the H200, 2026-12-02)."""
    def fn(q, k, v, table):
        v.mul_(1e37)
        q[..., 0] = 4.0
        for t in range(1, 256):
            page, slot = divmod(t, block_size)
            k[int(table[0, page]), slot, :, 0] = -8.0 / (d**-0.5 * 4.0)
        k[int(table[0, 0]), 0, :, 0] = 0.0
    return fn


def v_by_dim(v_cache):
    """A copy of ``v_cache`` whose pages hold V by dim ([num_blocks, kv heads, head_dim, block_size] in memory, tokens
    contiguous), seen through the same [num_blocks, block_size, kv heads, head_dim] indexing."""
    return v_cache.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)


def v_by_token(v_cache):
    """A copy of ``v_cache`` whose pages hold V by token ([num_blocks, block_size, kv heads, head_dim] in memory,
    head_dim contiguous): an int8 cache's V (by dim) as fp8 and bf16 caches store theirs."""
    return v_cache.contiguous()


def shuffled_block_table(seq_lens, block_size, g, spare=1):
    """(block table, number of blocks) for sequences of these lengths on pages in a random order (generator g's
    device), with ``spare`` pages no sequence uses and one unused column past the longest sequence's pages."""
    pages = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(pages) + spare
    order = torch.randperm(num_blocks, device=g.device, generator=g).to(torch.int32)
    table = torch.zeros(len(seq_lens), max(pages) + 1, dtype=torch.int32, device=g.device)
    used = 0
    for i, n in enumerate(pages):
        table[i, :n] = order[used : used + n]
        used += n
    return table, num_blocks
