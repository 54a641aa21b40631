"""The patched tree: unpack the base into a git repository, apply the series with no fuzz, install our packages."""
from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from .common import BuildError, log, run, sha256_file, shown
from .series import Patch
from .wheel import BINARY_SUFFIXES, open_wheel

AUTHOR = ("vllm-dcu", "vllm-dcu@users.noreply.github.com")

# Repository folders installed into the tree as packages of vllm (the only code of ours outside patches/):
# kernels/ holds the Triton kernels, dcu/ the vLLM-side modules the patches' hooks import. Both ship in every
# build; without the hooks that import them they are inert.
PACKAGES = (("kernels", "dcu_kernels"), ("dcu", "dcu"))
# Benchmark and measurement scripts (run from the repository as `python -m kernels.<x>.bench`) stay out of the
# wheel; nothing a build runs imports them. One list: the kernels hash of the tuned file (kernels/tuning) skips the
# same files, so a checkout and its wheel hash alike.
from kernels.tuning.tuned_file import NOT_SHIPPED as NOT_INSTALLED  # noqa: E402


def git(tree: Path, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, GIT_AUTHOR_NAME=AUTHOR[0], GIT_AUTHOR_EMAIL=AUTHOR[1], GIT_COMMITTER_NAME=AUTHOR[0],
               GIT_COMMITTER_EMAIL=AUTHOR[1], GIT_AUTHOR_DATE="2026-01-01T00:00:00Z",
               GIT_COMMITTER_DATE="2026-01-01T00:00:00Z", GIT_CONFIG_NOSYSTEM="1", HOME=str(tree))
    return run(["git", *args], cwd=tree, env=env, check=check, input=input)


def unpack(wheel: Path, tree: Path) -> None:
    if tree.exists():
        shutil.rmtree(tree)
    tree.mkdir(parents=True)
    with open_wheel(wheel) as zf:
        members = [i for i in zf.infolist() if not i.is_dir() and not i.filename.endswith(BINARY_SUFFIXES)]
        for i in members:
            if i.filename.startswith("/") or ".." in Path(i.filename).parts:
                raise BuildError(f"{wheel.name} has an unsafe member path {i.filename}")
            zf.extract(i, tree)
    commit_base(tree, f"base: {wheel.name}\n\nsha256 {sha256_file(wheel)}")


def commit_base(tree: Path, message: str) -> None:
    """Make `tree` a git repository whose first commit, tagged dcu-base, is the unpatched base."""
    git(tree, "init", "-q")
    (tree / ".git" / "info" / "exclude").write_text("*.so\n__pycache__/\n")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", message)
    git(tree, "tag", "dcu-base")


_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@", re.M)


def describe_failure(patch: Patch, err: str) -> str:
    """Turn git apply's complaint into 'file hunk N (line L)'."""
    m = re.search(r"patch failed: (\S+):(\d+)", err)
    if m:
        fname, line = m.group(1), int(m.group(2))
        body = patch.text.split(f"+++ b/{fname}\n", 1)
        hunk = "?"
        if len(body) == 2:
            chunk = re.split(r"^diff --git ", body[1], maxsplit=1, flags=re.M)[0]
            starts = [int(h) for h in _HUNK.findall(chunk)]
            if line in starts:
                hunk = str(starts.index(line) + 1)
        return f"{fname} hunk {hunk} (line {line})"
    m = re.search(r"error: (\S+): (does not exist in index|No such file or directory|already exists in "
                  r"working directory)", err)
    if m:
        return f"{m.group(1)}: {m.group(2)}"
    lines = [l for l in err.splitlines() if l.startswith("error:")]
    return (lines[-1] if lines else err.strip().splitlines()[-1] if err.strip() else "unknown error")[:200]


def apply_patch(tree: Path, patch: Patch) -> None:
    p = git(tree, "apply", "--check", "--whitespace=nowarn", str(patch.path), check=False)
    if p.returncode != 0:
        raise BuildError(f"patch {patch.name} does not apply: {describe_failure(patch, p.stderr)}")
    git(tree, "apply", "--index", "--whitespace=nowarn", str(patch.path))
    git(tree, "commit", "-q", "--allow-empty", "-m",
        f"{patch.subject}\n\nPatch-Name: {patch.name}\nPatch-Sha256: {patch.sha256}")


def apply_series(wheel: Path, patches: list[Patch], tree: Path, repo: Path, quiet: bool = False) -> None:
    """Unpack `wheel` into `tree` and apply `patches` in order (stops at the first that does not apply)."""
    unpack(wheel, tree)
    if not quiet:
        log(f"unpack  {wheel.name} -> {shown(tree, repo)} (git base commit)")
    for p in patches:
        apply_patch(tree, p)
        if not quiet:
            log(f"apply   {p.name}")


def check_series(wheel: Path, patches: list[Patch], tree: Path) -> list[tuple[Patch, str | None]]:
    """Apply cumulatively; a patch that fails is reported and skipped, later ones are still tried."""
    unpack(wheel, tree)
    results = []
    for p in patches:
        try:
            apply_patch(tree, p)
            results.append((p, None))
        except BuildError as e:
            results.append((p, str(e).split(": ", 1)[-1]))
    return results


def package_files(src: Path) -> list[Path]:
    """The files of one PACKAGES folder that go into the tree (no caches, no benchmark scripts)."""
    return [f for f in sorted(src.rglob("*"))
            if f.is_file() and "__pycache__" not in f.relative_to(src).parts and f.suffix != ".pyc"
            and not any(fnmatch.fnmatch(f.name, pat) for pat in NOT_INSTALLED)]


def install_packages(repo: Path, pkg_root: Path) -> str:
    """Copy every folder of PACKAGES into vllm/<name>/; return one sha256 over all of them."""
    h = hashlib.sha256()
    for folder, name in PACKAGES:
        src = repo / folder
        if not (src / "__init__.py").is_file():
            raise BuildError(f"{folder}/__init__.py is missing")
        dst = pkg_root / "vllm" / name
        if dst.exists():
            shutil.rmtree(dst)
        for f in package_files(src):
            rel = f.relative_to(src)
            out = dst / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, out)
            h.update(f"{name}/{rel}".encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()
