"""Launch parameters of the decode GEMV (gemv.py), as data: one entry per target.

``measured`` says whether an entry comes from bench.py on that target (it prints a suggested entry)
or was chosen on paper.

Keys of an entry:
  programs_per_cu, max_splits, min_split_k
              split-K policy: when N alone gives fewer than programs_per_cu x (SMs / CUs) programs,
              K is split (at most max_splits ways, no split shorter than min_split_k elements);
              the splits' fp32 partial sums are added in a fixed order by a second small kernel;
  rows        launch options per row bucket ("1", "2", "4", "8": rows 3-4 use "4", 5-8 use "8"):
                DOT         0: fp32 FMA into a register tile reduced once after the K loop,
                            1: tl.dot with x padded to 16 rows (registers do not grow with rows);
                BLOCK_N     rows of W (output columns) per program (DOT: >= 16);
                BLOCK_K     K elements per loop step (16-byte vector loads along K);
                num_warps, num_stages, and on ROCm waves_per_eu, matrix_instr_nonkdim;
                SPLIT_K     optional: force this many K splits (else the policy above);
                K_STAGES    optional: the K loop as tl.range(num_stages=K_STAGES): Triton pipelines the
                            W loads through shared memory (async copies on sm90), on the FMA path too,
                            so K_STAGES - 1 tiles per program stay in flight;
  silu_rows   the same for the gate_up GEMV fused with SiLU-and-mul, which streams two W tiles (gate
              and up) per step and keeps two accumulators;
  shapes      optional per-shape overrides, "NxK" (or "NxK+silu" for the fused kernel) ->
              {"1": {...}, ...}, merged over ``rows`` / ``silu_rows`` (bench.py suggests them where
              they pay).

``VLLM_DCU_GEMV_PARAMS`` (JSON) overrides values for the current target without editing this file:
``'{"BLOCK_K": 256}'`` (every row bucket), ``'{"rows": {"1": {"DOT": 1, "BLOCK_N": 16}}}'``,
``'{"silu_rows": {"1": {"BLOCK_N": 4}}}'``, ``'{"programs_per_cu": 4}'``,
``'{"shapes": {"5120x6144": {"1": {"SPLIT_K": 2}}}}'``,
``'{"waves_per_eu": null}'`` (drop a ROCm option a Triton build does not accept). A bad value fails
with one error naming the key. The dispatch's cache is keyed by the entry in effect, so a changed
override re-measures.
"""
import json

from ..targets import ROCM_ONLY_OPTIONS, cached_entry, parse_override_object, target_for

ENV_VAR = "VLLM_DCU_GEMV_PARAMS"
MAX_ROWS = 8
# (name, N, K, fused SiLU-and-mul): every dense decode GEMM of Qwen3.5-27B at TP 1 (the bench's shapes and the tuning
# command's named shape set, python -m vllm.dcu.tune --model qwen3.5-27b)
QWEN35_27B_GEMMS = (
    ("in_proj_qkvz", 16384, 5120, False),
    ("in_proj_ba", 96, 5120, False),
    ("attn qkv+gate", 14336, 5120, False),
    ("o_proj / out_proj", 5120, 6144, False),
    ("gate_up", 34816, 5120, False),
    ("down", 5120, 17408, False),
    ("lm_head", 248320, 5120, False),
    ("gate_up + silu_mul", 34816, 5120, True),
)
ROW_BUCKETS = (1, 2, 4, 8)

_SPLIT_KEYS = ("programs_per_cu", "max_splits", "min_split_k")
_LAUNCH_KEYS = ("DOT", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages", "SPLIT_K", "K_STAGES", "waves_per_eu",
                "matrix_instr_nonkdim")
_ROCM_ONLY = ROCM_ONLY_OPTIONS
_REQUIRED = ("DOT", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages")
# FMA path: fp32 accumulator elements per lane (BLOCK_M x BLOCK_N x BLOCK_K / lanes); above this the
# accumulator no longer fits in registers next to the loaded tiles
_MAX_FMA_ACC_PER_LANE = 128


def row_bucket(rows: int) -> int:
    """The row bucket (1, 2, 4, 8) whose compiled kernel serves ``rows`` (1..8)."""
    if not 1 <= rows <= MAX_ROWS:
        raise ValueError(f"gemv: rows must be 1..{MAX_ROWS}, got {rows}")
    return 1 << (rows - 1).bit_length()


def shape_name(n: int, k: int, silu_mul: bool = False) -> str:
    return f"{n}x{k}" + ("+silu" if silu_mul else "")


# H200 (sm90: 132 SMs, 32-lane warps, 228 KiB shared memory per SM). Chosen on paper, to be
# replaced by bench.py's sweep (python -m kernels.gemv.bench prints the measured entry):
# - 1 row: FMA, 16 rows x 512 K per step = 16 KiB of W per program in flight, 64 values per lane
#   (eight 16-byte loads), 64 fp32 accumulators per lane; 5120-row layers get 320 programs
#   (2.4 per SM), so no split and no second kernel. Compiled for sm90 with Triton 3.6
#   (compile_check.py): 128 registers, no spills. num_stages 1: Triton pipelines only the loads
#   that feed tl.dot (no async copies in this path at any num_stages).
# - 2-8 rows: tl.dot over x padded to 16 rows (masked: the padding costs no memory traffic), W
#   streamed through shared memory with async copies 3 stages deep (16 x 256 bf16 = 8 KiB of W per
#   stage): 48 registers, 32 KiB shared memory (48 KiB fused).
# H200: the sweep of kernels/gemv/bench.py on 2026-12-02 (bench/results/2026-12-02-nvidia-h200-gemv.md), every
# Qwen3.5-27B decode shape at 1/2/4/8 rows under CUDA graphs; per-shape entries where a shape's best differed.
# 2 rows on the FMA path with the K loop pipelined 4 deep: beat the dot path for four shapes (see "shapes" below); the
# tuning sweep offers it at two rows wherever the entry takes the dot path (kernels/tuning/candidates.py)
FMA_TWO_ROWS = {"DOT": 0, "BLOCK_N": 8, "BLOCK_K": 256, "num_stages": 1, "K_STAGES": 4}
_SM90 = {
    "measured": True,
    "programs_per_cu": 2,
    "max_splits": 16,
    "min_split_k": 512,
    "rows": {
        "1": {"DOT": 0, "BLOCK_N": 8, "BLOCK_K": 512, "num_warps": 4, "num_stages": 1},
        "2": {"DOT": 1, "BLOCK_N": 32, "BLOCK_K": 256, "num_warps": 4, "num_stages": 3},
        "4": {"DOT": 1, "BLOCK_N": 32, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4},
        "8": {"DOT": 1, "BLOCK_N": 32, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4},
    },
    # fused gate_up: half the rows per program at one row (two W tiles per step)
    "silu_rows": {
        "1": {"DOT": 0, "BLOCK_N": 4, "BLOCK_K": 512, "num_warps": 4, "num_stages": 1},
        "2": {"DOT": 1, "BLOCK_N": 32, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4},
        "4": {"DOT": 1, "BLOCK_N": 32, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4},
        "8": {"DOT": 1, "BLOCK_N": 32, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4},
    },
    "shapes": {
        "96x5120": {"1": {"SPLIT_K": 16}, "2": {"BLOCK_K": 512, "BLOCK_N": 8, "DOT": 0, "SPLIT_K": 16, "num_stages": 1}},
        "14336x5120": {"1": {"BLOCK_K": 256, "BLOCK_N": 16}},
        # K loop pipelined 3 deep at one row (same tiles): python -m kernels.gemv.bench --variants, 2026-12-02,
        # one call, % of the eagerly timed copy bandwidth (4220 GB/s): 5120x6144 18.0 us (83%) vs 18.2 us (82%)
        # without, cuBLAS 19.7 us (76%); 5120x17408 42.9 us (98%) vs 44.5 us (95%), cuBLAS 49.6 us (85%).
        # No gain at 16384x5120 (43.2 vs 42.4 us) or 14336x5120 (37.1 vs 37.0); 2-8 rows (DOT 32x128,
        # K_STAGES 6) 1.22-1.35x cuBLAS's time against the table's 1.02-1.07x. The plain sweep does not try
        # K_STAGES (--variants does): keep these two entries when pasting a sweep's suggested shapes.
        # 2 rows: the FMA path with a pipelined K loop beat the dot path (x padded to 16 rows; at N = 5120 its 160
        # tiles also split K in two, a second kernel) for four shapes, each side interleaved with cuBLAS in one call
        # (python -m kernels.gemv.bench --variants --rows 1,2,4,8 --try ..., ninth session,
        # bench/results/2026-12-02-nvidia-h200-gemv-variants-tries.md): 5120x6144 19.1 vs 20.7 us (cuBLAS 19.4),
        # 5120x17408 44.2 vs 47.3 (49.9), 34816x5120 86.1 vs 90.2 (87.9), fused gate_up 88.1 vs 90.8 (88.1). Not at
        # 4-8 rows (its [rows, BLOCK_N, BLOCK_K] accumulator: 1.1-2.5x the dot path's time), nor for 16384x5120
        # (45.4 vs 42.7) or 14336x5120 (within 1.5%).
        "5120x6144": {"1": {"K_STAGES": 3}, "2": FMA_TWO_ROWS},
        "5120x17408": {"1": {"K_STAGES": 3}, "2": FMA_TWO_ROWS},
        "34816x5120": {"2": {"DOT": 0, "BLOCK_N": 8, "BLOCK_K": 512, "num_stages": 1, "K_STAGES": 3},
                       "4": {"BLOCK_N": 64}, "8": {"BLOCK_N": 64}},
        "34816x5120+silu": {"2": FMA_TWO_ROWS},
    },
}

# DCU (gfx936 BW1000 / gfx928 K100-AI): wave64, 64 KiB LDS per workgroup, no measurement yet.
# Chosen on paper:
# - 1 row: FMA. num_warps 4 = 4 wave64 = 256 lanes; 16 rows x 512 K per step is 32 bf16 per
#   lane (four 16-byte loads in flight per lane; the peer team's strided-K GEMV used 16-byte chunks
#   too), 32 fp32 accumulators per lane; no LDS beyond the final reduction (num_stages 1: AMD's
#   pipeliner would stage loads through LDS, which a pure stream does not need). Compiled with
#   Triton 3.6 for gfx90a (the closest wave64 target upstream LLVM knows): 96 VGPRs, no spills,
#   1 KiB LDS; the fused gate_up kernel 160 VGPRs.
# - 2-8 rows: tl.dot (16x16x16 bf16 MMAC, matrix_instr_nonkdim 16) with x padded to 16 rows (the
#   padding rows are masked: no memory traffic). For gfx90a: 92 VGPRs, 16 KiB LDS (24 KiB fused),
#   so several workgroups share a CU's 64 KiB. The FMA path at 2 rows went through 16 KiB of LDS
#   too (a layout conversion of the 3-D product) with 136 VGPRs, 238 fused: no better.
# - split-K for 2 programs per CU, as on the H200 (the CU count comes from the device).
_DCU = {
    "measured": False,
    "programs_per_cu": 2,
    "max_splits": 16,
    "min_split_k": 512,
    "rows": {
        "1": {"DOT": 0, "BLOCK_N": 16, "BLOCK_K": 512, "num_warps": 4, "num_stages": 1},
        "2": {"DOT": 1, "BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 2, "matrix_instr_nonkdim": 16},
        "4": {"DOT": 1, "BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 2, "matrix_instr_nonkdim": 16},
        "8": {"DOT": 1, "BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 2, "matrix_instr_nonkdim": 16},
    },
    "silu_rows": {
        "1": {"DOT": 0, "BLOCK_N": 16, "BLOCK_K": 512, "num_warps": 4, "num_stages": 1},
        "2": {"DOT": 1, "BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 2, "matrix_instr_nonkdim": 16},
        "4": {"DOT": 1, "BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 2, "matrix_instr_nonkdim": 16},
        "8": {"DOT": 1, "BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 2, "matrix_instr_nonkdim": 16},
    },
    "shapes": {},
}

PARAMS = {
    "sm90": _SM90,
    "gfx936": _DCU,
    "gfx928": _DCU,
    # anything else: values valid on every target of the kind
    "cuda": {
        "measured": False,
        "programs_per_cu": 2,
        "max_splits": 16,
        "min_split_k": 512,
        "rows": {
            "1": {"DOT": 0, "BLOCK_N": 16, "BLOCK_K": 256, "num_warps": 4, "num_stages": 1},
            "2": {"DOT": 1, "BLOCK_N": 16, "BLOCK_K": 128, "num_warps": 4, "num_stages": 2},
            "4": {"DOT": 1, "BLOCK_N": 16, "BLOCK_K": 128, "num_warps": 4, "num_stages": 2},
            "8": {"DOT": 1, "BLOCK_N": 16, "BLOCK_K": 128, "num_warps": 4, "num_stages": 2},
        },
        "silu_rows": {
            "1": {"DOT": 0, "BLOCK_N": 8, "BLOCK_K": 256, "num_warps": 4, "num_stages": 1},
            "2": {"DOT": 1, "BLOCK_N": 16, "BLOCK_K": 128, "num_warps": 4, "num_stages": 2},
            "4": {"DOT": 1, "BLOCK_N": 16, "BLOCK_K": 128, "num_warps": 4, "num_stages": 2},
            "8": {"DOT": 1, "BLOCK_N": 16, "BLOCK_K": 128, "num_warps": 4, "num_stages": 2},
        },
        "shapes": {},
    },
    "rocm": _DCU,
    # Triton CPU interpreter (tests): small tiles so small shapes cover several tiles and splits
    "interpreter": {
        "measured": False,
        "programs_per_cu": 4,
        "max_splits": 4,
        "min_split_k": 16,
        "rows": {
            "1": {"DOT": 0, "BLOCK_N": 4, "BLOCK_K": 16, "num_warps": 1, "num_stages": 1},
            "2": {"DOT": 0, "BLOCK_N": 4, "BLOCK_K": 16, "num_warps": 1, "num_stages": 1},
            "4": {"DOT": 1, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 1, "num_stages": 1},
            "8": {"DOT": 1, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 1, "num_stages": 1},
        },
        "silu_rows": {
            "1": {"DOT": 0, "BLOCK_N": 4, "BLOCK_K": 16, "num_warps": 1, "num_stages": 1},
            "2": {"DOT": 0, "BLOCK_N": 4, "BLOCK_K": 16, "num_warps": 1, "num_stages": 1},
            "4": {"DOT": 1, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 1, "num_stages": 1},
            "8": {"DOT": 1, "BLOCK_N": 16, "BLOCK_K": 16, "num_warps": 1, "num_stages": 1},
        },
        "shapes": {},
    },
}

def current_target(device=None) -> str:
    """Key into PARAMS for the device: 'sm90', 'gfx936', ..., a generic 'cuda' / 'rocm', or 'interpreter'."""
    return target_for(PARAMS, device)


def _is_pow2(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1 and not v & (v - 1)


def check_config(cfg: dict, where: str, rocm: bool | None = None, rows: int | None = None, silu_mul=False) -> dict:
    """Validate one launch-options dict (a row bucket's, or a test's / benchmark's); returns it.
    ``rows`` (a bucket) enables the FMA register check, ``rocm`` the ROCm-only option check."""
    unknown = sorted(set(cfg) - set(_LAUNCH_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {list(_LAUNCH_KEYS)}")
    missing = [k for k in _REQUIRED if k not in cfg]
    if missing:
        raise ValueError(f"{where}: missing {missing}")
    if cfg["DOT"] not in (0, 1) or isinstance(cfg["DOT"], float):
        raise ValueError(f"{where}: DOT must be 0 (FMA) or 1 (tl.dot), got {cfg['DOT']!r}")
    min_bn = 16 if cfg["DOT"] else 1
    if not _is_pow2(cfg["BLOCK_N"]) or cfg["BLOCK_N"] < min_bn:
        raise ValueError(f"{where}: BLOCK_N must be a power of two >= {min_bn}, got {cfg['BLOCK_N']!r}")
    if not _is_pow2(cfg["BLOCK_K"]) or cfg["BLOCK_K"] < 16:
        raise ValueError(f"{where}: BLOCK_K must be a power of two >= 16, got {cfg['BLOCK_K']!r}")
    if not _is_pow2(cfg["num_warps"]) or cfg["num_warps"] > 16:
        raise ValueError(f"{where}: num_warps must be 1, 2, 4, 8 or 16, got {cfg['num_warps']!r}")
    for key in ("num_stages", "SPLIT_K", "K_STAGES"):
        if key in cfg and (not isinstance(cfg[key], int) or isinstance(cfg[key], bool) or cfg[key] < 1):
            raise ValueError(f"{where}: {key} must be a positive integer, got {cfg[key]!r}")
    for key in _ROCM_ONLY:
        if key in cfg:
            if rocm is False:
                raise ValueError(f"{where}: {key} is a ROCm-only option")
            if not isinstance(cfg[key], int) or isinstance(cfg[key], bool) or cfg[key] < 0:
                raise ValueError(f"{where}: {key} must be a non-negative integer, got {cfg[key]!r}")
    if rows is not None and not cfg["DOT"]:
        lanes = cfg["num_warps"] * (64 if rocm else 32)
        per_lane = rows * cfg["BLOCK_N"] * cfg["BLOCK_K"] * (2 if silu_mul else 1) // lanes
        if per_lane > _MAX_FMA_ACC_PER_LANE:
            twice = " x 2 (silu_mul)" if silu_mul else ""
            raise ValueError(
                f"{where}: the FMA accumulator would need {per_lane} fp32 registers per lane "
                f"({rows} rows x BLOCK_N {cfg['BLOCK_N']} x BLOCK_K {cfg['BLOCK_K']}{twice} / {lanes} lanes), "
                f"limit {_MAX_FMA_ACC_PER_LANE}: lower BLOCK_N or BLOCK_K, raise num_warps, or use DOT 1")
    return cfg


def _parse_override(text: str) -> dict:
    allowed = set(_SPLIT_KEYS) | set(_LAUNCH_KEYS) | {"rows", "silu_rows", "shapes"}
    return parse_override_object(ENV_VAR, text, allowed)


def _bucket_dicts(val, where: str) -> dict:
    if not isinstance(val, dict) or set(val) - {str(b) for b in ROW_BUCKETS}:
        raise ValueError(f"{where} must be an object with row-bucket keys from {[str(b) for b in ROW_BUCKETS]}")
    for b, cfg in val.items():
        if not isinstance(cfg, dict):
            raise ValueError(f"{where}['{b}'] must be an object of launch options")
    return val


_CACHE: dict = {}


def get_params(target: str, override: str | None = None) -> dict:
    """The entry for ``target`` with ``VLLM_DCU_GEMV_PARAMS`` (or ``override``) applied; validated.
    Callers must not modify the returned dict (it is cached per target and override text)."""
    from ..tuning.decisions import launch_override  # the tuned file's layer (imported on first use, as before)

    return cached_entry(_CACHE, ENV_VAR, _build_params, target, override, family="gemv", tuned_override=launch_override)


def _build_params(target: str, text: str, base: dict | None = None) -> dict:
    if target not in PARAMS:
        raise ValueError(f"no gemv launch parameters for target {target!r}; known: {sorted(PARAMS)}")
    # deep copy; base: the entry with the tuned file's override (targets.py)
    entry = json.loads(json.dumps(PARAMS[target] if base is None else base))
    where = f"gemv params for {target}"
    if text.strip():
        ov = _parse_override(text)
        where += f" with {ENV_VAR}={text}"
        for key, val in ov.items():
            if key in _SPLIT_KEYS:
                entry[key] = val
            elif key in _LAUNCH_KEYS:
                for cfg in (*entry["rows"].values(), *entry["silu_rows"].values()):
                    cfg[key] = val
            elif key in ("rows", "silu_rows"):
                for b, cfg in _bucket_dicts(val, f"{ENV_VAR} '{key}'").items():
                    entry[key][b].update(cfg)
            else:  # shapes
                if not isinstance(val, dict):
                    raise ValueError(f"{ENV_VAR}: 'shapes' must be an object of 'NxK' -> row-bucket objects")
                for name, per_bucket in val.items():
                    shape = entry["shapes"].setdefault(name, {})
                    for b, cfg in _bucket_dicts(per_bucket, f"{ENV_VAR} 'shapes'['{name}']").items():
                        shape.setdefault(b, {}).update(cfg)
        entry["measured"] = False
    rocm = target.startswith("gfx") or target == "rocm"
    for key in _SPLIT_KEYS:
        val = entry[key]
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise ValueError(f"{where}: {key} must be a positive integer, got {val!r}")
    _drop_nulls(entry, where)
    for b in ROW_BUCKETS:
        check_config(entry["rows"][str(b)], f"{where}: rows['{b}']", rocm=rocm, rows=b)
        check_config(entry["silu_rows"][str(b)], f"{where}: silu_rows['{b}']", rocm=rocm, rows=b, silu_mul=True)
    for name, per_bucket in entry["shapes"].items():
        silu = name.endswith("+silu")
        dims = name[: -len("+silu")] if silu else name
        parts = dims.split("x")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ValueError(f"{where}: shape key {name!r} must look like '16384x5120' or '34816x5120+silu'")
        for b, cfg in per_bucket.items():
            base = entry["silu_rows" if silu else "rows"][b]
            check_config({**base, **cfg}, f"{where}: shapes['{name}']['{b}']", rocm=rocm, rows=int(b), silu_mul=silu)
    return entry


def _drop_nulls(entry: dict, where: str):
    """null drops an option (e.g. one a Triton build does not know); only ROCm-only options may go."""
    cfgs = [*entry["rows"].values(), *entry["silu_rows"].values(), *(c for s in entry["shapes"].values()
                                                                      for c in s.values())]
    for cfg in cfgs:
        for key in [k for k, v in cfg.items() if v is None]:
            if key not in _ROCM_ONLY:
                raise ValueError(f"{where}: only {list(_ROCM_ONLY)} can be dropped with null, not {key}")
            del cfg[key]


def config_for(target: str, n: int, k: int, rows: int, silu_mul: bool = False, entry: dict | None = None) -> dict:
    """Launch options for one call: the row bucket's, with the shape's override merged over them."""
    entry = entry if entry is not None else get_params(target)
    b = str(row_bucket(rows))
    cfg = dict(entry["silu_rows" if silu_mul else "rows"][b])
    cfg.update(entry["shapes"].get(shape_name(n, k, silu_mul), {}).get(b, {}))
    return cfg


def num_splits(n_tiles: int, k: int, block_k: int, num_cus: int, entry: dict) -> int:
    """K splits of a launch with ``n_tiles`` programs along N: enough programs for
    programs_per_cu x num_cus, at most max_splits, no split shorter than min_split_k or one K tile.
    From the shape and the device only, so a captured graph is valid for every call of the shape."""
    k_tiles = -(-k // block_k)
    want = -(-entry["programs_per_cu"] * num_cus // n_tiles)
    cap = min(entry["max_splits"], max(1, k // entry["min_split_k"]), k_tiles)
    return max(1, min(want, cap))
