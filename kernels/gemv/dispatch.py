"""Which side runs a decode GEMM, the Triton GEMV or the platform GEMM, measured on the device.

For every GEMM shape a model runs (N, K, dtype, bias, plain or fused with SiLU-and-mul) and every
row bucket (1, 2, 4, 8 rows), both sides are timed once on the actual device and the faster is kept;
the Triton GEMV must win by more than HYSTERESIS (1%) to be chosen. The table is the ``gemv`` section
of the device's tuned file (kernels/tuning/tuned_file.py: one file per device, keyed by device, arch,
Triton, torch and the kernels hash), which the tuning command fills for a model's shapes; a shape the
file lacks is measured at engine start and merged into it, so a later start only loads it. While
timing, the Triton kernel of every row bucket is compiled; shapes read from the file compile theirs
in ``warm``, so nothing compiles once a model is serving. With ``VLLM_DCU_GEMV_PARAMS`` set, the
file's choices (timed with other launch options) are not used and nothing is written.

This module is independent of vLLM (torch only; Triton only through the callables it is given):
vLLM's side (vllm.dcu.gemv, patch 0007) supplies the two GEMMs and the logger; kernels/gemv/bench.py
uses ``decide`` to say what the dispatch would pick.

Environment:
  VLLM_DCU_GEMV             auto (default: measured) | triton (always the GEMV for <= 8 rows) |
                            platform (always the platform GEMM) | off (no hook at all: upstream's
                            code path, not even the custom op)
  VLLM_DCU_CACHE            where the tuned file lives (default ~/.cache/vllm-dcu; VLLM_DCU_GEMV_CACHE_DIR
                            is still read); VLLM_DCU_TUNED_FILE names the file itself
  VLLM_DCU_GEMV_SILU_MUL    1 (default) | 0: offer the gate_up GEMV fused with SiLU-and-mul (it is then
                            measured against the platform GEMM + a separate SiLU-and-mul like any shape)
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Callable

from ..tuning import tuned_file

MODES = ("auto", "triton", "platform", "off")
ENV_MODE = "VLLM_DCU_GEMV"
ENV_SILU_MUL = "VLLM_DCU_GEMV_SILU_MUL"
HYSTERESIS = 0.01
BUCKETS = (1, 2, 4, 8)


def read_mode(environ=None) -> str:
    """VLLM_DCU_GEMV, lower-cased; '' means auto. Anything else: ValueError naming the allowed values."""
    environ = os.environ if environ is None else environ
    raw = environ.get(ENV_MODE, "")
    mode = raw.strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"{ENV_MODE}={raw!r} is not one of {', '.join(MODES)}")
    return mode


def read_silu_mul(environ=None) -> bool:
    """VLLM_DCU_GEMV_SILU_MUL: '1' (default) or '0'; anything else: ValueError."""
    environ = os.environ if environ is None else environ
    raw = environ.get(ENV_SILU_MUL, "")
    val = raw.strip() or "1"
    if val not in ("0", "1"):
        raise ValueError(f"{ENV_SILU_MUL}={raw!r} is not one of 0, 1")
    return val == "1"


def bucket_of(rows: int) -> int | None:
    """Row bucket (1, 2, 4, 8) of a call with ``rows`` rows; None above 8 (the platform's)."""
    if rows < 1 or rows > BUCKETS[-1]:
        return None
    return 1 << (rows - 1).bit_length()


def decide(triton_us: float, platform_us: float, hysteresis: float = HYSTERESIS) -> str:
    """'triton' when it is faster by more than ``hysteresis`` (a fraction of the platform's time)."""
    if not (math.isfinite(triton_us) and triton_us > 0):
        return "platform"
    if not (math.isfinite(platform_us) and platform_us > 0):
        return "triton"
    return "triton" if triton_us < platform_us * (1.0 - hysteresis) else "platform"


@dataclasses.dataclass(frozen=True)
class ShapeKey:
    """One GEMM the model runs: weight [n, k] of ``dtype`` ('bfloat16', 'float16'), with or without bias;
    ``silu_mul``: the gate_up GEMM fused with SiLU-and-mul (output n / 2)."""

    n: int
    k: int
    dtype: str
    bias: bool = False
    silu_mul: bool = False

    @property
    def id(self) -> str:
        return (f"{'silu_mul:' if self.silu_mul else ''}{self.n}x{self.k}:{self.dtype}"
                f"{':bias' if self.bias else ''}")


def _us(v) -> float | None:
    """A time for the table: rounded to 0.01 us; None for a missing or non-finite one (JSON has no NaN)."""
    if v is None:
        return None
    v = float(v)
    return round(v, 2) if math.isfinite(v) else None


def _bucket_line(b: int, e: dict) -> str:
    if "triton_us" in e:
        def fmt(v):
            return "n/a" if v is None else f"{v:.1f}"
        return f"rows {b}: triton {fmt(e['triton_us'])} / platform {fmt(e['platform_us'])} us -> {e['choice']}"
    return f"rows {b}: {e['choice']}"


class DispatchTable:
    """The per-shape choices of one device.

    ``ensure(key, measure, warm)`` fills a shape's row buckets on first sight (from the cache file,
    or by timing both sides with ``measure(bucket) -> (triton_us, platform_us)``; ``warm(bucket)``
    compiles and runs the Triton kernel of a bucket); ``choice(key, rows)`` is then a dict lookup.
    Timing never happens while a CUDA/HIP graph is being captured (``capturing=True``), nor after
    ``freeze()`` (called at the first capture, i.e. when the engine has finished its warm-up): a shape
    first seen then runs on the platform GEMM, and this is logged.
    """

    def __init__(self, mode: str, identity: dict, path: Path | str | None = None,
                 log: Callable[[str], None] = print, warn: Callable[[str], None] | None = None,
                 hysteresis: float = HYSTERESIS, tuned: Callable[[], object] | None = None,
                 use_file: bool = True):
        """``identity``: the device's (tuned_file.device_identity); ``path``: its tuned file (default: where
        the tuning command writes it); ``tuned``: a callable giving the already loaded file (the engine's one
        loader, kernels/tuning/decisions.active_file), else the file at ``path`` is loaded here;
        ``use_file=False``: neither read nor write it (launch options overridden by a variable)."""
        if mode not in MODES:
            raise ValueError(f"{ENV_MODE}={mode!r} is not one of {', '.join(MODES)}")
        self.mode = mode
        self.identity = identity
        self.path = Path(path) if path is not None else tuned_file.default_path(identity)
        self.log = log
        self.warn = warn or log
        self.hysteresis = hysteresis
        self.use_file = use_file
        self._tuned = tuned
        self.entries: dict[str, dict[int, dict]] = {}
        self.frozen = False
        self.timing_s = 0.0  # time spent measuring and warming (first start) or warming (cached)
        # bytes measuring added outside torch's allocator and to torch's peak of allocated bytes: vLLM's memory
        # profile counts both when the measurement runs before the KV cache is sized
        self.measured_outside_torch = self.measured_peak_growth = 0
        self._cached: dict | None = None  # the tuned file's gemv entries, read on first need
        self.why: dict[str, str] = {}  # shape id -> why it runs on the platform GEMM (fallback, late shape)
        self.measured_now: set[str] = set()  # shapes measured in this process (not in the tuned file)

    # -- the tuned file's gemv section ----------------------------------------------------------
    def _read_cache(self) -> dict:
        """The gemv entries of the tuned file (empty when switched off, missing, unreadable or for another
        identity: tuned_file.load says why in one line)."""
        if not self.use_file:
            return {}
        tf = self._tuned() if self._tuned is not None else tuned_file.load(self.path, self.identity, self.warn)
        return dict(tf.gemv_entries()) if tf is not None else {}

    def _cached_entry(self, key: ShapeKey) -> dict[int, dict] | None:
        if self._cached is None:
            self._cached = self._read_cache()
        raw = self._cached.get(key.id)
        if raw is None or tuned_file.check_gemv_entry(key.id, raw) is not None:
            return None
        return {b: {"choice": raw[str(b)]["choice"], "triton_us": _us(raw[str(b)].get("triton_us")),
                    "platform_us": _us(raw[str(b)].get("platform_us"))} for b in BUCKETS}

    def _save(self, key: ShapeKey, entry: dict[int, dict]):
        """Merge one measured shape into the tuned file (re-read first: another process, e.g. another
        tensor-parallel rank, or the tuning command may have written it since), written atomically. A file
        for another identity, or an unreadable one, is replaced by a new one holding this table."""
        if self._cached is None:
            self._cached = {}
        self._cached[key.id] = {str(b): dict(e) for b, e in entry.items()}
        if not self.use_file:
            return
        try:
            doc = json.loads(self.path.read_text())
            if tuned_file.check_doc(doc) or doc["identity"] != self.identity:
                doc = None
        except (OSError, ValueError):
            doc = None
        if doc is None:
            doc = tuned_file.new_doc(self.identity, {}, "engine")
        doc["gemv"][key.id] = {str(b): dict(e) for b, e in entry.items()}
        try:
            tuned_file.write(self.path, doc)
        except (OSError, ValueError) as e:
            self.warn(f"dcu-gemv: could not write the tuned file {self.path} ({e}); the next start measures again")

    # -- choices -------------------------------------------------------------------------------
    def ensure(self, key: ShapeKey, measure: Callable[[int], tuple[float, float]],
               warm: Callable[[int], None], capturing: bool = False) -> dict[int, dict]:
        """The row buckets of ``key``, filled on first sight (see the class docstring)."""
        entry = self.entries.get(key.id)
        if entry is not None:
            return entry
        t0 = time.perf_counter()
        how = ""
        if self.mode == "platform":
            entry = {b: {"choice": "platform"} for b in BUCKETS}
            how = "VLLM_DCU_GEMV=platform"
        elif capturing or self.frozen:
            entry = {b: {"choice": "platform"} for b in BUCKETS}
            when = "during CUDA/HIP graph capture" if capturing else "after the warm-up"
            self.warn(f"dcu-gemv: {key.id} first seen {when}: not measured, runs on the platform GEMM")
            self.why[key.id] = f"first seen {when}"
            self.entries[key.id] = entry
            return entry
        elif self.mode == "triton":
            for b in BUCKETS:
                warm(b)
            entry = {b: {"choice": "triton"} for b in BUCKETS}
            how = "VLLM_DCU_GEMV=triton"
        else:
            entry = self._cached_entry(key)
            if entry is not None:
                how = f"tuned file {self.path.name}"
                for b in BUCKETS:
                    if entry[b]["choice"] == "triton":
                        warm(b)
            else:
                entry, mark = {}, memory_mark()
                for b in BUCKETS:
                    t_us, p_us = measure(b)
                    entry[b] = {"choice": decide(t_us, p_us, self.hysteresis), "triton_us": _us(t_us),
                                "platform_us": _us(p_us)}
                after = memory_mark()
                if mark is not None and after is not None:
                    self.measured_outside_torch += after[0] - mark[0]
                    self.measured_peak_growth += max(0, after[1] - mark[1])
                how = "measured"
                self.measured_now.add(key.id)
                self._save(key, entry)
        self.timing_s += time.perf_counter() - t0
        self.entries[key.id] = entry
        self.log(f"dcu-gemv: {key.id} ({how}): " + "; ".join(_bucket_line(b, entry[b]) for b in BUCKETS))
        return entry

    def fallback(self, key: ShapeKey, why: str) -> dict[int, dict]:
        """Record that ``key`` runs on the platform GEMM (e.g. its measurement failed), logged once."""
        entry = {b: {"choice": "platform"} for b in BUCKETS}
        self.entries[key.id] = entry
        self.why[key.id] = why
        self.warn(f"dcu-gemv: {key.id}: {why}; runs on the platform GEMM")
        return entry

    def choice(self, key: ShapeKey, rows: int) -> str:
        """'triton' or 'platform' for a call of ``rows`` rows (after ``ensure``); above 8 rows: 'platform'."""
        b = bucket_of(rows)
        if b is None:
            return "platform"
        entry = self.entries.get(key.id)
        return entry[b]["choice"] if entry is not None else "platform"

    def freeze(self):
        """No more timing from now on; logs the table's summary once."""
        if self.frozen:
            return
        self.frozen = True
        pairs = [e["choice"] for entry in self.entries.values() for e in entry.values()]
        self.log(f"dcu-gemv: table complete ({self.mode}): {len(self.entries)} shapes, the Triton GEMV in "
                 f"{pairs.count('triton')} of {len(pairs)} (shape, row bucket) pairs; "
                 f"{self.timing_s:.2f} s spent measuring/warming; tuned file {self.path}"
                 + (f"; measuring grew device memory outside torch's allocator by "
                    f"{self.measured_outside_torch / 2**20:.0f} MiB and torch's allocated peak by "
                    f"{self.measured_peak_growth / 2**20:.0f} MiB"
                    if self.measured_outside_torch or self.measured_peak_growth else ""))


    def summary_lines(self) -> list[str]:
        """The decision table's GEMV lines: per shape and row bucket, which side runs and the measured ratio
        (GEMV / platform time), or why."""
        lines = []
        for sid in sorted(self.entries):
            parts = []
            for b in BUCKETS:
                e = self.entries[sid][b]
                t, p = e.get("triton_us"), e.get("platform_us")
                ratio = f" {t / p:.2f}x" if t and p else ""
                parts.append(f"{b} row{'s' if b > 1 else ''} {'ours' if e['choice'] == 'triton' else 'platform'}{ratio}")
            why = self.why.get(sid) or ("measured at start" if sid in self.measured_now else
                                        "tuned file" if self.mode == "auto" else f"{ENV_MODE}={self.mode}")
            lines.append(f"gemv {sid}  {', '.join(parts)} ({why})")
        return lines


# --- timing on the device (torch only) ----------------------------------------------------------

def time_on_device(calls: dict, copies: int = 1, *, reps: int = 7, min_calls: int = 4, use_graph: bool = True,
                   warmup_s: float = 0.0, log: Callable[[str], None] | None = None) -> dict:
    """Median time in us of one call of each ``calls[name](i)`` (i: which copy of the inputs, 0 ..
    copies - 1, so small weights can be read from more memory than the L2 cache holds).

    Each side is captured in a CUDA/HIP graph of ``max(copies, min_calls)`` calls (launch overhead
    excluded, as in a captured decode step) and replayed ``reps`` times, the sides interleaved; a side
    whose capture fails is timed eagerly instead. The first call of each side runs before any
    capture (Triton compiles there). ``warmup_s``: replay the sides for that long before timing (clocks come back
    up after a compile's idle time; benchmarks use it, the engine's dispatch does not). Must not be called while the
    current stream is capturing."""
    import torch

    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError("dcu-gemv: time_on_device called during graph capture")
    n_calls = max(copies, min_calls)
    n_calls = -(-n_calls // copies) * copies
    runners = {}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for fn in calls.values():
            fn(0)  # compile / library warm-up outside any capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    for name, fn in calls.items():
        runners[name] = None
        if use_graph:
            try:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, capture_error_mode="thread_local"):
                    for j in range(n_calls):
                        fn(j % copies)
                runners[name] = g
            except Exception as e:  # noqa: BLE001 - a library that cannot be captured: time it eagerly
                if log:
                    log(f"dcu-gemv: {name} not capturable ({type(e).__name__}: {e}); timing it eagerly")
                torch.cuda.synchronize()
        if runners[name] is None:
            runners[name] = (lambda f=fn: [f(j % copies) for j in range(n_calls)])
    warm_until = time.perf_counter() + warmup_s
    while time.perf_counter() < warm_until:
        for run in runners.values():
            run.replay() if isinstance(run, torch.cuda.CUDAGraph) else run()
        torch.cuda.synchronize()
    times = {name: [] for name in calls}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        for name, run in runners.items():
            start.record()
            run.replay() if isinstance(run, torch.cuda.CUDAGraph) else run()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) * 1e3 / n_calls)
    del runners
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}


def memory_mark() -> tuple[int, int] | None:
    """(bytes the GPU uses outside torch's allocator, torch's peak of allocated bytes), or None without a GPU: what
    vLLM's memory profile counts besides the weights (a measurement that grows either before the KV cache is sized
    takes KV blocks; a start with a tuned file measures nothing)."""
    import torch

    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return total - free - torch.cuda.memory_reserved(), torch.cuda.memory_stats().get("allocated_bytes.all.peak", 0)


def l2_copies(weight_bytes: int, l2_bytes: int, max_copies: int = 64) -> int:
    """How many copies of a weight to rotate through so that repeated calls read from memory, not
    from the L2 cache: enough for twice the L2's size (1 when the weight alone is that large)."""
    if weight_bytes <= 0 or weight_bytes >= 2 * l2_bytes:
        return 1
    return max(1, min(max_copies, -(-2 * l2_bytes // weight_bytes)))


def device_measure(weight, bias, triton_fn: Callable, platform_fn: Callable, *, max_rel_diff: float = 2e-2,
                   log: Callable[[str], None] | None = None):
    """(measure, warm, release) for ``DispatchTable.ensure`` on the model's own weight: ``triton_fn(x, w, b)``
    against ``platform_fn(x, w, b)`` with random x of ``bucket`` rows. ``measure`` first checks the two
    agree (relative difference below ``max_rel_diff``; a GEMV that computes garbage on some toolchain
    must not win on speed), then times both with ``time_on_device``, rotating through copies of the
    weight when it is smaller than twice the L2 cache. ``release()`` drops the copies."""
    import torch

    state = {}

    def inputs(bucket):
        g = torch.Generator(device=weight.device).manual_seed(bucket)
        x = torch.randn(bucket, weight.shape[1], generator=g, device=weight.device, dtype=torch.float32)
        return (x * 0.5).to(weight.dtype)

    def weights():
        if "w" not in state:
            copies = 1
            if weight.device.type == "cuda":
                props = torch.cuda.get_device_properties(weight.device)
                l2 = getattr(props, "L2_cache_size", 0) or 64 << 20
                copies = l2_copies(weight.numel() * weight.element_size(), l2)
            state["w"] = [weight] + [weight.clone() for _ in range(copies - 1)]
        return state["w"]

    def warm(bucket):
        triton_fn(inputs(bucket), weight, bias)

    def measure(bucket):
        x = inputs(bucket)
        ours = triton_fn(x, weight, bias).float()
        ref = platform_fn(x, weight, bias).float()
        rel = float((ours - ref).norm() / ref.norm().clamp_min(1e-30))
        if not rel < max_rel_diff:  # also catches NaN
            raise RuntimeError(f"the Triton GEMV differs from the platform GEMM by {rel:.2e} (relative) at "
                               f"{bucket} rows")
        ws = weights()
        t = time_on_device({"triton": lambda i: triton_fn(x, ws[i], bias),
                            "platform": lambda i: platform_fn(x, ws[i], bias)}, copies=len(ws), log=log)
        return t["triton"], t["platform"]

    return measure, warm, state.clear
