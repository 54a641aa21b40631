"""How a sequence's KV is cut into tiles and splits, as device code: what the Triton stage 1, the Gluon stage 1
(gluon_stage1.py) and stage 2 share, so all three walk the same plan (the host's half is planning.py).

The grid is (batch, kv heads, max_splits) with max_splits chosen on the host from the batch size
and the number of compute units only; each program computes its own split range from its
sequence's length (launch key even_splits: the tiles spread evenly over min(wanted, tiles) splits; else
cdiv(tiles, wanted) tiles per split, which can leave wanted splits without work). So nothing is read back from
the device and a captured CUDA/HIP graph is valid for any context length.
Launch key balance (batch > 1): the same number of programs, shared out by length. The grid is (programs + batch, kv
heads); each program reads every sequence's length, once for a batch of up to 256 (_balanced_split_in_one; larger
batches chunk by chunk, _balanced_share), works out the batch's tiles and each sequence's part of the programs (rounded
up, the parts scaled down where rounding would start a second wave, _share_within) and finds its sequence and split by
a prefix sum (balanced_split_of); each sequence's first program hands stage 2 its first workspace row and split count
through the workspace.
Without it every sequence gets as many splits as the longest, so one long request among short ones runs on a few
programs while the rest of the chip idles (H200, one 32K among 4K ones: 2-4x the time with it).

kv_rows: the (physical page, slot) of each token of a tile, for the kernels that walk tiles across pages (the decode
stage 1 without page_loop, the prefill kernel).
"""
import triton
import triton.language as tl

BLOCK_H = 16  # q rows per tile: smallest tl.dot M; holds GQA groups up to 16


@triton.jit
def num_tiles(seq_len, block_size, BLOCK_N: tl.constexpr, PAGE_LOOP: tl.constexpr):
    """KV tiles of one sequence. PAGE_LOOP: tiles never cross a page, cdiv(block_size, BLOCK_N) of them per page
    (a page's last tile ends at the page's end, overlapping the one before)."""
    if PAGE_LOOP:
        last_page = (seq_len - 1) // block_size
        return last_page * tl.cdiv(block_size, BLOCK_N) + (seq_len - 1 - last_page * block_size) // BLOCK_N + 1
    else:
        return tl.cdiv(seq_len, BLOCK_N)


@triton.jit
def split_range(seq_len, n_tiles, max_splits, min_split_tokens, EVEN: tl.constexpr):
    """Tiles per split and number of non-empty splits of one sequence (both stages agree). EVEN (launch key
    even_splits): min(wanted, tiles) splits, the first n_tiles % n_splits of them one tile longer than the
    returned count (split_tiles); else every split takes cdiv(tiles, wanted) tiles, which can leave fewer splits
    than wanted with work (137 tiles over 66 wanted splits: 46 of 3 tiles)."""
    want = tl.maximum(tl.minimum(tl.cdiv(seq_len, min_split_tokens), max_splits), 1)
    if EVEN:
        n_splits = tl.maximum(tl.minimum(want, n_tiles), 1)
        return n_tiles // n_splits, n_splits
    else:
        tiles_per_split = tl.maximum(tl.cdiv(n_tiles, want), 1)
        return tiles_per_split, tl.cdiv(n_tiles, tiles_per_split)


@triton.jit
def split_tiles(split, tiles_per_split, n_splits, n_tiles, EVEN: tl.constexpr):
    """[first, end) tiles of one split under split_range's plan."""
    if EVEN:
        longer = n_tiles - tiles_per_split * n_splits  # the first `longer` splits take one tile more
        start = split * tiles_per_split + tl.minimum(split, longer)
        return start, start + tiles_per_split + (split < longer).to(tl.int32)
    else:
        start = split * tiles_per_split
        return start, tl.minimum(start + tiles_per_split, n_tiles)


@triton.jit
def _balanced_tiles(lens, block_size, BLOCK_N: tl.constexpr, PAGE_LOOP: tl.constexpr):
    """Tiles of each sequence of a chunk of the batch (0 for a padded slot or past the batch: length 0)."""
    return tl.where(lens > 0, num_tiles(tl.maximum(lens, 1), block_size, BLOCK_N, PAGE_LOOP), 0)


@triton.jit
def _balanced_splits(lens, tiles, total, share, max_splits, min_split_tokens):
    """Launch key balance: splits of each sequence, its part of ``share`` programs rounded up, cdiv(share x its tiles,
    the batch's tiles) (no split longer than tiles / share; equal lengths get share / batch each), capped by its tiles,
    max_splits and cdiv(length, min_split_tokens) as the plan without balance is; at least 1 (a padded slot's one
    program writes its zeros). Its tiles spread over them as even_splits spreads them. share x tiles stays far inside
    int32 (share ~ a few hundred, tiles <= 2^16 at 1M tokens)."""
    want = tl.minimum(tl.minimum(tl.cdiv(share * tiles, total), tiles),
                      tl.minimum(tl.cdiv(lens, min_split_tokens), max_splits))
    return tl.maximum(want, 1)


@triton.jit
def _share_within(need, programs):
    """Launch key balance: the programs the sequences' parts are taken of, given the ``need`` their parts of
    ``programs`` add up to once rounded up: ``programs``, or less the overflow (at least 1) where they exceed it
    (_balanced_share says why)."""
    return tl.where(need > programs, tl.maximum(2 * programs - need, 1), programs)


@triton.jit
def _balanced_share(seq_lens_ptr, batch, programs, max_splits, min_split_tokens, block_size, offs,
                    BLOCK_N: tl.constexpr, PAGE_LOOP: tl.constexpr, CHUNK: tl.constexpr):
    """Launch key balance: (the batch's tiles, the programs its sequences' parts are taken of). Rounding each part up
    adds up to one program per sequence beyond ``programs`` (as many as the plan without balance launches), and
    those start a second wave (H200, 16 x 16-32K int8: 1.23x the time without balance), so where they overflow, the
    parts are taken of ``programs`` less the overflow (at least 1). The launch has programs + batch per kv head.
    offs: tl.arange(0, CHUNK). (Scalars start as batch * 0: an int32 with no layout, as the Gluon stage 1 needs.)"""
    total = batch * 0
    for b0 in range(0, batch, CHUNK):
        lens = tl.load(seq_lens_ptr + b0 + offs, mask=b0 + offs < batch, other=0)
        total += tl.sum(_balanced_tiles(lens, block_size, BLOCK_N, PAGE_LOOP))
    total = tl.maximum(total, 1)
    need = batch * 0
    for b0 in range(0, batch, CHUNK):
        valid = b0 + offs < batch
        lens = tl.load(seq_lens_ptr + b0 + offs, mask=valid, other=0)
        counts = _balanced_splits(lens, _balanced_tiles(lens, block_size, BLOCK_N, PAGE_LOOP), total, programs,
                                  max_splits, min_split_tokens)
        need += tl.sum(tl.where(valid, counts, 0))
    return total, _share_within(need, programs)


@triton.jit
def _add3(a0, a1, a2, b0, b1, b2):
    return a0 + b0, a1 + b1, a2 + b2


@triton.jit
def _balanced_split_in_one(program, seq_lens_ptr, batch, programs, max_splits, min_split_tokens, block_size, offs,
                           BLOCK_N: tl.constexpr, PAGE_LOOP: tl.constexpr):
    """balanced_split_of for a batch of up to len(offs) sequences (offs: tl.arange(0, WIDTH)): the lengths are read
    once and every pass runs on those registers. (A second, 32-wide copy for batches up to 32 spilled registers into
    the 8-bit kernels' main loop: 1.05-1.07x their time, batch 1 included; H200,
    bench/results/2026-12-04-h200-balance-plan-handoff.md.)"""
    valid = offs < batch
    lens = tl.load(seq_lens_ptr + offs, mask=valid, other=0)
    tiles = _balanced_tiles(lens, block_size, BLOCK_N, PAGE_LOOP)
    total = tl.maximum(tl.sum(tiles), 1)
    need = tl.sum(tl.where(valid, _balanced_splits(lens, tiles, total, programs, max_splits, min_split_tokens), 0))
    share = _share_within(need, programs)
    counts = tl.where(valid, _balanced_splits(lens, tiles, total, share, max_splits, min_split_tokens), 0)
    before = tl.cumsum(counts, 0) <= program  # sequences whose programs all come before this one
    n_before, first, _ = tl.reduce((before.to(tl.int32), tl.where(before, counts, 0), counts), 0, _add3)
    seq = tl.where(n_before < batch, n_before, -1)  # past the batch: every program is taken
    here = offs == n_before
    return seq, program - first, tl.sum(tl.where(here, counts, 0)), tl.sum(tl.where(here, lens, 0))


@triton.jit
def balanced_split_of(program, seq_lens_ptr, batch, programs, max_splits, min_split_tokens, block_size, offs,
                       BLOCK_N: tl.constexpr, PAGE_LOOP: tl.constexpr, CHUNK: tl.constexpr):
    """Launch key balance, stage 1: the (sequence, split, the sequence's split count, its length) that program
    ``program`` of a kv head works on. The programs of a kv head take the sequences' splits (_balanced_splits) in
    batch order, so a sequence's first split is its first workspace row. Sequence -1: no work left (the grid has
    ``programs`` + batch per kv head, each sequence's part rounding up by less than one). A batch of up to CHUNK
    (256) sequences is read once (_balanced_split_in_one), a larger one CHUNK at a time, once per pass. offs:
    tl.arange(0, CHUNK), an argument so that the Gluon stage 1 (gluon_stage1.py), whose aranges carry a layout,
    shares this code."""
    if batch <= CHUNK:
        seq, split, n_splits, seq_len = _balanced_split_in_one(program, seq_lens_ptr, batch, programs, max_splits,
                                                               min_split_tokens, block_size, offs, BLOCK_N, PAGE_LOOP)
    else:
        total, share = _balanced_share(seq_lens_ptr, batch, programs, max_splits, min_split_tokens, block_size, offs,
                                       BLOCK_N, PAGE_LOOP, CHUNK)
        seq = batch * 0 - 1
        first = batch * 0  # this sequence's first program
        taken = batch * 0  # programs taken by the chunks before this one
        for b0 in range(0, batch, CHUNK):
            valid = b0 + offs < batch
            lens = tl.load(seq_lens_ptr + b0 + offs, mask=valid, other=0)
            counts = tl.where(valid, _balanced_splits(lens, _balanced_tiles(lens, block_size, BLOCK_N, PAGE_LOOP),
                                                      total, share, max_splits, min_split_tokens), 0)
            before = tl.cumsum(counts, 0) + taken <= program
            # one reduction: how many such sequences (the index of this program's one), their programs, the chunk's
            n_before, programs_before, in_chunk = tl.reduce((before.to(tl.int32), tl.where(before, counts, 0),
                                                             counts), 0, _add3)
            hit = (n_before < CHUNK) & (seq < 0)  # entries past the batch count 0 programs: a hit is a sequence
            seq = tl.where(hit, b0 + n_before, seq)
            first = tl.where(hit, taken + programs_before, first)
            taken += in_chunk
        n_splits = batch * 0
        seq_len = batch * 0
        if seq >= 0:
            seq_len = tl.load(seq_lens_ptr + seq)
            n_splits = _balanced_splits(seq_len, _balanced_tiles(seq_len, block_size, BLOCK_N, PAGE_LOOP), total,
                                        share, max_splits, min_split_tokens)
        split = program - first
    return seq, split, n_splits, seq_len



@triton.jit
def kv_rows(tile, bt_row, last, block_size, offs_n, last_page, BLOCK_N: tl.constexpr,
             PAGE_GE_TILE: tl.constexpr):
    """(physical page, slot) of each token of KV tile ``tile``; tokens past ``last`` read ``last``."""
    tok = tl.minimum(tile * BLOCK_N + offs_n, last)
    if PAGE_GE_TILE:
        # a tile touches at most two pages: two scalar block-table reads, no per-token division
        page0 = (tile * BLOCK_N) // block_size
        phys0 = tl.load(bt_row + page0).to(tl.int64)
        phys1 = tl.load(bt_row + tl.minimum(page0 + 1, last_page)).to(tl.int64)
        slot = tok - page0 * block_size
        second = slot >= block_size
        slot = tl.where(second, slot - block_size, slot)
        phys = tl.where(second, phys1, phys0)
    else:
        page = tok // block_size
        slot = tok - page * block_size
        phys = tl.load(bt_row + page).to(tl.int64)
    return phys, slot
