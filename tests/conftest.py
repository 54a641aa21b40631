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


def _patched_tree() -> Path | None:
    if os.environ.get("VLLM_DCU_USE_INSTALLED") == "1":
        return None
    if os.environ.get("VLLM_DCU_TREE"):
        return Path(os.environ["VLLM_DCU_TREE"]).resolve()
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import vllm_dcu_build
    finally:
        sys.path.remove(str(REPO / "tools"))
    try:  # a tree built from the same inputs is reused
        return vllm_dcu_build.prepared_tree(REPO / "build" / "test-tree")
    except vllm_dcu_build.BuildError as e:
        raise pytest.UsageError(f"tests: {e}") from None  # e names the tree and carries the build's output


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


