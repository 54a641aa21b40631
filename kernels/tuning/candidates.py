"""Launch candidates around a table entry, for the tuning command's ``--full`` sweep (``python -m vllm.dcu.tune``).

Each candidate is an override object in the format of its family's variable (VLLM_DCU_DECODE_PARAMS,
VLLM_DCU_PREFILL_PARAMS; the GEMV's are per-bucket launch dicts, kernels/gemv/launch_params.py) that changes one
knob of the entry, or a set the H200's measurements found together (8-bit decode, the GEMV at two rows): every one
is a Triton compile, so the neighbourhood is small (decode: <= 12 per width, prefill:
<= 8 per width, GEMV: <= 7 per shape and row bucket). Whether a candidate is valid is the family's get_params /
check_config's call, not this module's. Python over the launch tables: shipped with the kernels (the benchmarks
are not).
"""
from __future__ import annotations

from ..decode_attention import launch_params as decode_params
from ..gemv.launch_params import FMA_TWO_ROWS  # the two-row FMA launch sm90's table uses for four shapes
from ..targets import ROCM_ONLY_OPTIONS as ROCM_ONLY  # the launch tables' one list


# The 8-bit Triton launch's options as sm90's measured entry sets them (kernels/decode_attention/launch_params.py's
# notes: pages in an outer loop 0.85x the time with the stages it allows, even splits 0.97x, int8 x int8 QK^T 0.95x for
# int8, splits rounded down with them): an entry without them (the DCU's, chosen on paper) tries each alone and all
# together, so a device's sweep can find what the H200's did. early_convert is left out (PTX conversions, CUDA only).
KV8_MEASURED_OPTIONS = {k: decode_params.PARAMS["sm90"]["kv8"][k]
                        for k in ("page_loop", "even_splits", "int8_qk", "split_round")}


def _pow2_steps(value: int, lo: int, hi: int) -> list:
    return [v for v in (value // 2, value * 2) if lo <= v <= hi and v != value]


def decode_candidates(entry: dict, width: str, rocm_options: bool) -> list:
    """(label, override) pairs around ``entry[width]`` (a decode launch_params entry, width "kv16" / "kv8"):
    BLOCK_N halved / doubled, the other num_warps of 4 / 8, num_stages -1 / +1, launch key balance flipped; kv8:
    without its int8 options, without the Gluon stage 1 (the Triton kernel for every 8-bit call), and, where the
    Triton launch lacks them, KV8_MEASURED_OPTIONS one by one, together, and together with int8 at 2 stages; on ROCm
    waves_per_eu 1 / 2."""
    launch = entry[width]
    out = []
    for bn in _pow2_steps(launch["BLOCK_N"], 16, 128):
        out.append((f"BLOCK_N {bn}", {width: {"BLOCK_N": bn}}))
    warps = 8 if launch["num_warps"] != 8 else 4
    out.append((f"{warps} warps", {width: {"num_warps": warps}}))
    for st in (launch["num_stages"] - 1, launch["num_stages"] + 1):
        if 1 <= st <= 4:
            out.append((f"{st} stages", {width: {"num_stages": st}}))
    bal = 0 if launch.get("balance", 0) else 1
    if not (bal == 0 and launch.get("gluon")):  # the Gluon stage 1 takes the balanced plan only (launch_params)
        out.append((f"balance {bal}", {width: {"balance": bal}}))
    if width == "kv8" and launch.get("int8"):
        out.append(("no int8 options", {width: {"int8": None}}))
    if width == "kv8" and launch.get("gluon"):
        out.append(("no gluon", {width: {"gluon": None}}))
    if width == "kv8":
        missing = {k: v for k, v in KV8_MEASURED_OPTIONS.items() if launch.get(k) != v}
        out += [(f"{k} {v}", {width: {k: v}}) for k, v in missing.items()]
        if len(missing) > 1:
            out.append(("sm90's kv8 options", {width: dict(missing)}))
            int8 = launch.get("int8") or {}
            if missing.get("page_loop") and launch["num_stages"] == 1 and "num_stages" not in int8:
                # pages in an outer loop pay with a tile in flight: int8 (the lighter of the two in registers once
                # its QK^T is int8 x int8) at 2 stages; fp8's software decode keeps 1 (an override's int8 object
                # replaces the entry's: its own options go along)
                out.append(("sm90's kv8 options, int8 2 stages",
                            {width: {**missing, "int8": {**int8, "num_stages": 2}}}))
    if rocm_options:
        we = 1 if launch.get("waves_per_eu", 0) == 2 else 2
        out.append((f"waves_per_eu {we}", {width: {"waves_per_eu": we}}))
    return out


def prefill_candidates(entry: dict, width: str, rocm_options: bool) -> list:
    """(label, override) pairs around ``entry[width]`` (a prefill launch_params entry, width "kv16" / "kv8" /
    "kv8_short"): BLOCK_M and BLOCK_N halved / doubled, the other num_warps of 4 / 8, num_stages -1 / +1; on ROCm
    waves_per_eu 1 / 2."""
    launch = entry[width]
    out = []
    for key in ("BLOCK_M", "BLOCK_N"):
        for v in _pow2_steps(launch[key], 16, 128):
            out.append((f"{key} {v}", {width: {key: v}}))
    warps = 8 if launch["num_warps"] != 8 else 4
    out.append((f"{warps} warps", {width: {"num_warps": warps}}))
    for st in (launch["num_stages"] - 1, launch["num_stages"] + 1):
        if 1 <= st <= 4:
            out.append((f"{st} stages", {width: {"num_stages": st}}))
    if rocm_options:
        we = 1 if launch.get("waves_per_eu", 0) == 2 else 2
        out.append((f"waves_per_eu {we}", {width: {"waves_per_eu": we}}))
    return out


def gemv_candidates(config: dict, bucket: int) -> list:
    """(label, launch dict) pairs around one row bucket's GEMV launch ``config`` (kernels/gemv/launch_params.py
    format): BLOCK_N and BLOCK_K halved / doubled (BLOCK_N >= 16 on the dot path), the other num_warps of 4 / 8, at
    one row the K loop pipelined 3 deep or plain (K_STAGES 3 / 1), at two rows on the dot path FMA_TWO_ROWS.
    Candidates are complete launch dicts, checked by the caller."""
    out = []
    min_bn = 16 if config["DOT"] else 1
    for key, lo, hi in (("BLOCK_N", min_bn, 128), ("BLOCK_K", 16, 1024)):
        for v in _pow2_steps(config[key], lo, hi):
            out.append((f"{key} {v}", {**config, key: v}))
    warps = 8 if config["num_warps"] != 8 else 4
    out.append((f"{warps} warps", {**config, "num_warps": warps}))
    if bucket == 1:  # an override cannot drop a key: K_STAGES 1 is the plain loop
        stages = 1 if config.get("K_STAGES", 1) > 1 else 3
        out.append((f"K_STAGES {stages}", {**config, "K_STAGES": stages}))
    if bucket == 2 and config["DOT"]:
        out.append(("FMA, K_STAGES 4", {**config, **FMA_TWO_ROWS}))
    return out


def diff(base: dict, chosen: dict) -> dict:
    """The keys of ``chosen`` whose values differ from ``base`` (what an override needs to carry)."""
    return {k: v for k, v in chosen.items() if base.get(k) != v}


def merge(*overrides: dict) -> dict:
    """Override objects merged left to right, one level of nesting deep (a width's / bucket's object is merged
    key by key)."""
    out: dict = {}
    for ov in overrides:
        for k, v in ov.items():
            if isinstance(v, dict) and isinstance(out.get(k), dict):
                out[k] = {**out[k], **v}
            else:
                out[k] = dict(v) if isinstance(v, dict) else v
    return out
