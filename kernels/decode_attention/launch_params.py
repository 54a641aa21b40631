"""Launch parameters of the split-KV decode attention kernel, as data.

One entry per target. ``measured`` says whether the values come from a benchmark on that
target (bench.py prints a suggested entry) or were chosen on paper.

Keys of an entry:
  splits      how many programs to aim for per compute unit (SM / CU), the cap on splits per
              sequence, and the shortest split in tokens (so short contexts are not cut into
              splits that cost more to merge than they save);
  kv16 / kv8  Triton launch options for 2-byte (bf16/fp16) and 1-byte (fp8/int8 per-token-head)
              caches: BLOCK_N (tokens per tile), num_warps, num_stages, and on ROCm
              waves_per_eu and matrix_instr_nonkdim; kv8 only, CUDA only: early_convert, where the
              PTX code conversions run: 0 after the shared-memory load (in the dot-operand layout;
              V's bytes are then gathered one by one), 1 V before it (converted fp16 V goes
              through shared memory, K as 0), 2 K and V before it (default);
              split_round ("up" / "down"): how the split count per sequence rounds programs_per_cu x
              compute units / (batch x kv heads): up (default) fills the chip at every batch; down never
              launches more programs than that target, for entries whose shared memory or registers
              leave just programs_per_cu programs per compute unit (a round-up would start a second
              wave for a few programs);
              int8_qk (0/1, kv8 only, int8 caches only: fp8 caches ignore it): QK^T as int8 x int8 products of
              q's per-row int8 pair (q = sq (hi + lo / 256), two dots) with K's raw codes, so K is never
              converted; V as before. On in sm90's entry (0.95x the fp16 path's time for int8, measured);
              off on the DCU until measured there (its int8 MFMA is what it is for);
              even_splits (0/1): how a sequence's tiles spread over its splits (on the device, both stages): 0
              every split takes cdiv(tiles, wanted splits) tiles, so fewer splits than wanted may get work (int8 at
              batch 1 x 16K: 137 tiles of 128 over 66 wanted, 46 splits of 3); 1 min(wanted, tiles) splits whose
              lengths differ by at most one tile;
              balance (0/1): a step's programs go to its sequences by length, not the same count to each: of the
              programs the plan without it launches for the batch (batch x splits per sequence), each sequence
              takes its part by tiles, rounded up, the parts scaled down where rounding would overflow into a
              second wave (capped by its tiles, max_splits and min_split_tokens as without it; its tiles spread as
              even_splits spreads them). Grid (programs + batch, kv heads); each program finds its sequence and
              split from every sequence's length on the device, so a captured graph serves every mix of lengths.
              Batch 1 and forced splits take the plan without it (in the same compiled kernel). One long request
              among short ones no longer waits on as few programs as each short one has (H200: 0.23-0.53x the
              time);
              q_early (0/1, kv8 only; default 1): q's load goes out with seq_len's, before the program knows
              whether its split has work (a split past the sequence's last returns at once); 0 loads q after that
              check, as kv16 does (H200, sm90's entry: 1.004-1.019x the 8-bit time with 0, so no entry sets it);
              page_loop (0/1): pages in an outer loop (one block-table read per page), the page's tiles
              in an inner one that the pipeliner can buffer num_stages - 1 tiles deep (with the page
              read inside the tile loop it keeps one tile in flight whatever num_stages says); tiles
              never cross a page, a page's last tile overlaps the one before; needs block_size >=
              BLOCK_N, else off;
              programs_per_cu (inside kv16 / kv8): this width's own value of the entry's programs_per_cu,
              for the split plan only (an 8-bit entry's shared memory may leave room for fewer or more
              programs per compute unit than the bf16 one's; H200, kv8 BLOCK_N 32 x 3 stages, 3 programs
              per SM: 1.06-1.10x the sm90 entry's time, so no entry sets it yet); min_split_tokens likewise
              (a sequence's shortest split, so the kernel's own split count at short contexts);
              gluon (kv8 only, CUDA): an object {BLOCK_N, num_warps, num_stages[, programs_per_cu,
              min_split_tokens]} (BLOCK_N 64 / 128, 16 x num_warps <= BLOCK_N), the launch of the Gluon stage 1
              (gluon_stage1.py: q held in registers, the codes through a cp.async ring straight into the matrix
              operands) for the 8-bit calls it covers (fp8 with V by token, int8 with V by dim, as their caches hold
              them; head_dim 256, pages of at least its BLOCK_N tokens: planning.gluon_supported), with its own
              split plan (the workspace is sized for both plans); every other call takes the Triton kernel with the
              rest of the entry. null drops it (sm90's entry sets it: see there);
              int8 (kv8 only): launch options merged over kv8 for int8 caches only (fp8 caches take kv8 as it is),
              from BLOCK_N, num_warps, num_stages, waves_per_eu, matrix_instr_nonkdim, early_convert, page_loop
              (nothing of the host's split plan: the workspace is sized for kv8 whatever the kind);
  lds_limit   bytes of LDS one workgroup may use on ROCm; the launcher rejects a configuration
              whose estimate (lds_bytes) exceeds it, naming the knobs to lower.

``VLLM_DCU_DECODE_PARAMS`` overrides values for the current target without editing this file, e.g.
``VLLM_DCU_DECODE_PARAMS='{"BLOCK_N": 32, "num_warps": 4}'`` (applies to kv16 and kv8),
``'{"kv8": {"BLOCK_N": 64}, "programs_per_cu": 4}'``, or ``'{"matrix_instr_nonkdim": null}'`` to drop a
ROCm option that a Triton build does not accept. kernels/decode_attention/bench.py measures and
prints an entry for the device it runs on.
"""

from ..targets import ROCM_ONLY_OPTIONS, cached_entry, parse_override_object, target_for

ENV_VAR = "VLLM_DCU_DECODE_PARAMS"

_SPLIT_KEYS = ("programs_per_cu", "max_splits", "min_split_tokens")
_LAUNCH_KEYS = ("BLOCK_N", "num_warps", "num_stages", "waves_per_eu", "matrix_instr_nonkdim", "early_convert",
                "page_loop", "split_round", "int8_qk", "q_early", "even_splits", "balance")
_ROCM_ONLY = ROCM_ONLY_OPTIONS
_WIDTH_SPLIT_KEYS = ("programs_per_cu", "min_split_tokens")  # split keys a kv16 / kv8 entry may set for its own plan
# launch keys that take one of a few values: (allowed, how the error names them)
_CHOICES = {"early_convert": ((0, 1, 2), "0, 1 or 2"), "int8_qk": ((0, 1), "0 or 1"), "page_loop": ((0, 1), "0 or 1"),
            "q_early": ((0, 1), "0 or 1"), "even_splits": ((0, 1), "0 or 1"), "balance": ((0, 1), "0 or 1"),
            "split_round": (("up", "down"), '"up" or "down"')}
_KV8_ONLY = ("early_convert", "int8_qk", "q_early")
# what the launcher (decode_attention.split_kernel_launch, _plan) takes for a launch key an entry leaves out
LAUNCH_DEFAULTS = {"early_convert": 2, "page_loop": 0, "int8_qk": 0, "split_round": "up", "q_early": 1,
                   "even_splits": 0, "balance": 0}
# kv8 only: launch options for int8 caches, merged over the kv8 entry (which fp8 caches take as it is); only what
# leaves the host's split plan alone (the workspace is sized for kv8 without knowing the cache's kind), and not
# int8_qk (int8-only already)
_INT8 = "int8"
_INT8_KEYS = tuple(k for k in _LAUNCH_KEYS if k not in ("split_round", "int8_qk", "balance"))
# kv8 only: the Gluon stage 1's launch for the 8-bit calls it takes (its presence turns it on); its own split plan keys
_GLUON = "gluon"
_GLUON_KEYS = ("BLOCK_N", "num_warps", "num_stages", "programs_per_cu", "min_split_tokens")
_GLUON_BLOCK_N = (64, 128)

# DCU (gfx928 / gfx936), wave64, 64 KiB LDS, no fp8 hardware. Chosen on paper:
# - BLOCK_N 32 at head_dim 256: a 16 KiB bf16 K/V tile per stage plus the 8 KiB Q tile in LDS.
#   Compiled with Triton 3.6 for gfx90a (the closest wave64 target upstream LLVM knows):
#   bf16 with num_stages 2 (global loads of the next tile issued before this tile's math) uses
#   32 KiB LDS, 154 VGPRs, no scratch; the 8-bit caches stay at num_stages 1 (int8 needs 224
#   VGPRs there, 251 at 2 stages); BLOCK_N 64 spills registers for the 8-bit caches.
# - num_warps 4 = 256 lanes (4 wave64), waves_per_eu 2 so two workgroups share a CU and hide
#   HBM latency, matrix_instr_nonkdim 16 for the 16x16x16 bf16 MMAC.
# - 2 programs per CU: batch 1 with 4 kv heads gets ~40 splits on a 80-CU part.
# - int8: page_loop 1 (int8 caches only). int8 pages hold V by dim, and only the page loop reads a tile's V as one
#   contiguous run (V_CONTIG, triton_kernels.py); without it the clamped rows' bytes are gathered one by one. For
#   the gfx90a proxy the int8 stage 1 compiled to 32 byte loads (global_load_ubyte) and 249 VGPRs without it, none
#   and 240 with it, K and V in 16-byte loads (bench/results/2026-12-05-cpu-dcu-kv8-candidates.md); on the H200
#   the by-dim path took 1.3-2.0x its by-token time while its bytes were gathered. fp8 (V by token) keeps the
#   entry as it is. The rehearsal on the H200 (2026-12-05) timed the DCU's int8 without it.
_DCU = {
    "measured": False,
    "lds_limit": 65536,
    "programs_per_cu": 2,
    "max_splits": 64,
    "min_split_tokens": 256,
    "kv16": {"BLOCK_N": 32, "num_warps": 4, "num_stages": 2, "waves_per_eu": 2, "matrix_instr_nonkdim": 16},
    "kv8": {"BLOCK_N": 32, "num_warps": 4, "num_stages": 1, "waves_per_eu": 2, "matrix_instr_nonkdim": 16,
            "int8": {"page_loop": 1}},
}

PARAMS = {
    # H200 (sm90, 132 SMs, 228 KiB shared memory per SM): bench.py's sweep in
    # bench/results/2026-11-30-nvidia-h200-decode-attention-kv8fp16.md
    "sm90": {
        "measured": True,
        "lds_limit": None,  # Triton itself rejects configs beyond the 227 KiB per block
        "programs_per_cu": 2,
        "max_splits": 128,
        "min_split_tokens": 64,
        # kv16 BLOCK_N 32: the first H200 sweep's pick; the second sweep's 64 was within 1% on its geomean
        # but 15% slower at batch 64 (bench/results/2026-11-30-nvidia-h200-decode-attention*.md, 2 splits in both)
        # balance 1 on both widths (2026-12-03, seventeenth session): a step's programs shared out by sequence
        # length; against the same entry without it in one call (bench/results/2026-12-03-h200-balanced-splits.md):
        # one 32K request among 4K ones 0.23-0.53x the time at batch 4-64, a 16-32K spread 0.78-1.00x at 32K and
        # 0.87-1.07x at 8K, equal lengths 0.94-1.09x from 16K and 1.06-1.20x at 4K (the plan's passes over the
        # batch's lengths, ~1-4 us); batch 1 keeps the plan without it. Eighteenth session: stage 1 reads a batch's
        # lengths once and hands stage 2 each sequence's rows, 0.89-0.97x the time at 4K (batch > 1), 0.97-1.01x from
        # 16K (bench/results/2026-12-04-h200-balance-plan-handoff.md)
        "kv16": {"BLOCK_N": 32, "num_warps": 4, "num_stages": 2, "balance": 1},
        # kv8: pages in an outer loop, so the pipeliner keeps 2 tiles in flight (with the block-table read in the
        # tile loop it kept one whatever num_stages said); at 3 stages its shared memory leaves 2 programs per SM,
        # so the split count rounds down (a round-up put 320 programs where 264 fit at batch 16). Against the
        # previous entry (BLOCK_N 64, 2 stages, no page loop) in one call: 0.85x its time (geomean over batch
        # 1/4/16/64 x 4-32K, int8 / fp8 hw / fp8 sw 0.847 / 0.845 / 0.859x; 0.72-0.79x at batch 64, 0.96-0.97x at
        # batch 1, where 4K is 1.05-1.07x bf16's time: one tile per split), 0.87x the kernel before issue #15
        # (bench/results/2026-12-02-nvidia-h200-decode-attention-split-round.md). int8_qk 1 (int8 caches only):
        # 0.951x the same entry without it for int8 (geomean over batch 1/4/16/64 x 4-32K; fp8 rows unchanged,
        # 0.994-0.998x), int8 / bf16 at 16-32K 0.70-0.79 / 0.62-0.67 / 0.64-0.66 / 0.67-0.68x at batch 1 / 4 / 16 / 64;
        # the GPU decode tests pass with it (bench/results/2026-12-02-nvidia-h200-decode-attention-kv8-warps.md:
        # 8 warps, 8 warps x 4 stages, BLOCK_N 32 x 4 / 6 stages were 1.08-1.34x slower)
        # int8: 2 warps (int8 caches only): 0.973 / 0.975x the entry's int8 time in two calls (geomean over batch
        # 1/4/16/64 x 4-32K; 0.93-0.97x per cell at batch 4-16 from 16K, 0.98-1.02x at batch 1), where fp8 with
        # hardware decode ran 0.947-0.953x but software decode 1.07-1.08x, and software has to stay within 10% of
        # hardware (issue #17), so fp8 keeps 4 warps (bench/results/2026-12-02-h200-decode-kv8-prologue-warps.md)
        # int8 again (2026-12-03): int8 caches hold V by dim and take the int8 x int8 P x V path, whose tiles
        # never go through shared memory as fp16: BLOCK_N 128 on 4 warps with 2 stages (78.8 KB of shared memory,
        # 2 programs per SM), 0.967 / 0.974x the previous int8 time in two calls (batch 64 0.92-0.93x); around it
        # 8 warps 1.45x, 3 stages 1.11x, BLOCK_N 256 x 8 warps 1.39x, BLOCK_N 64 x 4 stages 1.07x
        # (bench/results/2026-12-03-h200-device-runs-9.md, calls A and B)
        # even_splits 1 (2026-12-03, sixteenth session): a sequence's tiles spread over min(wanted, tiles) splits of
        # equal length +-1 tile, where cdiv's plan gave int8's 128-token tiles at batch 1 x 16K to 46 of 66 wanted
        # splits: 0.969 / 0.976 / 0.986x the entry's time for int8 / fp8 hardware / software (geomean over batch
        # 1/4/16/64 x 4-32K, one call; int8 / bf16 at batch 1 0.819 -> 0.775, batch 4 0.633 -> 0.604). Not for kv16:
        # bf16 with it took 1.03-1.07x at batch 4 (bench/results/2026-12-03-nvidia-h200-decode-attention-stages.md,
        # -even-all.md); q_early 0 in the same call: 1.004-1.019x, so 8-bit q keeps its early load
        # gluon (2026-12-04, twenty-second session): 8-bit calls take the Gluon stage 1 (its transposed products),
        # BLOCK_N 128 x 4 warps x 2 stages, one program per SM (137 KB of shared memory). Against this entry's Triton
        # launch in one call (call 7), fp8 by token (the served layout) at 16-32K: 0.57-0.62 / 0.46-0.50 / 0.48-0.49 /
        # 0.53x bf16 at batch 1 / 4 / 16 / 64, hardware and software e4m3 alike; 0.80x the Triton fp8 time (geomean
        # over 4-32K); 8 warps, 3 stages (8 warps) and BLOCK_N 64 x 2 programs per SM took
        # 1.005-1.019x its time for hardware and 1.03-1.04x for software (call 4, one run;
        # bench/results/2026-12-04-h200-session22-gluon-entry.md).
        # Served with the first form of the kernel (fp8 KV, dcu64, 16-32K at 0.6 req/s, 16 layers): output tok/s and
        # TPOT P99 equal to the Triton launch's (1.000 / 0.99x), no Triton or Gluon compile after the server was up;
        # the mixed-batch test passes with this one. On this form (twenty-third session): fp8 and int8 2.22x bf16's
        # output tok/s, TPOT P99 0.20x, the engine equivalence test passes (bench/results/2026-12-04-h200-session23.md).
        # int8 caches (V by dim) take it too: 0.61-0.65 / 0.51-0.53 / 0.53-0.54 / 0.58-0.60x bf16 at 16-32K, 0.95x the
        # int8 x int8 Triton launch's time (calls 6-7). Short pages keep the Triton launch above. Twenty-fourth session:
        # the Gluon stage 1 loads q with seq_len, 0.92-0.99x its time at batch 1; with int8 pages of 1664 tokens (patch
        # 0002) fp8 / int8 take 0.58 / 0.61x bf16's time at 1 x 16K, 0.53 / 0.54-0.55x at batch 64
        # (bench/results/2026-12-04-h200-session24.md). Twenty-fifth session: a tile's copies in two groups (K with the
        # scales, then V), V awaited only before P x V: 0.93-0.97x the time at batch 1, int8 / fp8 0.57-0.59 / 0.56x
        # bf16 at 1 x 16K (bench/results/2026-12-04-h200-session25.md)
        "kv8": {"BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "early_convert": 1, "page_loop": 1,
                "split_round": "down", "int8_qk": 1, "even_splits": 1, "balance": 1,
                "int8": {"BLOCK_N": 128, "num_warps": 4, "num_stages": 2},
                "gluon": {"BLOCK_N": 128, "num_warps": 4, "num_stages": 2, "programs_per_cu": 1}},
    },
    "gfx936": dict(_DCU),
    "gfx928": dict(_DCU),
    # anything else: conservative values valid on every target
    "cuda": {
        "measured": False,
        "lds_limit": None,
        "programs_per_cu": 2,
        "max_splits": 64,
        "min_split_tokens": 256,
        "kv16": {"BLOCK_N": 32, "num_warps": 4, "num_stages": 2},
        "kv8": {"BLOCK_N": 32, "num_warps": 4, "num_stages": 2},
    },
    "rocm": dict(_DCU),
    # Triton CPU interpreter (tests): small tiles, splits forced by tests when they matter
    "interpreter": {
        "measured": False,
        "lds_limit": None,
        "programs_per_cu": 4,
        "max_splits": 8,
        "min_split_tokens": 16,
        "kv16": {"BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
        "kv8": {"BLOCK_N": 16, "num_warps": 4, "num_stages": 1},
    },
}


def current_target(device=None) -> str:
    """Key into PARAMS for the device: 'sm90', 'gfx936', ..., or a generic 'cuda' / 'rocm'."""
    return target_for(PARAMS, device)


def _parse_override(text: str) -> dict:
    override = parse_override_object(ENV_VAR, text, set(_SPLIT_KEYS) | set(_LAUNCH_KEYS) | {"kv16", "kv8"})
    for sub in ("kv16", "kv8"):
        if sub in override:
            keys = list(_LAUNCH_KEYS) + list(_WIDTH_SPLIT_KEYS) + ([_INT8, _GLUON] if sub == "kv8" else [])
            if not isinstance(override[sub], dict) or set(override[sub]) - set(keys):
                raise ValueError(f"{ENV_VAR}: '{sub}' must be an object with keys from {keys}")
    return override


def _check_ints(entry: dict, where: str):
    for key in _SPLIT_KEYS:
        if not isinstance(entry[key], int) or entry[key] < 1:
            raise ValueError(f"{where}: {key} must be a positive integer, got {entry[key]!r}")
    for sub in ("kv16", "kv8"):
        items = list(entry[sub].items())
        gluon = entry[sub].get(_GLUON)
        if gluon is not None:
            if sub != "kv8" or not isinstance(gluon, dict) or not {"BLOCK_N", "num_warps", "num_stages"} <= set(gluon) \
                    <= set(_GLUON_KEYS):
                raise ValueError(f"{where}: '{sub}.{_GLUON}' must be an object with BLOCK_N, num_warps, num_stages and "
                                 f"optionally {list(_WIDTH_SPLIT_KEYS)} (kv8 only)")
            for key, val in gluon.items():
                if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                    raise ValueError(f"{where}: {sub}.{_GLUON}.{key} must be a positive integer, got {val!r}")
            if gluon["BLOCK_N"] not in _GLUON_BLOCK_N or gluon["num_stages"] < 2:
                raise ValueError(f"{where}: {sub}.{_GLUON} needs BLOCK_N in {list(_GLUON_BLOCK_N)} and num_stages >= 2 "
                                 f"(a ring), got {gluon['BLOCK_N']} / {gluon['num_stages']}")
            if gluon["num_warps"] not in (1, 2, 4, 8) or gluon["num_warps"] * 16 > gluon["BLOCK_N"]:
                raise ValueError(f"{where}: {sub}.{_GLUON}.num_warps must be a power of two with 16 x num_warps <= "
                                 f"BLOCK_N (16 keys per warp), got {gluon['num_warps']} for BLOCK_N {gluon['BLOCK_N']}")
            items = [kv for kv in items if kv[0] != _GLUON]
        int8_opts = entry[sub].get(_INT8)
        if int8_opts is not None:
            if sub != "kv8" or not isinstance(int8_opts, dict) or set(int8_opts) - set(_INT8_KEYS):
                raise ValueError(f"{where}: '{sub}.{_INT8}' must be an object with keys from {list(_INT8_KEYS)} "
                                 "(kv8 only)")
            items = [kv for kv in items if kv[0] not in (_INT8, _GLUON)] + list(int8_opts.items())
        for key, val in items:
            if key in _KV8_ONLY and sub != "kv8":
                raise ValueError(f"{where}: {key} applies to kv8 only")
            if key in _CHOICES:
                allowed, text = _CHOICES[key]
                if val not in allowed or isinstance(val, bool):  # JSON true is not 1
                    raise ValueError(f"{where}: {sub}.{key} must be {text}, got {val!r}")
            elif isinstance(val, bool) or not isinstance(val, int) or val < (0 if key == "waves_per_eu" else 1):
                raise ValueError(f"{where}: {sub}.{key} must be a positive integer, got {val!r}")
        for bn in {entry[sub]["BLOCK_N"], (int8_opts or {}).get("BLOCK_N", entry[sub]["BLOCK_N"])}:
            if bn < 16 or bn & (bn - 1):
                raise ValueError(f"{where}: {sub}.BLOCK_N must be a power of two >= 16, got {bn}")


_CACHE: dict = {}


def get_params(target: str, override: str | None = None) -> dict:
    """The entry for ``target`` with ``VLLM_DCU_DECODE_PARAMS`` (or ``override``) applied; validated.
    Callers must not modify the returned dict (it is cached per target and override text)."""
    from ..tuning.decisions import launch_override  # the tuned file's layer (imported on first use, as before)

    return cached_entry(_CACHE, ENV_VAR, _build_params, target, override, family="decode",
                        tuned_override=launch_override)


def _build_params(target: str, text: str, base: dict | None = None) -> dict:
    if target not in PARAMS:
        raise ValueError(f"no decode-attention launch parameters for target {target!r}; known: {sorted(PARAMS)}")
    base = PARAMS[target] if base is None else base  # base: the entry with the tuned file's override (targets.py)
    entry = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    where = f"decode-attention params for {target}"
    if text.strip():
        ov = _parse_override(text)
        where += f" with {ENV_VAR}={text}"
        for key, val in ov.items():
            if key in _SPLIT_KEYS:
                entry[key] = val
            elif key in _KV8_ONLY:
                entry["kv8"][key] = val
            elif key in _LAUNCH_KEYS:
                entry["kv16"][key] = val
                entry["kv8"][key] = val
            else:
                entry[key].update(val)
        for sub in ("kv16", "kv8"):  # null drops an option (e.g. one a Triton build does not know)
            for key in [k for k, v in entry[sub].items() if v is None]:
                if key not in _ROCM_ONLY + (_INT8, _GLUON):
                    raise ValueError(f"{where}: only {list(_ROCM_ONLY) + [_INT8, _GLUON]} can be dropped with null, "
                                     f"not {key}")
                del entry[sub][key]
        entry["measured"] = False
    _check_ints(entry, where)  # first: the ROCm check below reads the int8 options as the object it checks
    rocm = target.startswith("gfx") or target == "rocm"
    for sub in ("kv16", "kv8"):
        bad = [k for k in _ROCM_ONLY if k in entry[sub] or k in entry[sub].get(_INT8, {})] if not rocm else []
        if bad:
            raise ValueError(f"{where}: {bad} are ROCm-only options, not valid on {target}")
    if rocm and _GLUON in entry["kv8"]:
        raise ValueError(f"{where}: kv8.{_GLUON} (the Gluon stage 1) is CUDA-only, not valid on {target}")
    if _GLUON in entry["kv8"] and not entry["kv8"].get("balance", LAUNCH_DEFAULTS["balance"]):
        # Triton 3.6 does not compile the Gluon stage 1 without the balanced plan (an LLVM assertion in
        # ConvertTritonGPUToLLVM, for int8 and fp8 alike: `compile_check --target sm90 --gluon` with kv8 balance 0;
        # found by the tuning command's sweep, bench/results/2026-12-05-h200-device-decides.md)
        raise ValueError(f"{where}: kv8.{_GLUON} (the Gluon stage 1) needs kv8.balance 1; set kv8.gluon null to time "
                         "the Triton kernel without the balanced plan")
    return entry


def lds_bytes(block_n: int, head_dim_padded: int, num_stages: int, block_h: int = 16) -> int:
    """Estimated LDS of one program on ROCm: one K or V tile as a 2-byte dot operand per stage (the
    two are not live at once), plus the Q tile. Triton for gfx90a (wave64) allocates 16 KiB at
    BLOCK_N 32 / head_dim 256 and 32 KiB at BLOCK_N 64, within this estimate."""
    return 2 * (block_n * head_dim_padded * max(num_stages, 1) + block_h * head_dim_padded)


def num_splits(batch: int, num_kv_heads: int, num_cus: int, entry: dict, round_down: bool = False) -> int:
    """Splits per sequence (grid z), from the batch and the device only, never from seq_lens: a
    CUDA graph captured for one batch size stays valid for every context length. round_down: never more
    than programs_per_cu x num_cus programs (launch key split_round "down")."""
    target = num_cus * entry["programs_per_cu"]
    rows = batch * num_kv_heads
    per_seq = target // rows if round_down else -(-target // rows)
    return max(1, min(per_seq, entry["max_splits"]))
