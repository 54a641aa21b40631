"""Stage 1 of the split-KV decode for 8-bit caches with V by dim, written in Gluon (launch key ``gluon``, CUDA).

Same grid, arguments, split plan, scale arithmetic and workspace as decode_attention._decode_split_kernel (stage 2
is shared), but the tile loop is laid out by hand where Triton's choices cost the 8-bit path its speed (issue #17):
- q (fp16, scaled by a power of two as the Triton kernel does) stays in registers as the mma A operand for the
  whole loop; Triton re-reads it from shared memory for every tile.
- Each tile's K codes (token rows) and V codes (by dim: token-contiguous rows), and the tile's K / V scales, stream
  through a ``num_stages``-deep ring in shared memory by cp.async, 16 bytes per lane; the next tile's pages are read
  from the block table one iteration ahead, so no load's address waits on a load.
- The codes go from shared memory straight into the mma_v2 B-operand layout with 8 consecutive reduction elements
  per thread (one 8-byte ld.shared; both operands of a product take the same k order, so the sum is unchanged),
  are converted there in registers (PTX e4m3 in hardware or with integer ops, or int8) and feed fp16 mma_v2 with
  float32 accumulation. Only P goes through shared memory (its change of layout); the V tile is never copied.
- The softmax's row sum is kept per thread ([16, BLOCK_N] in the mma layout) and reduced once after the loop; only
  the row max is reduced across warps per tile.
Swizzles (K 32-byte vectors over 8 phases, V 32 / 16-byte over 4) are conflict-free for the ld.shared of both
operands and the cp.async stores (gl.bank_conflicts, sm90, head_dim 256, BLOCK_N 128 / 64).

H200, as a contiguous probe at 256 programs x 32K tokens (bench/results/2026-12-04-h200-session21-gluon.md): fp8
in hardware 4.47 TB/s of codes and scales with BLOCK_N 128, 8 warps, 3 stages, against 3.28 for the Triton kernel.

Where it applies (gluon_supported): CUDA with PTX conversions (sm80+: cp.async, mma.sync), 8-bit codes with V by
dim, head_dim a power of two in [64, 256], a GQA group of at most 16, pages of at least BLOCK_N tokens and a
multiple of 16 (a 16-token V chunk never straddles a page). Elsewhere the launcher runs the Triton kernel.
Hardware e4m3 gives the exact value (no x 2^-8), so S's factor takes 1 for the code unit and the output 2^32 for
2^40 (acc is 2^8 x the Triton kernel's; m, l and P' are the same numbers). Slots past a sequence's end that a V
chunk reads hold any codes (P' = 0 there): the last tile of a sequence zeroes their converted values, as hardware
decode makes code 0x7f NaN.
"""
try:  # Triton 3.6 ships Gluon; a build without it (the DCU's, possibly) keeps the Triton kernel
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2
    GLUON = True
except ImportError:  # pragma: no cover - depends on the Triton build
    GLUON = False

from .decode_attention import (_BLOCK_H, _KV8_OUT_FACTOR, _L_SHIFT, _balanced_split_of, _num_tiles,
                               _pow2_fp16_scale, _split_range, _split_tiles, _v_scale_log2)

HEAD_DIMS = (64, 128, 256)


def gluon_supported(kv_quant: int, ptx: bool, v_by_dim: bool, head_dim: int, group: int, block_size: int,
                    block_n: int, num_stages: int) -> bool:
    """Whether the Gluon stage 1 takes this call (the module docstring says why each condition; a ring needs two
    stages)."""
    return (GLUON and ptx and kv_quant != 0 and v_by_dim and head_dim in HEAD_DIMS and group <= _BLOCK_H
            and block_size >= block_n and block_size % 16 == 0 and block_n in (64, 128) and num_stages >= 2)


if GLUON:
    _E4M3_HW = gl.constexpr("""{
        .reg .b16 l, h;
        mov.b32 {l, h}, $2;
        cvt.rn.f16x2.e4m3x2 $0, l;
        cvt.rn.f16x2.e4m3x2 $1, h;
    }""")  # the exact e4m3 value
    _E4M3_SW = gl.constexpr("""{
        .reg .b32 a0, a1;
        prmt.b32 a0, $2, 0, 0x9180;
        prmt.b32 a1, $2, 0, 0xb3a2;
        shl.b32 a0, a0, 7;
        shl.b32 a1, a1, 7;
        and.b32 $0, a0, 0xbf80bf80;
        and.b32 $1, a1, 0xbf80bf80;
    }""")  # e4m3 value / 256 with integer ops (decode_attention._PTX_E4M3_SW)
    _INT8 = gl.constexpr("""{
        .reg .b32 u, a0, a1, k;
        mov.b32 k, 0x48804880;
        xor.b32 u, $2, 0x80808080;
        prmt.b32 a0, u, 0x4848, 0x4140;
        prmt.b32 a1, u, 0x4848, 0x4342;
        sub.f16x2 $0, a0, k;
        sub.f16x2 $1, a1, k;
    }""")  # int8 value / 128 (decode_attention._PTX_INT8)
    _KV8_HW_OUT_FACTOR = gl.constexpr(4294967296.0)  # 2^32: acc holds exact e4m3 values, 2^8 x the 2^-8 units

    @gluon.jit
    def _cvt(codes, KV_QUANT: gl.constexpr, FP8_SOFTWARE: gl.constexpr):
        if KV_QUANT == 2:
            return gl.inline_asm_elementwise(_INT8, "=r,=r,r", [codes], dtype=gl.float16, is_pure=True, pack=4)
        elif FP8_SOFTWARE:
            return gl.inline_asm_elementwise(_E4M3_SW, "=r,=r,r", [codes], dtype=gl.float16, is_pure=True, pack=4)
        else:
            return gl.inline_asm_elementwise(_E4M3_HW, "=r,=r,r", [codes], dtype=gl.float16, is_pure=True, pack=4)

    @gluon.jit
    def _pages(tile, bt_row, block_size, last_page, BLOCK_N: gl.constexpr):
        """(first page of the tile, its physical page, the next one's, clamped to the sequence's last page): a tile
        touches at most two pages (block_size >= BLOCK_N)."""
        page0 = (tile * BLOCK_N) // block_size
        phys0 = gl.load(bt_row + page0).to(gl.int64)
        phys1 = gl.load(bt_row + gl.minimum(page0 + 1, last_page)).to(gl.int64)
        return page0, phys0, phys1

    @gluon.jit
    def _issue(k_ring, v_ring, ks_ring, vs_ring, slot, tile, page0, phys0, phys1, last, block_size,
               k_head, v_head, ks_head, vs_head, stride_kb, stride_kt, stride_vb, stride_vd, stride_ksb, stride_kst,
               stride_vsb, stride_vst, kr, kc, vr, vc, sr, BLOCK_N: gl.constexpr):
        """cp.async of one tile into ring slot ``slot``, no masks (a masked copy costs register moves and
        zero stores per tile). Per tile, two base addresses per tensor (the tile's part of its first page and of
        the next one, phys1); a row takes the second past ``split_at``. K rows and scales past the sequence's last
        token re-read the last one (their scores are -inf); V's 16-token runs keep the tile's slots (past the
        sequence's last page: the last page's first slots, valid memory). The caller commits the group."""
        tile_off = tile * BLOCK_N - page0 * block_size  # the tile's first slot in page0
        split_at = block_size - tile_off  # rows from here on lie in the next page
        n_valid = last + 1 - tile * BLOCK_N  # rows before this lie in the sequence
        k_base0 = k_head + phys0 * stride_kb + tile_off * stride_kt
        k_base1 = k_head + phys1 * stride_kb + (tile_off - block_size) * stride_kt
        krc = gl.minimum(kr, n_valid - 1)
        k_row = gl.where(krc >= split_at, k_base1, k_base0) + krc * stride_kt
        async_copy.async_copy_global_to_shared(k_ring.index(slot), k_row[:, None] + kc[None, :])
        v_base0 = v_head + phys0 * stride_vb + tile_off
        v_base1 = v_head + phys1 * stride_vb + (tile_off - block_size)
        v_col = gl.where(vc >= split_at, v_base1, v_base0) + vc
        async_copy.async_copy_global_to_shared(v_ring.index(slot), v_col[None, :] + vr[:, None] * stride_vd)
        src = gl.minimum(sr, n_valid - 1)
        s_second = src >= split_at
        s_slot = gl.where(s_second, src - block_size, src) + tile_off
        async_copy.async_copy_global_to_shared(
            ks_ring.index(slot), ks_head + gl.where(s_second, phys1, phys0) * stride_ksb + s_slot * stride_kst)
        async_copy.async_copy_global_to_shared(
            vs_ring.index(slot), vs_head + gl.where(s_second, phys1, phys0) * stride_vsb + s_slot * stride_vst)

    @gluon.jit
    def _tile_step(i, tile_start, tile_end, seq_len, last, last_page, block_size, bt_row, q, s_mult, acc, m_i, l_t,
                   n_page0, n_phys0, n_phys1, k_ring, v_ring, ks_ring, vs_ring, k_head, v_head, ks_head, vs_head,
                   stride_kb, stride_kt, stride_vb, stride_vd, stride_ksb, stride_kst, stride_vsb, stride_vst,
                   kr, kc, vr, vc, sr, offs_n, v_rows, KV_QUANT: gl.constexpr, FP8_SOFTWARE: gl.constexpr,
                   BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, MASK_V: gl.constexpr, mma: gl.constexpr,
                   b_op: gl.constexpr, a_op: gl.constexpr):
        """Tile ``tile_start + i`` of the online softmax (ring slot i % NUM_STAGES), after issuing the copies of the
        tile NUM_STAGES - 1 ahead and reading the block table for the one after. MASK_V: the sequence's partial last
        tile, whose V slots past the end hold any codes (P' = 0 there; hardware decode makes 0x7f NaN)."""
        tile = tile_start + i
        slot = i % NUM_STAGES
        async_copy.wait_group(NUM_STAGES - 2)
        gl.thread_barrier()  # every thread's copies of this tile landed; the slot read last iteration is free
        ahead = tile + NUM_STAGES - 1
        if ahead < tile_end:  # the split's tiles only (a uniform branch: no masked copies)
            _issue(k_ring, v_ring, ks_ring, vs_ring, (i + NUM_STAGES - 1) % NUM_STAGES, ahead, n_page0, n_phys0,
                   n_phys1, last, block_size, k_head, v_head, ks_head, vs_head, stride_kb, stride_kt, stride_vb,
                   stride_vd, stride_ksb, stride_kst, stride_vsb, stride_vst, kr, kc, vr, vc, sr, BLOCK_N)
        async_copy.commit_group()  # empty past the split's end, so wait_group's count stays one group per tile
        n_page0, n_phys0, n_phys1 = _pages(gl.minimum(ahead + 1, tile_end - 1), bt_row, block_size, last_page,
                                           BLOCK_N)

        kt = k_ring.index(slot).permute([1, 0]).load(b_op)  # K^T [HEAD_DIM, BLOCK_N]
        s = mma_v2(q, _cvt(kt, KV_QUANT, FP8_SOFTWARE), gl.zeros([16, BLOCK_N], gl.float32, layout=mma))
        k_scale = ks_ring.index(slot).load(gl.SliceLayout(0, mma))
        v_scale = vs_ring.index(slot).load(gl.SliceLayout(0, mma))
        s = s * (k_scale * s_mult)[None, :]
        s = gl.where((tile * BLOCK_N + offs_n < seq_len)[None, :], s, float("-inf"))
        t = s + _v_scale_log2(v_scale, KV_QUANT)[None, :]
        m_new = gl.maximum(m_i, gl.max(t, axis=1))
        alpha = gl.exp2(m_i - m_new)
        l_t = l_t * alpha[:, None] + gl.exp2(s - m_new[:, None] + _L_SHIFT)
        p = gl.convert_layout(gl.exp2(t - m_new[:, None]).to(gl.float16), a_op)
        v = _cvt(v_ring.index(slot).permute([1, 0]).load(b_op), KV_QUANT, FP8_SOFTWARE)  # V [BLOCK_N, HEAD_DIM]
        if MASK_V:
            v = gl.where((tile * BLOCK_N + v_rows < seq_len)[:, None], v, 0.0)
        acc = mma_v2(p, v, acc * alpha[:, None])
        return acc, m_new, l_t, n_page0, n_phys0, n_phys1

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
        GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
        NUM_WARPS: gl.constexpr, KV_QUANT: gl.constexpr, FP8_SOFTWARE: gl.constexpr,
        EVEN_SPLITS: gl.constexpr = False, BALANCE: gl.constexpr = False, BATCH_CHUNK: gl.constexpr = 256,
    ):  # fmt: skip
        BLOCK_H: gl.constexpr = 16
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
            seq, split, n_splits_balanced, seq_len_balanced = _balanced_split_of(
                gl.program_id(0), seq_lens_ptr, batch, balance_programs, max_splits, min_split_tokens, block_size,
                gl.arange(0, BATCH_CHUNK, layout=chunk_l), BLOCK_N, False, BATCH_CHUNK)
            ws_first = gl.program_id(0) - split
            if (split == 0) & (kv_head == 0) & (seq >= 0):
                gl.store(ws_plan_ptr + 2 * seq, ws_first)
                gl.store(ws_plan_ptr + 2 * seq + 1, n_splits_balanced)

        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, NUM_WARPS],
                                                      instr_shape=[16, 8])
        a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=8)
        b_op: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=8)
        rows_l: gl.constexpr = gl.SliceLayout(1, mma)
        cols_l: gl.constexpr = gl.SliceLayout(0, mma)
        offs_h = gl.arange(0, BLOCK_H, layout=rows_l)
        offs_d = gl.arange(0, HEAD_DIM, layout=cols_l)
        h_mask = offs_h < GROUP
        q_heads = kv_head * GROUP + offs_h
        out_offs = seq * stride_ob + q_heads[:, None] * stride_oh + offs_d[None, :]
        hd_mask = h_mask[:, None] & (offs_d[None, :] >= 0)

        if balanced:
            if seq < 0:
                return
            seq_len = seq_len_balanced
        else:
            seq_len = gl.load(seq_lens_ptr + seq)
        n_tiles = _num_tiles(seq_len, block_size, BLOCK_N, False)
        if balanced:
            n_splits = n_splits_balanced
            tiles_per_split = n_tiles // n_splits
        else:
            tiles_per_split, n_splits = _split_range(seq_len, n_tiles, max_splits, min_split_tokens, EVEN_SPLITS)
        if seq_len <= 0:
            if split == 0:
                gl.store(out_ptr + out_offs, gl.zeros([BLOCK_H, HEAD_DIM], out_ptr.dtype.element_ty, mma),
                         mask=hd_mask)
            return
        if split >= n_splits:
            return
        if balanced:
            tile_start, tile_end = _split_tiles(split, tiles_per_split, n_splits, n_tiles, True)
        else:
            tile_start, tile_end = _split_tiles(split, tiles_per_split, n_splits, n_tiles, EVEN_SPLITS)

        # the ring: cp.async layouts (16 bytes per lane) and conflict-free swizzles
        D16: gl.constexpr = HEAD_DIM // 16
        N16: gl.constexpr = BLOCK_N // 16
        k_blk: gl.constexpr = gl.BlockedLayout([1, 16], [32 // D16, D16], [NUM_WARPS, 1], [1, 0])
        v_blk: gl.constexpr = gl.BlockedLayout([1, 16], [32 // N16, N16], [NUM_WARPS, 1], [1, 0])
        s_blk: gl.constexpr = gl.BlockedLayout([1], [32], [NUM_WARPS], [0])
        k_sh: gl.constexpr = gl.SwizzledSharedLayout(32, 1, 8, [1, 0])
        if BLOCK_N == 128:
            v_sh: gl.constexpr = gl.SwizzledSharedLayout(32, 1, 4, [1, 0])
        else:
            v_sh: gl.constexpr = gl.SwizzledSharedLayout(16, 1, 4, [1, 0])
        s_sh: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        k_ring = gl.allocate_shared_memory(gl.uint8, [NUM_STAGES, BLOCK_N, HEAD_DIM], k_sh)
        v_ring = gl.allocate_shared_memory(gl.uint8, [NUM_STAGES, HEAD_DIM, BLOCK_N], v_sh)
        ks_ring = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, BLOCK_N], s_sh)
        vs_ring = gl.allocate_shared_memory(gl.float32, [NUM_STAGES, BLOCK_N], s_sh)
        kr = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, k_blk))
        kc = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, k_blk))
        vr = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(1, v_blk))
        vc = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, v_blk))
        sr = gl.arange(0, BLOCK_N, layout=s_blk)

        last = seq_len - 1
        last_page = last // block_size
        bt_row = block_table_ptr + seq * stride_btb
        k_head = k_ptr + kv_head * stride_kh
        v_head = v_ptr + kv_head * stride_vh
        ks_head = ks_ptr + kv_head * stride_ksh
        vs_head = vs_ptr + kv_head * stride_vsh
        # prologue: the ring's first NUM_STAGES - 1 tiles; the pages of the next one are read ahead
        for st in gl.static_range(NUM_STAGES - 1):
            if tile_start + st < tile_end:
                page0, phys0, phys1 = _pages(tile_start + st, bt_row, block_size, last_page, BLOCK_N)
                _issue(k_ring, v_ring, ks_ring, vs_ring, st, tile_start + st, page0, phys0, phys1, last, block_size,
                       k_head, v_head, ks_head, vs_head, stride_kb, stride_kt, stride_vb, stride_vd, stride_ksb,
                       stride_kst, stride_vsb, stride_vst, kr, kc, vr, vc, sr, BLOCK_N)
            async_copy.commit_group()
        n_page0, n_phys0, n_phys1 = _pages(gl.minimum(tile_start + NUM_STAGES - 1, tile_end - 1), bt_row, block_size,
                                           last_page, BLOCK_N)

        # q: fp16 scaled by a power of two (as _q_for_codes), held as the A operand
        q_blk: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [1, NUM_WARPS], [1, 0])
        qh = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, q_blk))
        qd = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, q_blk))
        q32 = gl.load(q_ptr + seq * stride_qb + (kv_head * GROUP + qh)[:, None] * stride_qh + qd[None, :],
                      mask=(qh < GROUP)[:, None] & (qd[None, :] >= 0), other=0.0).to(gl.float32)
        q_s, q_inv_s = _pow2_fp16_scale(q32)
        q = gl.convert_layout((q32 * q_s).to(gl.float16), a_op)
        if KV_QUANT == 2:
            s_mult = scale_log2 * 128.0 * q_inv_s
        elif FP8_SOFTWARE:
            s_mult = scale_log2 * 256.0 * q_inv_s
        else:
            s_mult = scale_log2 * q_inv_s  # exact e4m3 values

        offs_n = gl.arange(0, BLOCK_N, layout=cols_l)
        v_rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, b_op))
        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=rows_l)
        l_t = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=mma)
        acc = gl.zeros([BLOCK_H, HEAD_DIM], gl.float32, layout=mma)
        # the sequence's last tile, if partial, runs after the loop (MASK_V): only it zeroes V past the end
        n_steady = tile_end - tile_start
        partial = (tile_end * BLOCK_N > seq_len).to(gl.int32)
        for i in range(n_steady - partial):
            acc, m_i, l_t, n_page0, n_phys0, n_phys1 = _tile_step(
                i, tile_start, tile_end, seq_len, last, last_page, block_size, bt_row, q, s_mult, acc, m_i, l_t,
                n_page0, n_phys0, n_phys1, k_ring, v_ring, ks_ring, vs_ring, k_head, v_head, ks_head, vs_head,
                stride_kb, stride_kt, stride_vb, stride_vd, stride_ksb, stride_kst, stride_vsb, stride_vst,
                kr, kc, vr, vc, sr, offs_n, v_rows, KV_QUANT, FP8_SOFTWARE, BLOCK_N, NUM_STAGES, False, mma, b_op, a_op)
        if partial > 0:
            acc, m_i, l_t, n_page0, n_phys0, n_phys1 = _tile_step(
                n_steady - 1, tile_start, tile_end, seq_len, last, last_page, block_size, bt_row, q, s_mult, acc, m_i,
                l_t, n_page0, n_phys0, n_phys1, k_ring, v_ring, ks_ring, vs_ring, k_head, v_head, ks_head, vs_head,
                stride_kb, stride_kt, stride_vb, stride_vd, stride_ksb, stride_kst, stride_vsb, stride_vst,
                kr, kc, vr, vc, sr, offs_n, v_rows, KV_QUANT, FP8_SOFTWARE, BLOCK_N, NUM_STAGES, True, mma, b_op, a_op)
        async_copy.wait_group(0)

        l_i = gl.sum(l_t, axis=1)
        o = acc / l_i[:, None]
        if (KV_QUANT == 1) and (not FP8_SOFTWARE):
            o = o * _KV8_HW_OUT_FACTOR
        else:
            o = o * _KV8_OUT_FACTOR
        lse = m_i + gl.log2(l_i) - _L_SHIFT
        if n_splits == 1:
            gl.store(out_ptr + out_offs, o.to(out_ptr.dtype.element_ty), mask=hd_mask)
        else:
            row = (ws_first + split) * num_q_heads + q_heads
            gl.store(ws_o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], o, mask=hd_mask)
            gl.store(ws_lse_ptr + row, lse, mask=h_mask)


def launch_gluon_stage1(grid, args, *, group, head_dim, block_n, num_stages, num_warps, kv_quant, fp8_software,
                        even_splits, balance, batch_chunk):
    """Launch the Gluon stage 1 with the Triton stage 1's positional arguments ``args``."""
    _decode_split_kernel_gluon[grid](
        *args, GROUP=group, HEAD_DIM=head_dim, BLOCK_N=block_n, NUM_STAGES=num_stages, NUM_WARPS=num_warps,
        KV_QUANT=kv_quant, FP8_SOFTWARE=fp8_software, EVEN_SPLITS=even_splits, BALANCE=balance,
        BATCH_CHUNK=batch_chunk, num_warps=num_warps)

