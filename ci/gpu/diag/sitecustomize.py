"""Diagnostic for GPU runs: log every Triton JIT compile (kernel, seconds, process) and autotuning lookup to stderr.

Use: put this folder first on PYTHONPATH of the process to watch (child processes inherit it), e.g.
    PYTHONPATH=$PWD/ci/gpu/diag bash ci/gpu/run.sh python -m bench.serve_bench ...
Each compile prints one line `triton-compile pid=P t=UNIX_TIME s=SECONDS kernel=NAME constexprs=...`, so a stall in
a server log can be matched with the compiles that happened then; the line ends with ` spec=` and the argument
types as Triton specialized them (which dtype, which integers were 1 or multiples of 16), so two compiles of one
kernel can be told apart. Each autotuning lookup that misses the process's own results prints
`triton-autotune pid=P t=UNIX_TIME kernel=NAME disk=hit|miss key=...`: on a machine without Triton's autotuning
cache (TRITON_CACHE_AUTOTUNING) every such line is a sweep of the kernel's configurations. Loaded by Python's site
module; does nothing when Triton is not installed.
"""
import os
import sys
import time


def _install() -> None:
    try:
        from triton import knobs
    except Exception:  # no Triton, or an old one without knobs: nothing to watch
        return
    started: dict = {}

    def before(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
        started[repr] = time.time()
        return False  # never skip the compile

    def after(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
        t0 = started.pop(repr, None)
        dt = time.time() - t0 if t0 is not None else float("nan")
        consts = compile.get("constants") if isinstance(compile, dict) else None
        consts = {k2: v for k2, v in (consts or {}).items() if not callable(v)}
        spec = repr.split("](", 1)[1][:-1] if "](" in repr else ""
        print(f"triton-compile pid={os.getpid()} t={time.time():.3f} s={dt:.2f} kernel={fn.module}.{fn.name} "
              f"constexprs={str(consts)[:300]} spec={spec[:3000]}", file=sys.stderr, flush=True)
        return False

    try:
        knobs.runtime.jit_cache_hook = before
        knobs.runtime.jit_post_compile_hook = after
    except Exception:
        return
    try:
        from triton.runtime.autotuner import Autotuner
    except Exception:
        return
    check = getattr(Autotuner, "check_disk_cache", None)
    if check is None:
        return

    def check_disk_cache(self, tuning_key, configs, bench_fn):
        hit = check(self, tuning_key, configs, bench_fn)
        fn = getattr(self, "base_fn", None) or getattr(self, "fn", None)
        name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__name__', '?')}"
        print(f"triton-autotune pid={os.getpid()} t={time.time():.3f} kernel={name} disk={'hit' if hit else 'miss'} "
              f"key={str(tuning_key)[:500]}", file=sys.stderr, flush=True)
        return hit

    Autotuner.check_disk_cache = check_disk_cache


_install()
