"""Stage 1 of the split-KV decode for 8-bit caches, written in Gluon (launch key ``gluon``, CUDA).

Same grid, arguments, split plan, scale arithmetic and workspace as triton_kernels._decode_split_kernel (stage 2
is shared), but the tile loop is laid out by hand where Triton's choices cost the 8-bit path its speed (issue #17):
- The products run transposed: S^T = K q^T with the keys as the mma's rows (16 per warp and m-tile) and the query
  heads as its columns (BLOCK_H = 8, or 16 for groups over 8), then O^T = V^T P^T. A decode query has one row per
  head, so a GQA group of 6 fills 6 of 8 columns instead of 6 of 16 rows: half the matrix instructions of the
  untransposed form and half the softmax arithmetic per thread.
- q^T (fp16, scaled by a power of two as the Triton kernel does) stays in registers as the B operand for the whole
  loop; Triton re-reads q from shared memory for every tile.
- Each tile's K codes (token rows), V codes and the tile's K / V scales stream through a ``num_stages``-deep ring in
  shared memory by cp.async, 16 bytes per lane, in two groups per tile (K's codes and the scales, then V's codes);
  the next tile's pages are read from the block table a page ahead, so no load's address waits on a load.
- K's codes go from shared memory straight into the A operand with 8 consecutive reduction elements per thread (one
  8-byte ld.shared; q^T takes the same k order, so the sum is unchanged), are converted there in registers (PTX
  e4m3 in hardware or with integer ops; int8 as the Triton kernel's PTX does, value / 128) and feed fp16 mma_v2
  with float32 accumulation.
- V (by token, as fp8 caches hold it): the tile's rows are read as int16 pairs of a token's (even, odd) dims by
  ldmatrix.trans straight into the standard fp16 A operand of V^T (2 consecutive tokens per thread), and one byte
  permute splits each word into the even dims' and the odd dims' codes, converted for two products of head_dim / 2
  rows (output dims 2n and 2n + 1). V by dim (int8 caches hold it so): 8 consecutive tokens per thread, as K's
  dims, in two products of head_dim / 2 rows (the halves of head_dim); a tile's 16-token runs keep its slots past
  the sequence's end (finite int8 codes; their P' is 0). P^T reaches every warp through its own small buffer
  (stmatrix, then ldmatrix into the B operand); no converted tile goes through shared memory.
- The softmax's sum is kept per thread ([BLOCK_N, BLOCK_H] in the mma layout) and reduced once after the loop; only
  the max is reduced across warps per tile; only the sequence's partial last tile masks keys.
Swizzles (K 32-byte vectors over 8 phases, V 16-byte over 8) keep the cp.async stores and the operand loads free of
bank conflicts (gl.bank_conflicts, sm90, head_dim 256).

H200 (bench/results/2026-12-04-h200-session22-gluon-entry.md, call 7), sm90's entry: BLOCK_N 128 x 4 warps x 2 stages,
one program per SM (programs_per_cu 1), against bf16 in the same run at 16-32K: fp8 0.57-0.62 / 0.46-0.50 / 0.48-0.49 /
0.53x at batch 1 / 4 / 16 / 64, hardware and software e4m3 alike (1.00-1.01x per cell); 0.80x the Triton kernel's fp8
time (geomean over 4-32K). From batch 16 it reads KV at 96-100% of the copy bandwidth; batch 1 is its fixed cost (~10 us
with stage 2, as bf16's). int8 (V by dim): 0.61-0.65 / 0.51-0.53 / 0.53-0.54 / 0.58-0.60x bf16, 0.95x the Triton
kernel's int8 x int8 path (1.00-1.02x at batch 64, where both read at 90% of the copy bandwidth: a page's 1552-token dim
rows leave each tile's 128-byte runs unaligned). The tile loop is 577 SASS instructions per thread at 8 warps for fp8 in
hardware (the untransposed form: 741, and 818 with P's layout change by convert_layout). The untransposed form with int8
was slower than the Triton kernel (0.60-0.76 with int8 codes converted, 0.60-0.72 with int8 products: 049ac1f,
bench/results/raw/2026-12-04-session21/call7). Merging in the last split's program instead of stage 2 (an atomic count
per sequence and kv head) was slower, 1.09-1.30x at batch 1: that one program's 203 KB of partials took ~7 us to read at
1 x 16K, where stage 2 spreads them over 96 programs (bench/results/2026-12-04-h200-session23.md). In the transposed
form, int8 products (the raw codes to int8 mma.sync, q and P as int8 pairs) cut int8's tile loop to 745 SASS but took
1.026x the time, the same at batch 1: there the kernel waits on memory latency (one warp per scheduler, 4.8 cycles per
instruction, Nsight Compute; same file).

Batch 1, per program (a %globaltimer timeline of every program, bench/results/2026-12-04-h200-session24.md), at 1 x 16K:
seq_len then the block table take ~1.2 us, the first tile is in shared memory ~2.9 us after its copies go out (later
tiles every ~2 us, the copy bandwidth's share), the last tile's products and the store take ~2 us, and stage 2 with the
two kernel boundaries ~3.9 us. q loads with seq_len (after the ring's first copies it had queued behind them and held
the first tile up by ~1.2 us). int8 read a tile ~20% slower than fp8 (2.4 against 2.0 us per 64 KB per program) on
1552-token pages, where each dim's 128-byte V run starts 16 x dim bytes off a line; its pages now hold a multiple of
128 tokens (kv_quant.layout.PAGE_ALIGN_TOKENS; Qwen3.5-27B 1664), 0.95x its time. A tile's copies go out as two
groups, K's codes with both scales, then V's codes, and a tile waits for its V only before P x V: its scores, softmax
and P run while V lands, which shortens the first tile's wait and the last tile's exposed products. H200, before /
after / before / after in one call (bench/results/2026-12-04-h200-session25.md): 0.93-0.97x the time at batch 1,
0.97-1.01x at batch 4-64; x bf16 at 1 x 16K: fp8 0.56, int8 0.57-0.59 (0.60-0.61 before, same call).

Where it applies (planning.gluon_supported): CUDA with PTX conversions (sm80+: cp.async, mma.sync, ldmatrix), fp8
codes with V by token (head_dim contiguous) or int8 codes with V by dim (tokens contiguous), head_dim 256 (the one
shape the GPU tests cover; 16 x num_warps <= BLOCK_N, checked with the launch key), a GQA group of at most 16, pages
of at least BLOCK_N tokens and a multiple of 16 (a 16-token run never straddles a page). Elsewhere the launcher runs
the Triton kernel. Hardware e4m3 gives the exact value (no x 2^-8), so S's factor takes 1 for the code unit and the
output 2^32 for 2^40 (acc is 2^8 x the Triton kernel's; m, l and P' are the same numbers). K rows, fp8's V rows and
scales past a sequence's end are not read (zero-filled).
"""
try:  # Triton 3.6 ships Gluon; a build without it (the DCU's, possibly) keeps the Triton kernel
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
    GLUON = True
except ImportError:  # pragma: no cover - depends on the Triton build
    GLUON = False

from .codes import (KV8_HW_OUT_FACTOR, KV8_OUT_FACTOR, L_SHIFT, PTX_E4M3_HW_EXACT, PTX_E4M3_HW_PAIRS, PTX_E4M3_SW,
                    PTX_E4M3_SW_PAIRS, PTX_INT8, pow2_fp16_scale, v_scale_log2)
from .splits import balanced_split_of, num_tiles, split_range, split_tiles


if GLUON:
    @gluon.jit
    def _cvt(codes, KV_QUANT: gl.constexpr, FP8_SOFTWARE: gl.constexpr):
        """8-bit codes -> fp16: int8 value / 128 (KV_QUANT 2), e4m3 value (hardware) or value / 256 (software)."""
        if KV_QUANT == 2:
            return gl.inline_asm_elementwise(PTX_INT8, "=r,=r,r", [codes], dtype=gl.float16, is_pure=True, pack=4)
        elif FP8_SOFTWARE:
            return gl.inline_asm_elementwise(PTX_E4M3_SW, "=r,=r,r", [codes], dtype=gl.float16, is_pure=True,
                                             pack=4)
        else:
            return gl.inline_asm_elementwise(PTX_E4M3_HW_EXACT, "=r,=r,r", [codes], dtype=gl.float16, is_pure=True,
                                             pack=4)

    @gluon.jit
    def _cvt_pairs(pairs, FP8_SOFTWARE: gl.constexpr):
        """int16 pairs of e4m3 codes (V by token: a token's even and odd dim) -> (even dims, odd dims) in fp16."""
        if FP8_SOFTWARE:
            return gl.inline_asm_elementwise(PTX_E4M3_SW_PAIRS, "=r,=r,r", [pairs], dtype=(gl.float16, gl.float16),
                                             is_pure=True, pack=2)
        else:
            return gl.inline_asm_elementwise(PTX_E4M3_HW_PAIRS, "=r,=r,r", [pairs], dtype=(gl.float16, gl.float16),
                                             is_pure=True, pack=2)

    @gluon.jit
    def _advance(tile, off, page, phys0, phys1, bt_row, last_page, block_size, BLOCK_N: gl.constexpr):
        """The next tile's place: (tile, its first slot in page ``page``, page, that page's physical page, the next
        one's, clamped to the sequence's last page). A tile touches at most two pages (block_size >= BLOCK_N); the
        block table is read once per page, a page ahead of its first use."""
        off += BLOCK_N
        if off >= block_size:
            off -= block_size
            page += 1
            phys0 = phys1
            phys1 = gl.load(bt_row + gl.minimum(page + 1, last_page)).to(gl.int64)
        return tile + 1, off, page, phys0, phys1

    @gluon.jit
    def _issue(ring, slot, tile, off, phys0, phys1, seq_len, block_size, src, lanes, BLOCK_N: gl.constexpr,
               V_BY_DIM: gl.constexpr):
        """cp.async of tile ``tile`` (first slot ``off`` of page phys0) into ring slot ``slot`` as two groups: K's codes
        and both scales (committed here), then V's codes (the caller commits), so a tile's scores and P can be worked
        out while its V lands.
        Two base addresses per tensor (the tile's part of its page and of the next one, phys1); a row takes the
        second past the page's end. Rows and scales past the sequence's last token are not read (zero-filled; their
        scores are -inf in the last tile). V by token: its rows as int16 pairs (vr: the tile's rows, vc: the row's
        pairs); V by dim (int8): 16-token runs of each dim (vr: dims, vc: the tile's slots), which keep the tile's slots
        past the sequence's end (within its last page: phys1 is clamped to it; finite int8 codes times P' = 0).
        ring, src and lanes: the kernel's tuples (the ring's buffers; the head's bases and the strides; the copies'
        index vectors)."""
        k_ring, v_ring, ks_ring, vs_ring = ring
        (k_head, v_head, ks_head, vs_head, stride_kb, stride_kt, stride_vb, stride_vt, stride_vd, stride_ksb,
         stride_kst, stride_vsb, stride_vst) = src
        kr, kc, vr, vc, sr = lanes
        split_at = block_size - off  # rows from here on lie in the next page
        n_valid = seq_len - tile * BLOCK_N  # rows before this lie in the sequence
        k_base0 = k_head + phys0 * stride_kb + off * stride_kt
        k_base1 = k_head + phys1 * stride_kb + (off - block_size) * stride_kt
        k_row = gl.where(kr >= split_at, k_base1, k_base0) + kr * stride_kt
        async_copy.async_copy_global_to_shared(k_ring.index(slot), k_row[:, None] + kc[None, :],
                                               mask=(kr < n_valid)[:, None] & (kc[None, :] >= 0))
        s_second = sr >= split_at
        s_slot = gl.where(s_second, sr - block_size, sr) + off
        async_copy.async_copy_global_to_shared(
            ks_ring.index(slot), ks_head + gl.where(s_second, phys1, phys0) * stride_ksb + s_slot * stride_kst,
            mask=sr < n_valid)
        async_copy.async_copy_global_to_shared(
            vs_ring.index(slot), vs_head + gl.where(s_second, phys1, phys0) * stride_vsb + s_slot * stride_vst,
            mask=sr < n_valid)
        async_copy.commit_group()  # the first group: K's codes and both scales (P' = P x V's scale needs them)
        if V_BY_DIM:
            v_base0 = v_head + phys0 * stride_vb + off
            v_base1 = v_head + phys1 * stride_vb + (off - block_size)
            v_col = gl.where(vc >= split_at, v_base1, v_base0) + vc
            async_copy.async_copy_global_to_shared(v_ring.index(slot), v_col[None, :] + vr[:, None] * stride_vd)
        else:
            v_base0 = v_head + phys0 * stride_vb + off * stride_vt
            v_base1 = v_head + phys1 * stride_vb + (off - block_size) * stride_vt
            v_row = (gl.where(vr >= split_at, v_base1, v_base0) + vr * stride_vt).to(gl.pointer_type(gl.int16))
            async_copy.async_copy_global_to_shared(v_ring.index(slot), v_row[:, None] + vc[None, :],
                                                   mask=(vr < n_valid)[:, None] & (vc[None, :] >= 0))

    @gluon.jit
    def _tile_step(i, tile_start, tile_end, seq_len, last_page, block_size, bt_row, qt, s_mult, acc_a, acc_b, m_i,
                   l_t, iss_tile, iss_off, iss_page, iss_phys0, iss_phys1, ring, src, lanes, offs_n, p_smem,
                   KV_QUANT: gl.constexpr, FP8_SOFTWARE: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_H: gl.constexpr,
                   NUM_STAGES: gl.constexpr, LAST: gl.constexpr, mma: gl.constexpr, V_BY_DIM: gl.constexpr):
        """Tile ``tile_start + i`` of the online softmax (ring slot i % NUM_STAGES), after issuing the copies of tile
        ``iss_tile`` (NUM_STAGES - 1 ahead) when the split has it. The products run transposed: S^T = K q^T (keys
        as the mma's rows, 16 per warp; the heads, BLOCK_H, its columns), then O^T = V^T P^T as two products of
        head_dim / 2 rows: by token a token's even dims and its odd dims (V's rows read as int16 byte pairs by
        ldmatrix.trans straight into the A operand; one byte permute splits each word), by dim (int8) the two halves
        of head_dim (8 consecutive tokens per thread, as K's dims). LAST: the sequence's partial last tile, whose
        keys past the end get -inf scores; every other tile lies wholly in the sequence. ring, src, lanes: as _issue
        takes them."""
        k_ring, v_ring, ks_ring, vs_ring = ring
        tile = tile_start + i
        slot = i % NUM_STAGES
        # two groups per tile (K, then V): all but this tile's V and the later tiles' groups
        async_copy.wait_group(2 * NUM_STAGES - 3)
        gl.thread_barrier()  # every thread's K copies of this tile landed; the slot read last iteration is free
        if iss_tile < tile_end:  # a uniform branch: the ring's lead stops at the split's end
            _issue(ring, (i + NUM_STAGES - 1) % NUM_STAGES, iss_tile, iss_off, iss_phys0, iss_phys1, seq_len,
                   block_size, src, lanes, BLOCK_N, V_BY_DIM)
        else:
            async_copy.commit_group()  # empty past the split's end: two groups per tile for wait_group's count
        async_copy.commit_group()
        iss_tile, iss_off, iss_page, iss_phys0, iss_phys1 = _advance(iss_tile, iss_off, iss_page, iss_phys0,
                                                                     iss_phys1, bt_row, last_page, block_size,
                                                                     BLOCK_N)

        a_k: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=8)
        a_v: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        b_p: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
        rows_l: gl.constexpr = gl.SliceLayout(1, mma)
        k = k_ring.index(slot).load(a_k)  # K codes [BLOCK_N, HEAD_DIM], 8 consecutive dims per thread
        k_scale = ks_ring.index(slot).load(rows_l)
        v_scale = vs_ring.index(slot).load(rows_l)
        s = mma_v2(_cvt(k, KV_QUANT, FP8_SOFTWARE), qt, gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=mma))  # S^T
        s = s * (k_scale * s_mult)[:, None]
        if LAST:
            s = gl.where((tile * BLOCK_N + offs_n < seq_len)[:, None], s, float("-inf"))
        t = s + v_scale_log2(v_scale, KV_QUANT)[:, None]
        m_new = gl.maximum(m_i, gl.max(t, axis=0))
        alpha = gl.exp2(m_i - m_new)
        l_t = l_t * alpha[None, :] + gl.exp2(s - (m_new - L_SHIFT)[None, :])
        # P^T [BLOCK_N, BLOCK_H] to every warp: through its own buffer, straight into the B operand
        p_smem.store(gl.exp2(t - m_new[None, :]).to(gl.float16))
        async_copy.wait_group(2 * NUM_STAGES - 2)  # this tile's V (the later tiles' groups may be in flight)
        gl.thread_barrier()  # P^T and every thread's V copies
        if V_BY_DIM:  # [HEAD_DIM, BLOCK_N] codes: the halves of head_dim, 8 consecutive tokens per thread
            HALF: gl.constexpr = v_ring.shape[1] // 2
            b_p8: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=8)
            pt = p_smem.load(b_p8)
            va = _cvt(v_ring.index(slot).slice(0, HALF, dim=0).load(a_k), KV_QUANT, FP8_SOFTWARE)
            vb = _cvt(v_ring.index(slot).slice(HALF, HALF, dim=0).load(a_k), KV_QUANT, FP8_SOFTWARE)
        else:
            pt = p_smem.load(b_p)
            va, vb = _cvt_pairs(v_ring.index(slot).permute([1, 0]).load(a_v), FP8_SOFTWARE)  # [HEAD_DIM / 2, BLOCK_N]
        acc_a = mma_v2(va, pt, acc_a * alpha[None, :])
        acc_b = mma_v2(vb, pt, acc_b * alpha[None, :])
        return acc_a, acc_b, m_new, l_t, iss_tile, iss_off, iss_page, iss_phys0, iss_phys1

    @gluon.jit(do_not_specialize=["max_splits", "min_split_tokens", "batch", "balance_programs"])
    def _decode_split_kernel_gluon(
        q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, block_table_ptr, seq_lens_ptr,
        out_ptr, ws_o_ptr, ws_lse_ptr, ws_plan_ptr,
        scale_log2, max_splits, min_split_tokens, block_size, num_q_heads, batch, balance_programs,
        stride_qb, stride_qh,
        stride_kb, stride_kt, stride_kh,
        stride_vb, stride_vt, stride_vh, stride_vd,
        stride_ksb, stride_kst, stride_ksh,
        stride_vsb, stride_vst, stride_vsh,
        stride_btb,
        stride_ob, stride_oh,
        GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_H: gl.constexpr,
        NUM_STAGES: gl.constexpr, NUM_WARPS: gl.constexpr, KV_QUANT: gl.constexpr, FP8_SOFTWARE: gl.constexpr,
        EVEN_SPLITS: gl.constexpr = False, BALANCE: gl.constexpr = False, BATCH_CHUNK: gl.constexpr = 256,
    ):  # fmt: skip
        V_BY_DIM: gl.constexpr = KV_QUANT == 2  # int8 caches hold V by dim, fp8 caches by token
        kv_head = gl.program_id(1)
        seq = gl.program_id(0)
        split = gl.program_id(2)
        ws_first = seq * max_splits
        # the split plan exactly as the Triton stage 1 takes it (stage 2 reads the same workspace rows)
        balanced = False
        if BALANCE:
            balanced = balance_programs > 0
        n_splits_balanced = gl.program_id(0) * 0
        seq_len_balanced = gl.program_id(0) * 0
        if balanced:
            chunk_l: gl.constexpr = gl.BlockedLayout([1], [32], [NUM_WARPS], [0])
            seq, split, n_splits_balanced, seq_len_balanced = balanced_split_of(
                gl.program_id(0), seq_lens_ptr, batch, balance_programs, max_splits, min_split_tokens, block_size,
                gl.arange(0, BATCH_CHUNK, layout=chunk_l), BLOCK_N, False, BATCH_CHUNK)
            ws_first = gl.program_id(0) - split
            if (split == 0) & (kv_head == 0) & (seq >= 0):
                gl.store(ws_plan_ptr + 2 * seq, ws_first)
                gl.store(ws_plan_ptr + 2 * seq + 1, n_splits_balanced)

        # keys (S^T's rows) and V's dims (O^T's rows) over the warps, 16 per warp and mma tile; heads the columns
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[NUM_WARPS, 1],
                                                      instr_shape=[16, 8])
        b_q: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=8)
        rows_l: gl.constexpr = gl.SliceLayout(1, mma)
        cols_l: gl.constexpr = gl.SliceLayout(0, mma)
        offs_h = gl.arange(0, BLOCK_H, layout=cols_l)
        HALF: gl.constexpr = HEAD_DIM // 2
        # O^T's rows: by token a token's even dims (acc_a) and odd dims (acc_b), by dim the two halves of head_dim
        offs_half = gl.arange(0, HALF, layout=rows_l)
        if V_BY_DIM:
            d_a = offs_half
            d_b = offs_half + HALF
        else:
            d_a = 2 * offs_half
            d_b = 2 * offs_half + 1
        h_mask = offs_h < GROUP
        q_heads = kv_head * GROUP + offs_h
        out_cols = seq * stride_ob + q_heads[None, :] * stride_oh
        hd_mask = h_mask[None, :] & (offs_half[:, None] >= 0)

        if balanced:
            if seq < 0:
                return
            seq_len = seq_len_balanced
        else:
            seq_len = gl.load(seq_lens_ptr + seq)
        # q's load goes out now, with seq_len's. Issued after the ring's first copies, it queued behind their 64 KB
        # per program and arrived after the first tile, which then waited on q's conversion (H200, batch 1 x 16K:
        # q at 5.1 us into the kernel, the first tile used at 5.3; from here q at 2.7, the tile at 4.1). H200, before /
        # after / before in one call: 0.92-0.99x the time at batch 1, 0.97-0.99x at batch 4, 0.99-1.02x from 16
        # (bench/results/2026-12-04-h200-session24.md)
        q_blk: gl.constexpr = gl.BlockedLayout([8, 1], [8, 4], [1, NUM_WARPS], [0, 1])
        qd = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(1, q_blk))
        qh = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, q_blk))
        q_raw = gl.load(q_ptr + seq * stride_qb + (kv_head * GROUP + qh)[None, :] * stride_qh + qd[:, None],
                        mask=(qh < GROUP)[None, :] & (qd[:, None] >= 0), other=0.0)
        n_tiles = num_tiles(seq_len, block_size, BLOCK_N, False)
        if balanced:
            n_splits = n_splits_balanced
            tiles_per_split = n_tiles // n_splits
        else:
            tiles_per_split, n_splits = split_range(seq_len, n_tiles, max_splits, min_split_tokens, EVEN_SPLITS)
        if seq_len <= 0:
            if split == 0:
                zero = gl.zeros([HALF, BLOCK_H], out_ptr.dtype.element_ty, mma)
                gl.store(out_ptr + out_cols + d_a[:, None], zero, mask=hd_mask)
                gl.store(out_ptr + out_cols + d_b[:, None], zero, mask=hd_mask)
            return
        if split >= n_splits:
            return
        if balanced:
            tile_start, tile_end = split_tiles(split, tiles_per_split, n_splits, n_tiles, True)
        else:
            tile_start, tile_end = split_tiles(split, tiles_per_split, n_splits, n_tiles, EVEN_SPLITS)

        # the ring: cp.async layouts (16 bytes per lane) and conflict-free swizzles
        D16: gl.constexpr = HEAD_DIM // 16
        k_blk: gl.constexpr = gl.BlockedLayout([1, 16], [32 // D16, D16], [NUM_WARPS, 1], [1, 0])
        N16: gl.constexpr = BLOCK_N // 16
        if V_BY_DIM:  # [HEAD_DIM, BLOCK_N] codes, 16 tokens per lane
            v_blk: gl.constexpr = gl.BlockedLayout([1, 16], [32 // N16, N16], [NUM_WARPS, 1], [1, 0])
        else:  # int16 pairs of a token's codes: [BLOCK_N, HEAD_DIM / 2], 8 per lane
            v_blk: gl.constexpr = gl.BlockedLayout([1, 8], [32 // D16, D16], [NUM_WARPS, 1], [1, 0])
        s_blk: gl.constexpr = gl.BlockedLayout([1], [32], [NUM_WARPS], [0])
        k_sh: gl.constexpr = gl.SwizzledSharedLayout(32, 1, 8, [1, 0])
        if V_BY_DIM:
            v_sh: gl.constexpr = gl.SwizzledSharedLayout(2 * N16, 1, 4, [1, 0])
        else:
            v_sh: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, [1, 0])  # for ldmatrix.trans, conflict-free
        s_sh: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        k_ring = gl.allocate_shared_memory(gl.uint8, [NUM_STAGES, BLOCK_N, HEAD_DIM], k_sh)
        if V_BY_DIM:
            v_ring = gl.allocate_shared_memory(gl.uint8, [NUM_STAGES, HEAD_DIM, BLOCK_N], v_sh)
        else:
            v_ring = gl.allocate_shared_memory(gl.int16, [NUM_STAGES, BLOCK_N, HALF], v_sh)
        ks_ring = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, BLOCK_N], s_sh)
        vs_ring = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, BLOCK_N], s_sh)
        p_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_N, BLOCK_H], gl.SwizzledSharedLayout(8, 1, 8, [1, 0]))
        kr = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, k_blk))
        kc = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, k_blk))
        if V_BY_DIM:
            vr = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(1, v_blk))
            vc = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, v_blk))
        else:
            vr = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, v_blk))
            vc = gl.arange(0, HALF, layout=gl.SliceLayout(0, v_blk))
        sr = gl.arange(0, BLOCK_N, layout=s_blk)

        last_page = (seq_len - 1) // block_size
        bt_row = block_table_ptr + seq * stride_btb
        k_head = k_ptr + kv_head * stride_kh
        v_head = v_ptr + kv_head * stride_vh
        ks_head = ks_ptr + kv_head * stride_ksh
        vs_head = vs_ptr + kv_head * stride_vsh
        ring = (k_ring, v_ring, ks_ring, vs_ring)
        src = (k_head, v_head, ks_head, vs_head, stride_kb, stride_kt, stride_vb, stride_vt, stride_vd, stride_ksb,
               stride_kst, stride_vsb, stride_vst)  # where a tile's bytes come from
        lanes = (kr, kc, vr, vc, sr)  # the copies' row and column indices
        # the tile to issue next and its pages (one division per program; _advance steps on from there)
        iss_tile = tile_start
        iss_page = (tile_start * BLOCK_N) // block_size
        iss_off = tile_start * BLOCK_N - iss_page * block_size
        iss_phys0 = gl.load(bt_row + iss_page).to(gl.int64)
        iss_phys1 = gl.load(bt_row + gl.minimum(iss_page + 1, last_page)).to(gl.int64)
        # prologue: the ring's first NUM_STAGES - 1 tiles
        for st in gl.static_range(NUM_STAGES - 1):
            if iss_tile < tile_end:
                _issue(ring, st, iss_tile, iss_off, iss_phys0, iss_phys1, seq_len, block_size, src, lanes, BLOCK_N,
                       V_BY_DIM)
            else:
                async_copy.commit_group()
            async_copy.commit_group()
            iss_tile, iss_off, iss_page, iss_phys0, iss_phys1 = _advance(iss_tile, iss_off, iss_page, iss_phys0,
                                                                         iss_phys1, bt_row, last_page, block_size,
                                                                         BLOCK_N)

        # q^T: fp16 scaled by a power of two (as q_for_codes), held as the B operand [HEAD_DIM, BLOCK_H]
        q32 = q_raw.to(gl.float32)
        q_s, q_inv_s = pow2_fp16_scale(q32)
        qt = gl.convert_layout((q32 * q_s).to(gl.float16), b_q)
        if KV_QUANT == 2:
            s_mult = scale_log2 * 128.0 * q_inv_s  # int8 codes as value / 128
        elif FP8_SOFTWARE:
            s_mult = scale_log2 * 256.0 * q_inv_s
        else:
            s_mult = scale_log2 * q_inv_s  # exact e4m3 values

        offs_n = gl.arange(0, BLOCK_N, layout=rows_l)
        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=cols_l)
        l_t = gl.zeros([BLOCK_N, BLOCK_H], gl.float32, layout=mma)
        acc_a = gl.zeros([HALF, BLOCK_H], gl.float32, layout=mma)
        acc_b = gl.zeros([HALF, BLOCK_H], gl.float32, layout=mma)
        # the sequence's partial last tile runs after the loop (LAST): only it masks keys past the end
        n_steady = tile_end - tile_start
        partial = (tile_end * BLOCK_N > seq_len).to(gl.int32)
        for i in range(n_steady - partial):
            acc_a, acc_b, m_i, l_t, iss_tile, iss_off, iss_page, iss_phys0, iss_phys1 = _tile_step(
                i, tile_start, tile_end, seq_len, last_page, block_size, bt_row, qt, s_mult, acc_a, acc_b, m_i, l_t,
                iss_tile, iss_off, iss_page, iss_phys0, iss_phys1, ring, src, lanes, offs_n, p_smem, KV_QUANT,
                FP8_SOFTWARE, BLOCK_N, BLOCK_H, NUM_STAGES, False, mma, V_BY_DIM)
        if partial > 0:
            acc_a, acc_b, m_i, l_t, iss_tile, iss_off, iss_page, iss_phys0, iss_phys1 = _tile_step(
                n_steady - 1, tile_start, tile_end, seq_len, last_page, block_size, bt_row, qt, s_mult, acc_a, acc_b,
                m_i, l_t, iss_tile, iss_off, iss_page, iss_phys0, iss_phys1, ring, src, lanes, offs_n, p_smem,
                KV_QUANT, FP8_SOFTWARE, BLOCK_N, BLOCK_H, NUM_STAGES, True, mma, V_BY_DIM)
        async_copy.wait_group(0)

        l_i = gl.sum(l_t, axis=0)
        if FP8_SOFTWARE or KV_QUANT == 2:
            out_factor = KV8_OUT_FACTOR / l_i
        else:
            out_factor = KV8_HW_OUT_FACTOR / l_i
        o_a = acc_a * out_factor[None, :]
        o_b = acc_b * out_factor[None, :]
        lse = m_i + gl.log2(l_i) - L_SHIFT
        if n_splits == 1:
            gl.store(out_ptr + out_cols + d_a[:, None], o_a.to(out_ptr.dtype.element_ty), mask=hd_mask)
            gl.store(out_ptr + out_cols + d_b[:, None], o_b.to(out_ptr.dtype.element_ty), mask=hd_mask)
        else:
            row = (ws_first + split) * num_q_heads + q_heads
            gl.store(ws_o_ptr + row[None, :] * HEAD_DIM + d_a[:, None], o_a, mask=hd_mask)
            gl.store(ws_o_ptr + row[None, :] * HEAD_DIM + d_b[:, None], o_b, mask=hd_mask)
            gl.store(ws_lse_ptr + row, lse, mask=h_mask)


def gluon_constexprs(*, group, head_dim, block_n, num_stages, num_warps, kv_quant, fp8_software, even_splits, balance,
                     batch_chunk) -> dict:
    """The Gluon stage 1's constexprs for a call (kv_quant: 1 fp8, 2 int8); shared by the launcher and compile_check,
    so both compile the same kernel. The mma's columns hold the GQA group: 8, or 16 for groups over 8."""
    return dict(GROUP=group, HEAD_DIM=head_dim, BLOCK_N=block_n, BLOCK_H=8 if group <= 8 else 16,
                NUM_STAGES=num_stages, NUM_WARPS=num_warps, KV_QUANT=kv_quant,
                FP8_SOFTWARE=bool(fp8_software) and kv_quant == 1, EVEN_SPLITS=even_splits, BALANCE=balance,
                BATCH_CHUNK=batch_chunk)


def launch_gluon_stage1(grid, args, **constexprs):
    """Launch the Gluon stage 1 with the Triton stage 1's positional arguments ``args`` (constexprs: gluon_constexprs'
    keywords)."""
    _decode_split_kernel_gluon[grid](*args, **gluon_constexprs(**constexprs), num_warps=constexprs["num_warps"])
