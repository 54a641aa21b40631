"""Shared test setup.

* The repository root is importable, so `import kernels...` works (kernel tests).
* `import vllm` resolves to the PATCHED tree of the full series: at session start the build tool applies
  patches/series to the pinned base and installs kernels/ into build/test-tree (about 20 s; reused while the
  tool, pins, patches and kernels are unchanged),
  and that tree goes first on sys.path. Set VLLM_DCU_TREE=<dir> to use another tree, or
  VLLM_DCU_USE_INSTALLED=1 to test whatever `import vllm` finds (the GPU harness does this).
* Without a GPU, TRITON_INTERPRET=1 is set before any kernel is imported (Triton's CPU interpreter).
* GPU tests are marked `gpu` and deselected by default (pytest.ini); run them with `-m gpu` on a GPU machine.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


# Triton decides interpreter vs compiler when a kernel is decorated, so this must happen before any
# kernel module is imported: without a GPU every Triton kernel runs in the CPU interpreter.
if not _has_gpu():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _inputs_hash() -> str:
    """Hash of everything the patched tree is made from (tool, pins, series, patches, kernels)."""
    import hashlib

    h = hashlib.sha256()
    for sub in ("tools", "vendor", "patches", "kernels"):
        for f in sorted((REPO / sub).rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts:
                h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _patched_tree() -> Path | None:
    if os.environ.get("VLLM_DCU_USE_INSTALLED") == "1":
        return None
    if os.environ.get("VLLM_DCU_TREE"):
        return Path(os.environ["VLLM_DCU_TREE"]).resolve()
    import fcntl

    tree = REPO / "build" / "test-tree"
    stamp = tree / ".dcu-inputs.sha256"
    tree.parent.mkdir(parents=True, exist_ok=True)
    # one builder at a time; a tree built from the same inputs is reused
    with open(REPO / "build" / ".test-tree.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        want = _inputs_hash()
        if stamp.exists() and stamp.read_text() == want:
            return tree
        p = subprocess.run([sys.executable, str(REPO / "tools" / "vllm_dcu_build.py"), "--tree", "--tree-dir",
                            str(tree)], capture_output=True, text=True)
        if p.returncode != 0:
            raise pytest.UsageError(f"could not prepare the patched vLLM tree for tests:\n{p.stdout}{p.stderr}")
        stamp.write_text(want)
    return tree


_TREE = _patched_tree()
if _TREE is not None:
    sys.path.insert(0, str(_TREE))
    # subprocesses started by tests (e.g. `python -m vllm...`) see the same tree
    os.environ["PYTHONPATH"] = os.pathsep.join([str(_TREE), str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)


@pytest.fixture(scope="session")
def vllm_tree() -> Path | None:
    """The patched vLLM tree on sys.path (None when testing an installed vllm)."""
    return _TREE


