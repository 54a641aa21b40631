"""Shared test setup.

* The repository root is importable (pytest.ini: `pythonpath = .`), so `import kernels...`, `dcu`, `bench`,
  `tools` work.
* `import vllm` resolves to the PATCHED tree of the full series: ci/run_tests.sh prepares build/test-tree
  (`python -m tools.dcubuild.testtree`: the build tool applies patches/series to the pinned base and installs
  kernels/ and dcu/, about 20 s, reused while the tool, pins, patches and packages are unchanged) and puts it
  first on PYTHONPATH, so subprocesses started by tests see it too. VLLM_DCU_TREE=<dir> makes run_tests.sh use
  another tree; VLLM_DCU_USE_INSTALLED=1 tests whatever `import vllm` finds (the GPU harness does this).
  This file edits no import path: it checks that the tree found is the current one and stops the run otherwise.
* Without a GPU, TRITON_INTERPRET=1 is set before any kernel is imported (Triton's CPU interpreter).
* GPU tests are marked `gpu` and deselected by default (pytest.ini); run them with `-m gpu` on a GPU machine.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


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
    """The folder `import vllm` loads from, checked to be a current patched tree (None: testing an installed
    vllm on purpose)."""
    if os.environ.get("VLLM_DCU_USE_INSTALLED") == "1":
        return None
    from tools.dcubuild import testtree

    spec = importlib.util.find_spec("vllm")
    tree = Path(spec.submodule_search_locations[0]).parent if spec and spec.submodule_search_locations else None
    how = ("run the tests through ci/run_tests.sh, which prepares the tree and puts it on PYTHONPATH (or set "
           "VLLM_DCU_USE_INSTALLED=1 to test an installed vllm)")
    chosen = os.environ.get("VLLM_DCU_TREE")
    if chosen:
        if tree != Path(chosen).resolve():
            raise pytest.UsageError(f"tests: VLLM_DCU_TREE is {chosen} but `import vllm` finds {tree}: {how}")
        return tree
    if tree is None or not (tree / testtree.STAMP).is_file():
        raise pytest.UsageError(f"tests: `import vllm` finds {tree or 'nothing'}, not the tests' patched tree: {how}")
    if not testtree.is_current(tree):
        raise pytest.UsageError(f"tests: the patched tree {tree} is older than tools/, vendor/, patches/, kernels/ "
                                f"or dcu/: {how}")
    return tree


_TREE = _patched_tree()


@pytest.fixture(scope="session")
def vllm_tree() -> Path | None:
    """The patched vLLM tree `import vllm` loads (None when testing an installed vllm)."""
    return _TREE


@pytest.fixture(autouse=True)
def _fresh_kernel_decisions():
    """Every test starts with no launch kind decided and no tuned file loaded (kernels/tuning/decisions.py keeps
    them per process, as the engine does): a test that makes a kernel fail its startup check must not hand that
    launch kind to upstream's path for the tests after it. Both copies: the repository's (kernel tests, and dcu/
    imported as the top-level `dcu`) and the tree's (vllm.dcu.*, which dcu/_kernels.py resolves to vllm.dcu_kernels)."""
    import sys

    def reset():
        for name in ("kernels.tuning.decisions", "vllm.dcu_kernels.tuning.decisions"):
            if name in sys.modules:
                sys.modules[name].reset()

    reset()
    yield
    reset()
