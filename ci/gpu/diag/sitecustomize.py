"""Diagnostic for GPU runs: log every Triton JIT compile (kernel, seconds, process) to stderr.

Use: put this folder first on PYTHONPATH of the process to watch (child processes inherit it), e.g.
    PYTHONPATH=$PWD/ci/gpu/diag bash ci/gpu/run.sh python -m bench.serve_bench ...
Each compile prints one line `triton-compile pid=P t=UNIX_TIME s=SECONDS kernel=NAME constexprs=...`, so a stall in
a server log can be matched with the compiles that happened then. Loaded by Python's site module; does nothing
when Triton is not installed.
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
        print(f"triton-compile pid={os.getpid()} t={time.time():.3f} s={dt:.2f} kernel={fn.module}.{fn.name} "
              f"constexprs={str(consts)[:300]}", file=sys.stderr, flush=True)
        return False

    try:
        knobs.runtime.jit_cache_hook = before
        knobs.runtime.jit_post_compile_hook = after
    except Exception:
        return


_install()
