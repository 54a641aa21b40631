"""Launch parameters of the prefill attention kernel, as data: one entry per target.

Keys of an entry: ``measured`` (from a benchmark on that target, or chosen on paper), and ``kv16`` / ``kv8`` /
``kv8_short``: the Triton launch for 2-byte (bf16/fp16) caches (and the 16-bit mirror of 8-bit ones), for 1-byte
(fp8/int8 per-token-head) caches read directly, and for the direct launch beside the mirror, whose rows are short
(decode rows and chunks under MIRROR_MIN_QUERY tokens; a long chunk only when the mirror is full), so a small query
tile keeps more programs per row of work and, at BLOCK_M <= 32, int8 caches take the int8 x int8 products:
  BLOCK_M    query rows per program (query tokens x the q heads of one kv head; the launcher raises it to the
             group size's power of two when smaller)
  BLOCK_N    keys per tile
  num_warps, num_stages, and on ROCm waves_per_eu, matrix_instr_nonkdim.

``VLLM_DCU_PREFILL_PARAMS`` overrides values for the current target, e.g. ``'{"BLOCK_M": 64}'`` (all three),
``'{"kv8": {"BLOCK_N": 32}}'``, or ``'{"matrix_instr_nonkdim": null}'`` (drop a ROCm option a Triton build does
not accept). Read once per target and override text; a bad value fails at startup naming what is allowed.
``python -m kernels.prefill_attention.bench`` sweeps them on the device it runs on and prints an entry.
"""

from ..targets import ROCM_ONLY_OPTIONS, cached_entry, parse_override_object, target_for

ENV_VAR = "VLLM_DCU_PREFILL_PARAMS"
_LAUNCH_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "waves_per_eu", "matrix_instr_nonkdim")
_ROCM_ONLY = ROCM_ONLY_OPTIONS
_POW2 = {"BLOCK_M": (16, 256), "BLOCK_N": (16, 256), "num_warps": (1, 16)}

# DCU (gfx928 / gfx936): wave64, 64 KiB LDS per CU, no fp8 hardware. Chosen on paper:
# - BLOCK_M 64 (10 tokens x 6 q heads): a peer team measured BLOCK_M 64 vs 32 as 37% less prefill attention
#   time on a gfx936 at a 4096-token chunk; 128 needs more VGPRs than a wave64 SIMD gives at head_dim 256.
# - BLOCK_N 16: at head_dim 256 a 16-key K or V tile is 8 KiB in bf16; the same team measured a 16-wide KV
#   tile 2.6-2.8x faster than 32-wide there (LDS pressure: ~2 waves per SIMD instead of 1).
# - num_warps 4 (4 wave64 = 256 lanes), num_stages 1 (no second LDS buffer), matrix_instr_nonkdim 16 for the
#   16x16x16 MMAC; waves_per_eu 1: LDS, not VGPRs, limits occupancy at these tiles.
# Compiled for gfx90a (the wave64 proxy; compile_check.py --target gfx936, 2026-12-02): 64x16 / 4 warps 252 VGPRs
# bf16 (296 8-bit), 32 KiB LDS (the Q tile's layout change), no spills; 64x32 320 VGPRs; 128x16 / 4 warps 380
# VGPRs and 64 KiB LDS (one workgroup per CU); 128x16 / 8 warps 161 VGPRs but 64 KiB LDS. Sweep on the DCU with
# bench.py before trusting any of it. 2026-12-02 (sixth session, log2 V factor, 16-bit mirror): 64x16 bf16 252,
# the mirror 256, the direct 8-bit path 292 VGPRs, no spills, 32 KiB LDS.
# kv8_short (decode rows and short chunks beside the mirror): 16 x 32, 4 warps, 1 stage (2026-12-05, was kv8's
# 64 x 16). A decode row fills 6 of a tile's rows, 6 of 16 here against 6 of 64; and int8 caches (V by dim) take the
# int8 x int8 products only at <= 32 rows (prefill_attention.takes_int8_products): at 64 rows they convert V in
# windows whose bytes Triton gathers one by one. Compiled for gfx90a (compile_check's global loads; int8 / software
# fp8): 64 x 16 292 / 320 VGPRs, int8 with 32 one-byte loads; 16 x 32 188 / 228 VGPRs, 8 KiB LDS, no one-byte
# load, no spills (16 x 64 280 / 342, 32 x 32 232 / 256). On the H200 the same choice for int8 by dim was 64 x 32
# 4.8-5.2x bf16's time against 1.05-1.08x at 16 x 64 (sm90's entry, above). bench.py or the tuning command's --full
# on a DCU decides (bench/results/2026-12-05-cpu-dcu-kv8-candidates.md).
_DCU = {
    "measured": False,
    "kv16": {"BLOCK_M": 64, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "waves_per_eu": 1,
             "matrix_instr_nonkdim": 16},
    "kv8": {"BLOCK_M": 64, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "waves_per_eu": 1,
            "matrix_instr_nonkdim": 16},
    "kv8_short": {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "waves_per_eu": 1,
                  "matrix_instr_nonkdim": 16},
}

PARAMS = {
    # H200 (sm90, 132 SMs, 227 KiB shared memory per block): bench.py's sweep of 2026-12-02 (4096-token chunk at
    # 16K / 32K history): kv16 128x64, 8 warps, 2 stages 4.95 / 9.48 ms (128x32: 7.16 / 13.8; 64x64: 11.5 / 22.5);
    # kv8 (the direct path: decode rows and short chunks; long chunks use the 16-bit mirror with kv16's) 128x32,
    # 8 warps, 3 stages 11.9 / 22.9 ms (128x64 spills ~6 KB at 255 registers, compile_check.py).
    # kv8_short, 2026-12-03 (bench/results/2026-12-03-h200-int8-v-by-dim-engine-prefill-writer.md): a decode row /
    # a 16-token chunk after 16K-32K of history, int8 by dim 1.05-1.08x bf16's time at 16x64, 8 warps, 2 stages
    # (int8 products; no spills) against 2.37-2.41x before V by dim and 4.8-5.2x at 128x32 (int8 products: 888 B of
    # spills) or 64x32; 32x64 1.32-1.35x, 16x32 x 4 warps 1.53-1.59x; software fp8 1.10-1.12x against 2.38-2.43x
    # kv8_short BLOCK_N 64 -> 128, 2026-12-05 (bench/results/2026-12-05-h200-tuned-start.md): the tuning command's
    # uncapped --full, after the 8-bit window-load fix, took 0.70x the time of 16x64 (497 against 712 us, geomean of
    # int8 and fp8 at 16 rows after 16K); prefill GPU tests with it: 42 passed (H100, 2026-12-05)
    "sm90": {
        "measured": True,
        "kv16": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2},
        "kv8": {"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 8, "num_stages": 3},
        "kv8_short": {"BLOCK_M": 16, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2},
    },
    "gfx936": _DCU,
    "gfx928": _DCU,
    # anything else: conservative values valid on every target
    "cuda": {
        "measured": False,
        "kv16": {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2},
        "kv8": {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2},
        "kv8_short": {"BLOCK_M": 16, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2},
    },
    "rocm": _DCU,
    # Triton CPU interpreter (tests): small tiles
    "interpreter": {
        "measured": False,
        "kv16": {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
        "kv8": {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
        "kv8_short": {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
    },
}
WIDTHS = ("kv16", "kv8", "kv8_short")


def current_target(device=None) -> str:
    """Key into PARAMS for the device: 'sm90', 'gfx936', ..., a generic 'cuda' / 'rocm', or 'interpreter'."""
    return target_for(PARAMS, device)


def _fail(where: str, msg: str):
    raise ValueError(f"{where}: {msg}")


def _parse_override(text: str) -> dict:
    override = parse_override_object(ENV_VAR, text, set(_LAUNCH_KEYS) | set(WIDTHS))
    for sub in WIDTHS:
        if sub in override and (not isinstance(override[sub], dict) or set(override[sub]) - set(_LAUNCH_KEYS)):
            raise ValueError(f"{ENV_VAR}: '{sub}' must be an object with keys from {list(_LAUNCH_KEYS)}")
    return override


def check_launch(launch: dict, where: str, rocm: bool) -> None:
    """Raise ValueError naming the bad key unless ``launch`` is a valid kv16/kv8/kv8_short entry for the target."""
    missing = [k for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages") if k not in launch]
    if missing:
        _fail(where, f"missing {missing}")
    for key, val in launch.items():
        if key not in _LAUNCH_KEYS:
            _fail(where, f"unknown key {key!r}; allowed: {list(_LAUNCH_KEYS)}")
        if key in _ROCM_ONLY and not rocm:
            _fail(where, f"{key} is a ROCm-only option")
        if not isinstance(val, int) or isinstance(val, bool) or val < (0 if key == "waves_per_eu" else 1):
            _fail(where, f"{key} must be a positive integer, got {val!r}")
        if key in _POW2:
            lo, hi = _POW2[key]
            if val < lo or val > hi or val & (val - 1):
                _fail(where, f"{key} must be a power of two in [{lo}, {hi}], got {val}")


_CACHE: dict = {}


def get_params(target: str, override: str | None = None) -> dict:
    """The entry for ``target`` with ``VLLM_DCU_PREFILL_PARAMS`` (or ``override``) applied, validated and cached.
    Callers must not modify the returned dict."""
    from ..tuning.decisions import launch_override  # the tuned file's layer (imported on first use, as before)

    return cached_entry(_CACHE, ENV_VAR, _build, target, override, family="prefill", tuned_override=launch_override)


def _build(target: str, text: str, base: dict | None = None) -> dict:
    if target not in PARAMS:
        raise ValueError(f"no prefill-attention launch parameters for target {target!r}; known: {sorted(PARAMS)}")
    base = PARAMS[target] if base is None else base  # base: the entry with the tuned file's override (targets.py)
    entry = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    where = f"prefill-attention params for {target}"
    if text.strip():
        ov = _parse_override(text)
        where += f" with {ENV_VAR}={text}"
        for key, val in ov.items():
            if key in WIDTHS:
                entry[key].update(val)
            else:
                for sub in WIDTHS:
                    entry[sub][key] = val
        for sub in WIDTHS:  # null drops an option
            for key in [k for k, v in entry[sub].items() if v is None]:
                if key not in _ROCM_ONLY:
                    _fail(where, f"only {list(_ROCM_ONLY)} can be dropped with null, not {key}")
                del entry[sub][key]
        entry["measured"] = False
    rocm = target.startswith("gfx") or target == "rocm"
    for sub in WIDTHS:
        check_launch(entry[sub], f"{where} ({sub})", rocm)
    return entry


__all__ = ["ENV_VAR", "PARAMS", "check_launch", "current_target", "get_params"]
