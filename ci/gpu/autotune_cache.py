"""Triton autotuning results carried from one device call to the next.

Every fresh device machine re-runs the sweeps of the autotuned kernels the first time an engine starts (Qwen3.5's
Gated DeltaNet kernels: about 2.5-3 minutes of a 10-minute call). With TRITON_CACHE_AUTOTUNING=1, which the
harness sets, Triton writes each sweep's result as ``<cache dir>/<hash>/<kernel>.autotune.json``; the hash covers
Triton's version, the GPU target, the kernel's source, the cache-relevant environment and the tuning key, so a file
written on one H200 is valid on another running the same bundle, and a stale one is never looked up.

``save`` copies those files (a few KB each) from where Triton and vLLM keep them under $HOME (Triton's default
cache, and vLLM's compile cache, which points TRITON_CACHE_DIR inside it under torch.compile) into a folder, keeping
their paths; ``restore`` copies them back, never replacing a file that is there. ci/gpu/jobs.py saves them into
results.tgz (``triton-autotune/``) and ``bash ci/gpu/run.sh prepare`` restores ``.gpu/triton-autotune/``:

    tar xzf <files_at>/results.tgz -C .gpu triton-autotune    # then carry .gpu with the next call
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

ROOTS = (".triton/cache", ".cache/vllm")  # under $HOME
PATTERN = "*.autotune.json"


def _files(top: Path):
    """Every autotuning result under top's ROOTS (top: a home folder, or a folder save wrote)."""
    for root in ROOTS:
        base = top / root
        if base.is_dir():
            yield from (p for p in sorted(base.rglob(PATTERN)) if p.is_file())


def _copy(src: Path, dst: Path) -> None:
    """src -> dst through a temporary name in dst's folder (never a half-written file)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def save(dest: Path, home: Path | None = None) -> int:
    """Copy every autotuning result under ``home`` (default $HOME) into ``dest``, paths relative to ``home``;
    returns how many."""
    home = Path.home() if home is None else home
    n = 0
    for p in _files(home):
        _copy(p, dest / p.relative_to(home))
        n += 1
    return n


def restore(src: Path, home: Path | None = None) -> int:
    """Copy the results saved in ``src`` back under ``home`` (default $HOME), skipping files already there and
    anything outside ROOTS; returns how many were copied. A missing ``src`` restores nothing."""
    home = Path.home() if home is None else home
    n = 0
    for p in _files(src):
        dst = home / p.relative_to(src)
        if not dst.exists():
            _copy(p, dst)
            n += 1
    return n


def main(argv: list[str]) -> int:
    """python3 ci/gpu/autotune_cache.py save DEST | restore SRC (jobs.py and the harness call the functions)."""
    if len(argv) != 2 or argv[0] not in ("save", "restore"):
        print("usage: autotune_cache.py {save DEST | restore SRC}", file=sys.stderr)
        return 2
    n = (save if argv[0] == "save" else restore)(Path(argv[1]))
    if n:
        print(f"Triton autotuning results {'saved' if argv[0] == 'save' else 'restored'}: {n} ({argv[1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
