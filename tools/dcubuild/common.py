"""What every step shares: the error users act on, the progress line, file hashes, subprocesses."""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class BuildError(Exception):
    """A failure the user can act on; printed as one line."""


def log(msg: str) -> None:
    print(msg, flush=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def run(cmd: list[str], cwd: Path | None = None, env: dict | None = None, check: bool = True,
        input: str | None = None) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=cwd, env=env, input=input, capture_output=True, text=True)
    if check and p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise BuildError(f"{' '.join(cmd[:3])} failed in {cwd or '.'}: {tail[0]}")
    return p


def last_line(output: str, skip: str | None = None) -> str:
    """The last non-empty line of a tool's output (lines containing `skip` left out), for one-line errors."""
    lines = [l for l in output.splitlines() if l.strip() and not (skip and skip in l)]
    return lines[-1].strip() if lines else "no output"


def shown(path: Path, repo: Path) -> Path:
    """`path` relative to the repository when it lies inside it (progress lines)."""
    return path.relative_to(repo) if path.is_relative_to(repo) else path
