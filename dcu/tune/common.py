"""What every phase of the tuning run shares: the device, timing, the comparison against upstream, and a measured
side's outcome."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time

import torch

from .. import kernel_checks
from .._kernels import decisions, one_line

# the startup checks' limits (the kernel tests', bf16 outputs): max absolute error, relative error norm
DECODE_TOL = kernel_checks.DECODE_TOL[torch.bfloat16]
PREFILL_TOL = kernel_checks.PREFILL_TOL[torch.bfloat16]
GEMV_MAX_REL = 2e-2  # kernels/gemv/dispatch.device_measure: the GEMV against the platform GEMM


class Failed(Exception):
    """A side of ours that did not run (``why`` starts "failed to compile") or did not match upstream ("differs
    from upstream")."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


def run_ours(fn):
    """``fn()``, any exception turned into Failed("failed to compile: ...") (a compile error, an out-of-resources
    launch and a launch-parameter error all end there: the path cannot run as it is)."""
    try:
        return fn()
    except Failed:
        raise
    except Exception as e:  # noqa: BLE001 - whatever stops our kernel decides the path
        raise Failed(f"failed to compile: {one_line(e)}") from e


def compare(got: torch.Tensor, want: torch.Tensor, tol: tuple, where: str) -> dict:
    """The startup check's comparison (dcu/kernel_checks.compare: {"max_abs", "rel"}), a mismatch raised as
    Failed("differs from upstream: <where>: ...")."""
    try:
        return kernel_checks.compare(got, want, tol, where)
    except decisions.MismatchError as e:
        raise Failed(f"differs from upstream: {e}") from e


def device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def compile_backend() -> str:
    """What Triton compiles for here: "hip", "cuda" or "interpreter" (not torch.version.hip: under
    VLLM_DCU_EMULATE_ARCH the launch tables are the DCU's while the compiler is CUDA's)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "interpreter"
    import triton

    return triton.runtime.driver.active.get_current_target().backend


def rocm_options(target: str) -> bool:
    """Whether ROCm-only launch options (waves_per_eu, ...) are worth sweeping: a ROCm table compiled by ROCm's
    Triton."""
    return (target.startswith("gfx") or target == "rocm") and compile_backend() == "hip"


@contextlib.contextmanager
def env(var: str, override: dict | None):
    """``var`` set to ``override`` as JSON (unset when empty) while the block runs, restored after."""
    old = os.environ.get(var)
    if override:
        os.environ[var] = json.dumps(override, sort_keys=True)
    else:
        os.environ.pop(var, None)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = old


def time_us(calls: dict, copies: int = 1, reps: int = 10) -> dict:
    """Median us of one call of each ``calls[name](i)``, the sides interleaved in one process: on a GPU
    kernels/gemv/dispatch.time_on_device (each side a captured graph, 50 ms of replays first); on the CPU (Triton's
    interpreter, which compiles nothing) one perf_counter call (numbers for the flow only)."""
    if device().type == "cuda":
        from .._kernels import time_on_device

        return time_on_device(calls, copies, reps=reps, warmup_s=0.05)
    out = {}
    for name, fn in calls.items():
        t0 = time.perf_counter()
        fn(0)
        out[name] = (time.perf_counter() - t0) * 1e6
    return out


SWEEP_DEADLINE = {"t": None}  # time.monotonic() after which --full tries no further candidate (--sweep-budget-s)


def sweep_over() -> bool:
    return SWEEP_DEADLINE["t"] is not None and time.monotonic() > SWEEP_DEADLINE["t"]


def geomean(xs) -> float:
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


@dataclasses.dataclass
class Side:
    """One launch kind's outcome: ours against upstream at the timed cases."""
    path: str  # a tuned_file.PATHS name
    cases: list  # labels of the timed cases, e.g. "1 x 16K"
    ours_us: list | None = None
    upstream_us: list | None = None
    failure: str | None = None  # Failed.why
    launch: str = "table"  # which launch ours ran with
    errors: list = dataclasses.field(default_factory=list)  # compare()'s numbers per case
    by_total_time: bool = False  # ratio of summed times instead of the geomean of per-case ratios (sweep.Family)

    @property
    def ratio(self) -> float | None:
        if self.failure or not self.ours_us or not self.upstream_us:
            return None
        if self.by_total_time:
            return sum(self.ours_us) / sum(self.upstream_us)
        return geomean(o / u for o, u in zip(self.ours_us, self.upstream_us))


def ctx_label(tokens: int) -> str:
    return f"{tokens // 1024}K" if tokens >= 1024 and tokens % 1024 == 0 else str(tokens)
