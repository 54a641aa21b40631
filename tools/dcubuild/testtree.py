"""The patched tree the tests import vLLM from: build/test-tree, rebuilt only when its inputs changed.

    python -m tools.dcubuild.testtree [DIR]     prepare DIR (default build/test-tree) and print its path

ci/run_tests.sh runs this and puts the printed folder first on PYTHONPATH; bench/sched_sim.py does the same for
its own run. tests/conftest.py checks that the tree `import vllm` finds is current.
"""
from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
from pathlib import Path

from .common import REPO, BuildError
from .tree import PACKAGES

DEFAULT = REPO / "build" / "test-tree"
STAMP = ".dcu-inputs.sha256"


def inputs_hash(repo: Path = REPO) -> str:
    """Hash of everything a patched tree is made from (the build tool, the pins, the series, our packages)."""
    h = hashlib.sha256()
    for sub in ("tools", "vendor", "patches") + tuple(a for a, _ in PACKAGES):
        for f in sorted((repo / sub).rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts:
                h.update(str(f.relative_to(repo)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _stamp(tree: Path) -> str | None:
    """The inputs hash the tree was built from (None: not built by prepared_tree)."""
    path = tree / STAMP
    return path.read_text() if path.is_file() else None


def is_current(tree: Path, repo: Path = REPO) -> bool:
    return _stamp(tree) == inputs_hash(repo)


def prepared_tree(tree: Path = DEFAULT, repo: Path = REPO) -> Path:
    """`tree`, (re)built with --tree when the inputs changed since it was built; one builder at a time.
    Raises BuildError carrying the build's output."""
    tree.parent.mkdir(parents=True, exist_ok=True)
    with open(tree.parent / f".{tree.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        want = inputs_hash(repo)
        if _stamp(tree) == want:
            return tree
        p = subprocess.run([sys.executable, "-m", "tools.dcubuild", "--tree", "--tree-dir", str(tree)], cwd=repo,
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise BuildError(f"could not prepare the patched vLLM tree {tree}:\n{p.stdout}{p.stderr}")
        (tree / STAMP).write_text(want)
    return tree


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        print(prepared_tree(Path(args[0]).resolve() if args else DEFAULT))
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
