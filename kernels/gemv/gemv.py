"""Skinny GEMM for decode: ``y = x @ W^T (+ bias)`` for 1..8 rows of x, optionally fused with SiLU-and-mul.

A decode step of a dense model reads every weight once per token, so at 1..8 rows the GEMM is a
stream over W: the kernel is built for bytes in flight, not for math.

* Grid (N tiles, K splits). A program owns BLOCK_N rows of W (output columns) and one range of K,
  walks it in BLOCK_K-wide tiles (16-byte vector loads along K) and reuses each W tile for every
  row of x. Row indices past N are clamped to N - 1 (the last tile re-reads a valid row instead of
  masking), so W loads carry no row mask; only the store is masked.
* Two inner products, chosen per launch (``DOT``):
  - 0, FMA: fp32 products accumulate in a [BLOCK_M, BLOCK_N, BLOCK_K] register tile, reduced
    over K once after the loop (no cross-lane reductions in the loop). Cheap at one row.
  - 1, dot: ``tl.dot`` of x padded to 16 rows (the smallest dot tile) with the W tile, fp32
    accumulator [16, BLOCK_N]. Registers do not grow with the row count; on GPUs with async copies
    Triton's pipeliner streams W through shared memory ``num_stages`` tiles deep.
* Split-K (when N alone gives too few programs to fill the device, e.g. N = 96): each split writes
  its fp32 partial sums to a workspace [splits, M, N]; a second small kernel adds the splits in a
  fixed order (0, 1, 2, ...), then the bias and the activation, so results are deterministic and
  identical from run to run (no float atomics).
* K_STAGES (launch parameter): the K loop as tl.range(num_stages=K_STAGES), which Triton pipelines
  through shared memory with async copies on sm90, the FMA path included: K_STAGES - 1 W tiles per
  program in flight instead of the one tile of the plain loop (sm90: K_STAGES 3 at one row for N = 5120).
* Stream-K (a fixed grid of a few programs per SM sharing the (N tile, K tile) units) was tried and
  measured slower on the H200 at every shape and row count (2026-12-02, bench --variants: 1 row
  1.02-1.07x the table's time, e.g. 16384x5120 44.2 vs 42.4 us; 2-8 rows 1.02-1.33x); removed, its
  code is in commit 6aaf4c5.
* Fused SiLU-and-mul (vLLM's SiluAndMul convention): W = [gate; up] with N = 2 * N_out rows; a
  program reads gate row n and up row N_out + n for each of its columns and writes
  silu(g) * u in fp32 before the one rounding to the output dtype.

Accumulation is fp32 throughout; the output is rounded once. Row count M is a runtime argument
(not specialized), so one compiled kernel serves every M in a row bucket; K-loop bounds are
runtime too. Launch parameters per target are data in launch_params.py.
"""
import torch
import triton
import triton.language as tl

from ..targets import num_compute_units
from . import launch_params

_DOT_ROWS = 16  # rows of the x tile on the dot path (smallest tl.dot M)
_REDUCE_BLOCK = 256  # columns per program of the split-K reduction


@triton.jit
def _silu_mul(g, u):
    return g / (1.0 + tl.exp(-g)) * u


@triton.jit
def _k_step(acc, acc_u, t, x_ptr, x_rows, w_rows, u_rows, m_mask, offs_k, K,
            BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr, SILU_MUL: tl.constexpr,
            EVEN_K: tl.constexpr):  # fmt: skip
    """One BLOCK_K step of the K loop: W tile (and the up tile) times x into the accumulators."""
    kk = t * BLOCK_K + offs_k  # t * BLOCK_K: the compiler knows the tile start is BLOCK_K-aligned
    if EVEN_K:
        k_mask = None
        k_other = None
    else:
        k_mask = (kk < K)[None, :]
        k_other = 0.0
    w = tl.load(w_rows + kk[None, :], mask=k_mask, other=k_other)
    if SILU_MUL:
        wu = tl.load(u_rows + kk[None, :], mask=k_mask, other=k_other)
    if DOT:
        x = tl.load(x_rows + kk[None, :], mask=m_mask if EVEN_K else m_mask & k_mask, other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
        if SILU_MUL:
            acc_u = tl.dot(x, tl.trans(wu), acc_u)
    elif BLOCK_M == 1:
        if EVEN_K:
            xv = tl.load(x_ptr + kk)
        else:
            xv = tl.load(x_ptr + kk, mask=kk < K, other=0.0)
        xf = xv.to(tl.float32)[None, :]
        acc += w.to(tl.float32) * xf
        if SILU_MUL:
            acc_u += wu.to(tl.float32) * xf
    else:
        x = tl.load(x_rows + kk[None, :], mask=m_mask if EVEN_K else m_mask & k_mask, other=0.0)
        xf = x.to(tl.float32)[:, None, :]
        acc += xf * w.to(tl.float32)[None, :, :]
        if SILU_MUL:
            acc_u += xf * wu.to(tl.float32)[None, :, :]
    return acc, acc_u


@triton.jit(do_not_specialize=["M", "tiles_per_split"])
def _gemv_kernel(
    x_ptr, w_ptr, wu_ptr, b_ptr, out_ptr, ws_ptr,
    M, N_OUT, K, tiles_per_split,
    stride_xm, stride_wn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT: tl.constexpr, PARTIAL: tl.constexpr, HAS_BIAS: tl.constexpr, SILU_MUL: tl.constexpr,
    EVEN_K: tl.constexpr, K_STAGES: tl.constexpr = 0,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    # clamped rows: every W / x load stays in bounds without a row mask
    row_offs = tl.minimum(offs_n, N_OUT - 1).to(tl.int64)[:, None] * stride_wn
    w_rows = w_ptr + row_offs
    u_rows = wu_ptr + row_offs  # wu_ptr: row N_OUT of W (the up half); read only with SILU_MUL
    x_rows = x_ptr + offs_m[:, None] * stride_xm
    m_mask = (offs_m < M)[:, None]  # padded rows: masked, so they cost no memory traffic

    n_k_tiles = tl.cdiv(K, BLOCK_K)
    t_begin = pid_k * tiles_per_split
    t_end = tl.minimum(t_begin + tiles_per_split, n_k_tiles)

    # accumulators: DOT [BLOCK_M, BLOCK_N]; FMA [BLOCK_N, BLOCK_K] at one row, else [BLOCK_M, BLOCK_N, BLOCK_K]
    if DOT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    elif BLOCK_M == 1:
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_u = acc  # only updated (and kept) with SILU_MUL
    if K_STAGES > 0:
        # pipelined K_STAGES deep (async copies of the W tiles on GPUs that have them, FMA path included)
        for t in tl.range(t_begin, t_end, num_stages=K_STAGES):
            acc, acc_u = _k_step(acc, acc_u, t, x_ptr, x_rows, w_rows, u_rows, m_mask, offs_k, K,
                                 BLOCK_M, BLOCK_K, DOT, SILU_MUL, EVEN_K)
    else:
        for t in range(t_begin, t_end):
            acc, acc_u = _k_step(acc, acc_u, t, x_ptr, x_rows, w_rows, u_rows, m_mask, offs_k, K,
                                 BLOCK_M, BLOCK_K, DOT, SILU_MUL, EVEN_K)
    if DOT:
        y = acc
        y_u = acc_u
    elif BLOCK_M == 1:
        y = tl.sum(acc, axis=1)[None, :]
        y_u = tl.sum(acc_u, axis=1)[None, :]
    else:
        y = tl.sum(acc, axis=2)
        y_u = tl.sum(acc_u, axis=2)

    n_mask = offs_n < N_OUT
    mn_mask = (offs_m < M)[:, None] & n_mask[None, :]
    if PARTIAL:
        # fp32 partials [split, M, N_OUT (x2 with SILU_MUL: gate columns, then up columns)]
        n_ws = N_OUT * (2 if SILU_MUL else 1)
        ws_offs = (pid_k * M + offs_m)[:, None] * n_ws + offs_n[None, :]
        tl.store(ws_ptr + ws_offs, y, mask=mn_mask)
        if SILU_MUL:
            tl.store(ws_ptr + ws_offs + N_OUT, y_u, mask=mn_mask)
    else:
        if HAS_BIAS:
            y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
            if SILU_MUL:
                y_u += tl.load(b_ptr + N_OUT + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        if SILU_MUL:
            y = _silu_mul(y, y_u)
        out_offs = offs_m[:, None] * stride_om + offs_n[None, :]
        tl.store(out_ptr + out_offs, y.to(out_ptr.dtype.element_ty), mask=mn_mask)


@triton.jit(do_not_specialize=["M", "splits"])
def _reduce_splits_kernel(
    ws_ptr, b_ptr, out_ptr, M, N_OUT, splits, stride_om,
    BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr, SILU_MUL: tl.constexpr,
):  # fmt: skip
    """out[m, n] = sum over splits in order 0..splits-1 (+ bias, + silu-mul), one rounding."""
    pid = tl.program_id(0)
    m = tl.program_id(1)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N_OUT
    n_ws = N_OUT * (2 if SILU_MUL else 1)
    y = tl.zeros([BLOCK], dtype=tl.float32)
    y_u = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(0, splits):
        row = ws_ptr + (s * M + m) * n_ws
        y += tl.load(row + offs, mask=mask, other=0.0)
        if SILU_MUL:
            y_u += tl.load(row + N_OUT + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        y += tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if SILU_MUL:
            y_u += tl.load(b_ptr + N_OUT + offs, mask=mask, other=0.0).to(tl.float32)
    if SILU_MUL:
        y = _silu_mul(y, y_u)
    tl.store(out_ptr + m * stride_om + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _fail(msg: str):
    raise ValueError(f"gemv: {msg}")


def _check_inputs(x, weight, bias, silu_mul, out):
    if x.dtype not in (torch.float16, torch.bfloat16):
        _fail(f"x must be float16 or bfloat16, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] < 1:
        _fail(f"x must be [..., K] with K >= 1, got {tuple(x.shape)}")
    if weight.dim() != 2 or weight.dtype != x.dtype:
        _fail(f"weight must be a 2-D [N, K] tensor of x's dtype {x.dtype}, got {tuple(weight.shape)} {weight.dtype}")
    n, k = weight.shape
    if x.shape[-1] != k:
        _fail(f"x has K = {x.shape[-1]} but weight is [N, K] = {tuple(weight.shape)}")
    if weight.stride(1) != 1 or weight.stride(0) < k:
        _fail(f"weight must be contiguous along K (strides (>= K, 1)), got strides {weight.stride()}")
    rows = x.numel() // k
    if not 1 <= rows <= launch_params.MAX_ROWS:
        _fail(f"x must have 1..{launch_params.MAX_ROWS} rows (product of its leading dims), got {rows}; "
              "larger batches belong to a GEMM")
    if silu_mul and n % 2:
        _fail(f"silu_mul needs an even N (gate rows then up rows), got N = {n}")
    n_out = n // 2 if silu_mul else n
    if bias is not None and (bias.shape != (n,) or bias.dtype != x.dtype or bias.stride(0) != 1):
        _fail(f"bias must be a contiguous [{n}] tensor of dtype {x.dtype}, got {tuple(bias.shape)} {bias.dtype}")
    devices = {t.device for t in (x, weight, bias, out) if t is not None}
    if len(devices) != 1:
        _fail(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    if out is not None:
        want = (*x.shape[:-1], n_out)
        if tuple(out.shape) != want or out.dtype != x.dtype or not out.is_contiguous():
            _fail(f"out must be a contiguous {want} tensor of dtype {x.dtype}, got {tuple(out.shape)} {out.dtype} "
                  f"(contiguous: {out.is_contiguous()})")
    return rows, n, k, n_out


def gemv(x, weight, bias=None, *, silu_mul=False, out=None, config=None):
    """``x @ weight.T + bias`` for 1..8 rows of x (``silu_mul``: then SiLU(gate) * up over the two halves).

    x: [..., K] float16/bfloat16 with 1..8 rows in all (the product of the leading dims); any strides
    (it is made [M, K] with unit stride along K, copying only if it has to). weight: [N, K] of x's
    dtype with unit stride along K. bias: [N] or None. silu_mul: N = 2 * N_out, rows [0, N_out) are
    the gate and [N_out, N) the up projection; the result is [..., N_out] =
    silu(x W_gate^T + b_gate) * (x W_up^T + b_up), vLLM's SiluAndMul of the GEMM's output.
    out: optional preallocated contiguous result. config: launch parameters for this call (a dict as
    in launch_params, optionally with "SPLIT_K", "K_STAGES"), for tests and benchmarks; None uses the
    table of the current target. Accumulates in fp32; split-K sums its partials in a fixed order
    (deterministic).
    """
    rows, n, k, n_out = _check_inputs(x, weight, bias, silu_mul, out)
    x2 = x.reshape(rows, k)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    result = out if out is not None else torch.empty((*x.shape[:-1], n_out), dtype=x.dtype, device=x.device)
    out2 = result.view(rows, n_out)
    if config is None:
        target = launch_params.current_target(x.device)
        cfg = launch_params.config_for(target, n, k, rows, silu_mul=silu_mul)
    else:
        cfg = launch_params.check_config(dict(config), "gemv config")
    cfg = dict(cfg)
    block_n, block_k = cfg.pop("BLOCK_N"), cfg.pop("BLOCK_K")
    dot = bool(cfg.pop("DOT"))
    forced_split = cfg.pop("SPLIT_K", None)
    block_m = _DOT_ROWS if dot else launch_params.row_bucket(rows)
    n_tiles = triton.cdiv(n_out, block_n)
    k_tiles = triton.cdiv(k, block_k)
    if forced_split is None:
        splits = launch_params.num_splits(n_tiles, k, block_k, num_compute_units(x.device),
                                          launch_params.get_params(launch_params.current_target(x.device)))
    else:
        splits = max(1, min(int(forced_split), k_tiles))
    tiles_per_split = triton.cdiv(k_tiles, splits)
    splits = triton.cdiv(k_tiles, tiles_per_split)  # no empty splits
    partial = splits > 1
    ws = torch.empty((splits, rows, n), dtype=torch.float32, device=x.device) if partial else out2
    b = bias if bias is not None else out2  # placeholder pointer when there is no bias
    w_up = weight[n_out:] if silu_mul else weight
    _gemv_kernel[(n_tiles, splits)](
        x2, weight, w_up, b, out2, ws,
        rows, n_out, k, tiles_per_split,
        x2.stride(0), weight.stride(0), out2.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, DOT=dot, PARTIAL=partial,
        HAS_BIAS=bias is not None, SILU_MUL=bool(silu_mul), EVEN_K=k % block_k == 0, **cfg,
    )  # fmt: skip
    if partial:
        _reduce_splits_kernel[(triton.cdiv(n_out, _REDUCE_BLOCK), rows)](
            ws, b, out2, rows, n_out, splits, out2.stride(0),
            BLOCK=_REDUCE_BLOCK, HAS_BIAS=bias is not None, SILU_MUL=bool(silu_mul), num_warps=4,
        )  # fmt: skip
    return result
