"""The decode kernel's public entry: ``decode_attention`` (split-KV, flash-decoding, paged; one query token per
sequence) checks its inputs, takes the split plan and launch decision (planning.py), and launches stage 1 (the Triton
kernel, triton_kernels.py, or for 8-bit caches where the launch entry says so the Gluon one, gluon_stage1.py) and
stage 2 (the merge of the splits). ``workspace_numel`` (planning.py) sizes a workspace for CUDA graphs.

Where each part lives: triton_kernels.py (the kernel bodies and what they compute, 8-bit paths included), splits.py
(how a sequence is cut into tiles and splits, device code both stage-1 kernels and stage 2 share), codes.py (8-bit
codes' conversions and scale arithmetic, shared with the Gluon stage 1 and the prefill kernel), planning.py (the
host's plan), launch_params.py (the launch table per target).
"""
import torch
import triton

from ..fp8_e4m3 import use_software_fp8
from ..paged_kv import check_block_table, check_one_device, check_q_and_cache
from . import planning
from .planning import launch_plan, workspace_numel  # noqa: F401 - public here too (the package's exports)
from .splits import BLOCK_H
from .triton_kernels import _decode_split_kernel, _merge_splits_kernel

_LOG2E = 1.4426950408889634
_MERGE_SPLITS = 64  # splits merged per step in stage 2
_MERGE_DIM = 64  # head_dim columns per stage-2 program (more programs, fewer serial loads)


def _fail(msg: str):
    raise ValueError(f"decode_attention: {msg}")


def _check_inputs(q, k_cache, v_cache, block_table, seq_lens, out, k_scales, v_scales, kv_quant):
    check_q_and_cache(_fail, q, k_cache, v_cache, out, k_scales, v_scales, kv_quant, BLOCK_H, q_rows="batch",
                      v_any_dim_stride=True)
    batch = q.shape[0]
    if seq_lens.dim() != 1 or seq_lens.shape[0] != batch or seq_lens.dtype != torch.int32:
        _fail(f"seq_lens must be int32 [{batch}], got {tuple(seq_lens.shape)} {seq_lens.dtype}")
    check_block_table(_fail, block_table, batch)
    check_one_device(_fail, q, k_cache, v_cache, block_table, seq_lens, out)


def decode_attention(q, k_cache, v_cache, block_table, seq_lens, scale, out, *, k_scales=None, v_scales=None,
                     kv_quant=None, software_fp8=None, workspace=None, num_splits=None):
    """Paged decode attention, one query token per sequence; writes ``out`` and returns it.

    q, out: [batch, q_heads, head_dim] fp16/bf16. k_cache, v_cache: [num_blocks, block_size,
    kv_heads, head_dim], q's dtype, or uint8 codes with kv_quant "fp8" / "int8" and float32
    k_scales, v_scales [num_blocks, block_size, kv_heads] (any strides). K is contiguous in head_dim; V may have any
    head_dim stride: an int8 cache's V by dim (tokens contiguous, as kv_quant.layout.split_kv_cache makes it) takes
    the int8 x int8 P x V path; every other layout the fp16 path (fp8 V by dim: 1.05-1.09x its by-token time on the
    H200, bench --v-layouts token,dim). block_table: int32
    [>= batch, max_blocks]; seq_lens: int32 [batch] (0 = padded slot, output zeros).
    software_fp8: decode fp8 with integer ops (None: kernels.fp8_e4m3.use_software_fp8()).
    workspace: float32 1-D buffer of at least ``workspace_numel(...)`` elements (preallocated for
    CUDA graphs); None allocates one. num_splits: force up to this many splits per sequence
    (default: from the batch size and the number of compute units).
    """
    _check_inputs(q, k_cache, v_cache, block_table, seq_lens, out, k_scales, v_scales, kv_quant)
    batch, hq, d = q.shape
    _, block_size, hkv, _ = k_cache.shape
    if num_splits is not None and (not isinstance(num_splits, int) or not 1 <= num_splits <= 65535):
        _fail(f"num_splits must be an int in [1, 65535] (the grid's z limit), got {num_splits!r}")
    plan, gluon, v_by_dim, ptx = planning.launch_decision(q, k_cache, v_cache, kv_quant, num_splits)
    rows = plan.rows(batch) * hq
    need = plan.numel(batch, hq, d)
    if workspace is None:
        workspace = torch.empty(need, dtype=torch.float32, device=q.device)
    elif workspace.dtype != torch.float32 or workspace.dim() != 1 or workspace.numel() < need:
        _fail(f"workspace must be float32 1-D with >= {need} elements, got {tuple(workspace.shape)} {workspace.dtype}")
    if batch == 0:
        return out
    n_plan = plan.plan_ints(batch)
    ws_plan = workspace[:n_plan].view(torch.int32) if n_plan else seq_lens  # seq_lens: unused placeholder
    ws_o = workspace[n_plan : n_plan + rows * d]
    ws_lse = workspace[n_plan + rows * d : need]
    if kv_quant is None:
        k_scales = v_scales = seq_lens  # unused placeholders
        ks_strides = vs_strides = (0, 0, 0)
    else:
        ks_strides, vs_strides = k_scales.stride(), v_scales.stride()
    if software_fp8 is None:
        software_fp8 = kv_quant == "fp8" and use_software_fp8()
    block_d = triton.next_power_of_2(d)
    kv = planning.KV_QUANT[kv_quant]
    consts, options = planning.split_kernel_launch(plan.launch, block_size, kv, v_by_dim=v_by_dim)
    splits, min_split, programs = plan.splits, plan.min_split, plan.programs
    grid = (programs + batch, hkv, 1) if programs else (batch, hkv, splits)
    args = (
        q, k_cache, v_cache, k_scales, v_scales, block_table, seq_lens,
        out, ws_o, ws_lse, ws_plan,
        float(scale) * _LOG2E, splits, min_split, block_size, hq, batch, programs,
        q.stride(0), q.stride(1),
        *k_cache.stride()[:3], *v_cache.stride(), *ks_strides, *vs_strides,
        block_table.stride(0), out.stride(0), out.stride(1),
    )  # fmt: skip
    if gluon:
        from .gluon_stage1 import launch_gluon_stage1

        consts["PAGE_LOOP"] = False  # stage 2 recounts the tiles as the Gluon stage 1 walks them
        launch_gluon_stage1(grid, args, group=hq // hkv, head_dim=d, block_n=consts["BLOCK_N"],
                            num_stages=options["num_stages"], num_warps=options["num_warps"],
                            kv_quant=kv, fp8_software=bool(software_fp8),
                            even_splits=consts["EVEN_SPLITS"], balance=consts["BALANCE"],
                            batch_chunk=planning.BATCH_CHUNK)
    else:
        _decode_split_kernel[grid](
            *args, GROUP=hq // hkv, HEAD_DIM=d, BLOCK_D=block_d, BLOCK_H=BLOCK_H, KV_QUANT=kv,
            FP8_SOFTWARE=bool(software_fp8), PTX=ptx, **consts, **options,
        )  # fmt: skip
    if splits > 1:  # some sequence may have more than one split
        block_dm = min(_MERGE_DIM, block_d)
        _merge_splits_kernel[(batch, hq, triton.cdiv(d, block_dm))](
            ws_o, ws_lse, ws_plan, seq_lens, out, splits, min_split, hq, block_size, programs, out.stride(0),
            out.stride(1), HEAD_DIM=d, BLOCK_DM=block_dm, BLOCK_N=consts["BLOCK_N"], PAGE_LOOP=consts["PAGE_LOOP"],
            MERGE=_MERGE_SPLITS, EVEN_SPLITS=consts["EVEN_SPLITS"], BALANCE=consts["BALANCE"], num_warps=4,
        )  # fmt: skip
    return out
