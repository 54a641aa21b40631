"""The decode kernel's split plan and launch decision, on the host (pure Python: nothing here launches a kernel).

For a call's tensors: which launch entry applies (launch_params' table, the tuned file and VLLM_DCU_DECODE_PARAMS over
it), how many splits and programs each sequence gets (split_plan; the device's half of the plan is splits.py), the
workspace that needs (workspace_numel: preallocated for CUDA graphs), whether the code conversions are PTX (use_ptx),
whether the Gluon stage 1 takes an 8-bit call (takes_gluon, gluon_supported), and the constexprs and Triton options a
launch entry becomes (split_kernel_launch, shared by the launcher and compile_check). decode_attention.py launches
what this decides; the bench labels its rows with launch_plan.
"""
from typing import NamedTuple

import torch
import triton

from ..targets import num_compute_units
from . import launch_params
from .splits import BLOCK_H

BATCH_CHUNK = 256  # launch key balance: sequence lengths read per step (one step up to batch 256)
KV_QUANT = {None: 0, "fp8": 1, "int8": 2}  # kv_quant -> the kernels' KV_QUANT constexpr


# None: PTX code conversions on CUDA (not under the interpreter), portable Triton ops elsewhere.
# Tests set it to False to run the portable path on a CUDA GPU.
PTX_CONVERSIONS = None


def use_ptx(device: torch.device) -> bool:
    if PTX_CONVERSIONS is not None:
        return bool(PTX_CONVERSIONS)
    # an emulated DCU (VLLM_DCU_EMULATE_ARCH) takes the portable conversions, as the DCU does
    return device.type == "cuda" and torch.version.hip is None and not launch_params.current_target(device).startswith(
        ("interpreter", "gfx"))


def split_kernel_launch(launch: dict, block_size: int, kv_quant: int, v_by_dim: bool = False) -> tuple[dict, dict]:
    """A kv16 / kv8 launch entry as _decode_split_kernel takes it: (constexprs, Triton options). Shared by the
    launcher and compile_check, so both compile the same kernel. split_round is the host's split plan (split_plan);
    page_loop needs pages of at least BLOCK_N tokens; int8_qk and the kv8 entry's own "int8" options apply to int8
    caches only (kv_quant 2: the kv8 entry also serves fp8 caches). v_by_dim: V's tokens are contiguous (an int8
    cache's pages, kv_quant.layout.V_BY_DIM), so an int8 cache takes the int8 x int8 P x V path (INT8_PV). balance
    compiles the balanced plan in; the launch turns it on where the batch has more than one sequence and splits are
    not forced (balance_programs > 0), and there it spreads tiles as even_splits does whatever even_splits says."""
    options = {k: v for k, v in launch.items() if k != "int8"}
    if kv_quant == 2:
        options.update(launch.get("int8", {}))
    defaults = launch_params.LAUNCH_DEFAULTS
    balance = bool(options.pop("balance", defaults["balance"]))
    for host_only in ("split_round", "programs_per_cu", "min_split_tokens", "gluon"):
        options.pop(host_only, None)
    block_n = options.pop("BLOCK_N")
    early_convert = options.pop("early_convert", defaults["early_convert"])
    consts = dict(BLOCK_N=block_n, PAGE_GE_TILE=block_size >= block_n,
                  PAGE_LOOP=bool(options.pop("page_loop", defaults["page_loop"])) and block_size >= block_n,
                  K_PURE=early_convert < 2, V_PURE=early_convert < 1,
                  INT8_QK=bool(options.pop("int8_qk", defaults["int8_qk"])) and kv_quant == 2,
                  INT8_PV=kv_quant == 2 and v_by_dim, V_CONTIG=kv_quant != 0 and v_by_dim,
                  Q_EARLY=bool(options.pop("q_early", defaults["q_early"])) and kv_quant != 0,
                  EVEN_SPLITS=bool(options.pop("even_splits", defaults["even_splits"])),
                  BALANCE=balance, BATCH_CHUNK=BATCH_CHUNK)
    return consts, options


class SplitPlan(NamedTuple):
    launch: dict  # the width's launch entry (split_kernel_launch's input)
    splits: int  # grid z and workspace rows per sequence; balance: the kernel's cap on one sequence's splits
    min_split: int
    programs: int  # balance: programs per kv head the batch's sequences share (grid x: programs + batch); else 0

    def rows(self, batch: int) -> int:
        """Workspace rows (splits) per kv head."""
        return self.programs + batch if self.programs else batch * self.splits

    def plan_ints(self, batch: int) -> int:
        """int32 workspace elements stage 1 hands stage 2 (balance: each sequence's first row and split count), padded
        to 16 bytes so the partial outputs after them stay 16-byte aligned at every batch size (Triton specializes on
        a pointer's alignment: an odd batch would otherwise compile another kernel mid-run)."""
        return -(-2 * batch // 4) * 4 if self.programs else 0

    def numel(self, batch: int, num_q_heads: int, head_dim: int) -> int:
        """float32 workspace elements: the plan's ints, then each row's partial output and log-sum-exp."""
        return self.plan_ints(batch) + self.rows(batch) * num_q_heads * (head_dim + 1)


def split_plan(batch, num_q_heads, num_kv_heads, head_dim, device, num_splits, kv8, gluon=False) -> SplitPlan:
    """The launch and split plan; gluon: for the Gluon stage 1, the kv8 entry's ``gluon`` launch over its own."""
    target = launch_params.current_target(device)
    entry = launch_params.get_params(target)
    launch = dict(entry["kv8" if kv8 else "kv16"])
    if gluon:
        launch.update(launch.pop("gluon"))
        launch.pop("int8", None)
    round_down = launch.get("split_round", launch_params.LAUNCH_DEFAULTS["split_round"]) == "down"
    programs = 0
    if num_splits is None:
        per_cu = {"programs_per_cu": launch.pop("programs_per_cu", entry["programs_per_cu"])}  # this width's own
        splits = launch_params.num_splits(batch, num_kv_heads, num_compute_units(device), {**entry, **per_cu},
                                          round_down)
        min_split = launch.pop("min_split_tokens", entry["min_split_tokens"])  # this width's own, if it sets one
        if batch > 1 and launch.get("balance", launch_params.LAUNCH_DEFAULTS["balance"]):
            # the programs the plan without balance launches for this batch, shared out by length (the same plan
            # where every sequence is as long); one sequence has nothing to share, so it keeps that plan (in the
            # same compiled kernel: programs 0)
            programs, splits = batch * splits, entry["max_splits"]
    else:
        splits, min_split = int(num_splits), 1  # exactly min(num_splits, tiles) splits per sequence
    lds = entry["lds_limit"]
    for tiles in (launch, {**launch, **launch.get("int8", {})}) if lds is not None else ():
        need = launch_params.lds_bytes(tiles["BLOCK_N"], triton.next_power_of_2(head_dim), tiles["num_stages"])
        if need > lds:
            raise ValueError(
                f"decode-attention params for {target}: BLOCK_N={tiles['BLOCK_N']} num_stages={tiles['num_stages']} "
                f"need ~{need} B of LDS at head_dim {head_dim}, limit {lds} B; lower BLOCK_N or num_stages"
            )
    return SplitPlan(launch, splits, min_split, programs)


def workspace_numel(batch: int, num_q_heads: int, num_kv_heads: int, head_dim: int, device, kv8: bool = False,
                    num_splits: int | None = None) -> int:
    """float32 elements of workspace ``decode_attention`` needs for a batch of this size (for
    preallocating one buffer for the largest batch a CUDA graph captures)."""
    device = torch.device(device)
    plans = [split_plan(batch, num_q_heads, num_kv_heads, head_dim, device, num_splits, kv8)]
    if kv8 and launch_params.get_params(launch_params.current_target(device))["kv8"].get("gluon"):
        plans.append(split_plan(batch, num_q_heads, num_kv_heads, head_dim, device, num_splits, kv8, gluon=True))
    return max(plan.numel(batch, num_q_heads, head_dim) for plan in plans)  # 8-bit calls may take the Gluon plan


HEAD_DIMS_GLUON = (256,)  # the head sizes the Gluon stage 1 is written for (the one shape its GPU tests cover)


def gluon_supported(kv_quant: int, ptx: bool, v_by_dim: bool, head_dim: int, group: int, block_size: int,
                    block_n: int, num_stages: int, v_dim_stride: int = 1) -> bool:
    """Whether the Gluon stage 1 takes this call (gluon_stage1's docstring says why each condition; a ring needs two
    stages; V is read by token as byte pairs of a token's dims, so its head_dim stride, v_dim_stride, must be 1)."""
    from .gluon_stage1 import GLUON  # whether this Triton has Gluon (the DCU's may not)

    layout = (kv_quant == 1 and not v_by_dim and v_dim_stride == 1) or (kv_quant == 2 and v_by_dim)
    return (GLUON and ptx and layout and head_dim in HEAD_DIMS_GLUON
            and group <= BLOCK_H and block_size >= block_n and block_size % 16 == 0 and block_n in (64, 128)
            and num_stages >= 2)


def takes_gluon(device, kv_quant, ptx, v_by_dim, v_dim_stride, head_dim, group, block_size) -> bool:
    """Launch key gluon (kv8): an 8-bit call runs gluon_stage1's kernel, with the entry's ``gluon`` launch, where
    that kernel covers it (gluon_supported: CUDA PTX conversions, the kind's own V layout, pages of at
    least its BLOCK_N, ...); every other call takes the Triton kernel."""
    if kv_quant is None or not ptx:
        return False
    launch = launch_params.get_params(launch_params.current_target(device))["kv8"].get("gluon")
    if not launch:
        return False
    return gluon_supported(KV_QUANT[kv_quant], ptx, v_by_dim, head_dim, group, block_size, launch["BLOCK_N"],
                           launch["num_stages"], v_dim_stride)


def launch_decision(q, k_cache, v_cache, kv_quant, num_splits):
    """(the split plan, whether the Gluon stage 1 takes the call, V by dim, PTX code conversions) for these tensors."""
    batch, hq, d = q.shape
    _, block_size, hkv, _ = k_cache.shape
    ptx = kv_quant is not None and use_ptx(q.device)
    v_by_dim = v_cache.stride(1) == 1
    gluon = takes_gluon(q.device, kv_quant, ptx, v_by_dim, v_cache.stride(3), d, hq // hkv, block_size)
    return split_plan(batch, hq, hkv, d, q.device, num_splits, kv_quant is not None, gluon), gluon, v_by_dim, ptx


def launch_plan(q, k_cache, v_cache, kv_quant, num_splits=None) -> tuple[SplitPlan, bool]:
    """(the split plan, whether the Gluon stage 1 takes the call), as decode_attention decides them for these
    tensors (the bench's table labels its rows with them)."""
    return launch_decision(q, k_cache, v_cache, kv_quant, num_splits)[:2]
