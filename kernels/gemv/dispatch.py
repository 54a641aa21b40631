"""Which side runs a decode GEMM, the Triton GEMV or the platform GEMM, measured on the device.

For every GEMM shape a model runs (N, K, dtype, bias, plain or fused with SiLU-and-mul) and every
row bucket (1, 2, 4, 8 rows), both sides are timed once on the actual device and the faster is kept;
the Triton GEMV must win by more than HYSTERESIS (1%) to be chosen. The table is cached as JSON per
device and software versions (``cache_identity``), so a later start only loads it. While timing, the
Triton kernel of every row bucket is compiled; shapes read from the cache compile theirs in
``warm``, so nothing compiles once a model is serving.

This module is independent of vLLM (torch only; Triton only through the callables it is given):
vLLM's side (vllm.dcu.gemv, patch 0007) supplies the two GEMMs and the logger; kernels/gemv/bench.py
uses ``decide`` to say what the dispatch would pick.

Environment:
  VLLM_DCU_GEMV             auto (default: measured) | triton (always the GEMV for <= 8 rows) |
                            platform (always the platform GEMM) | off (no hook at all: upstream's
                            code path, not even the custom op)
  VLLM_DCU_GEMV_CACHE_DIR   where the table is cached (default ~/.cache/vllm-dcu)
  VLLM_DCU_GEMV_SILU_MUL    1 (default) | 0: offer the gate_up GEMV fused with SiLU-and-mul (it is then
                            measured against the platform GEMM + a separate SiLU-and-mul like any shape)
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Callable

MODES = ("auto", "triton", "platform", "off")
ENV_MODE = "VLLM_DCU_GEMV"
ENV_CACHE_DIR = "VLLM_DCU_GEMV_CACHE_DIR"
ENV_SILU_MUL = "VLLM_DCU_GEMV_SILU_MUL"
HYSTERESIS = 0.01
BUCKETS = (1, 2, 4, 8)
CACHE_FORMAT = 1


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


def code_digest() -> str:
    """Hash of the GEMV's source files (kernels, launch parameters, this dispatch): part of the cache
    identity, so a changed kernel is measured again."""
    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for name in ("gemv.py", "silu_mul.py", "launch_params.py", "dispatch.py"):
        h.update(name.encode())
        h.update((here / name).read_bytes())
    return h.hexdigest()[:16]


def default_cache_dir(environ=None) -> Path:
    environ = os.environ if environ is None else environ
    if environ.get(ENV_CACHE_DIR):
        return Path(environ[ENV_CACHE_DIR]).expanduser()
    return Path.home() / ".cache" / "vllm-dcu"


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


def cache_identity(device: str, versions: dict) -> dict:
    """What a cached table is valid for: the device's name and the software versions (torch, Triton,
    vllm-dcu, the GEMV's launch parameters ...). Any change gives another file."""
    ident = {"format": CACHE_FORMAT, "device": device}
    ident.update({k: str(v) for k, v in sorted(versions.items())})
    return ident


def cache_file(cache_dir: Path | str, identity: dict) -> Path:
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir) / f"gemv-dispatch-{digest}.json"


def write_json_atomic(path: Path, doc: dict):
    """Write ``doc`` to ``path`` whole or not at all: a temporary file in the same folder, then a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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

    def __init__(self, mode: str, identity: dict, cache_dir: Path | str | None = None,
                 log: Callable[[str], None] = print, warn: Callable[[str], None] | None = None,
                 hysteresis: float = HYSTERESIS):
        if mode not in MODES:
            raise ValueError(f"{ENV_MODE}={mode!r} is not one of {', '.join(MODES)}")
        self.mode = mode
        self.identity = identity
        self.path = cache_file(cache_dir if cache_dir is not None else default_cache_dir(), identity)
        self.log = log
        self.warn = warn or log
        self.hysteresis = hysteresis
        self.entries: dict[str, dict[int, dict]] = {}
        self.frozen = False
        self.timing_s = 0.0  # time spent measuring and warming (first start) or warming (cached)
        self._cached: dict | None = None  # the cache file's entries, read on first need

    # -- cache ---------------------------------------------------------------------------------
    def _read_cache(self) -> dict:
        """Entries of the cache file (empty when missing, unreadable or for another identity)."""
        try:
            with open(self.path) as f:
                doc = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            self.warn(f"dcu-gemv: ignoring unreadable cache {self.path} ({type(e).__name__}: {e}); re-measuring")
            return {}
        ok = isinstance(doc, dict) and doc.get("identity") == self.identity and isinstance(doc.get("entries"), dict)
        if not ok:
            self.warn(f"dcu-gemv: ignoring cache {self.path}: not a table for this device and versions")
            return {}
        return doc["entries"]

    def _cached_entry(self, key: ShapeKey) -> dict[int, dict] | None:
        if self._cached is None:
            self._cached = self._read_cache()
        raw = self._cached.get(key.id)
        if not isinstance(raw, dict) or {str(b) for b in BUCKETS} - set(raw):
            return None
        try:
            entry = {b: {"choice": raw[str(b)]["choice"], "triton_us": _us(raw[str(b)]["triton_us"]),
                         "platform_us": _us(raw[str(b)]["platform_us"])} for b in BUCKETS}
        except (KeyError, TypeError, ValueError):
            return None
        if any(e["choice"] not in ("triton", "platform") for e in entry.values()):
            return None
        return entry

    def _save(self, key: ShapeKey, entry: dict[int, dict]):
        """Merge one measured shape into the cache file (re-read first: another process, e.g. another
        tensor-parallel rank, may have added shapes), written atomically."""
        entries = self._read_cache()
        entries[key.id] = {str(b): dict(e) for b, e in entry.items()}
        self._cached = entries
        try:
            write_json_atomic(self.path, {"identity": self.identity, "entries": entries})
        except OSError as e:
            self.warn(f"dcu-gemv: could not write the cache {self.path} ({e}); the next start measures again")

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
                how = f"cached, {self.path.name}"
                for b in BUCKETS:
                    if entry[b]["choice"] == "triton":
                        warm(b)
            else:
                entry = {}
                for b in BUCKETS:
                    t_us, p_us = measure(b)
                    entry[b] = {"choice": decide(t_us, p_us, self.hysteresis), "triton_us": _us(t_us),
                                "platform_us": _us(p_us)}
                how = "measured"
                self._save(key, entry)
        self.timing_s += time.perf_counter() - t0
        self.entries[key.id] = entry
        self.log(f"dcu-gemv: {key.id} ({how}): " + "; ".join(_bucket_line(b, entry[b]) for b in BUCKETS))
        return entry

    def fallback(self, key: ShapeKey, why: str) -> dict[int, dict]:
        """Record that ``key`` runs on the platform GEMM (e.g. its measurement failed), logged once."""
        entry = {b: {"choice": "platform"} for b in BUCKETS}
        self.entries[key.id] = entry
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
                 f"{self.timing_s:.2f} s spent measuring/warming; cache {self.path}")


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
