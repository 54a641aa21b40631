"""Helpers of the build tests (tests/test_build_tool.py, tests/test_build.py).

`synthetic_repo` makes a repository whose pins name a small vLLM-like wheel (a few Python files, a compiled-looking
`.so`, dist-info) with a three-patch series against it, and a download cache that already holds that wheel: every
verb of build.sh runs on it in well under a second, without the 413 MiB upstream base. The real base and the real
series are the subject of tests/test_build.py only.
"""
from __future__ import annotations

import base64
import csv
import difflib
import hashlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WHEEL_NAME = "vllm-0.18.1-cp38-abi3-manylinux_2_31_x86_64.whl"

HEADER = """From: t <t@t>
Subject: {subject}

Description: {subject}
Author: t
Forwarded: not-needed
Last-Update: 2026-11-30
---
"""

BASE_FILES = {
    "vllm/__init__.py": '"""vLLM (synthetic base for the build tests)."""\nfrom vllm._version import __version__\n',
    "vllm/_version.py": "__version__ = version = '0.18.1'\n__version_tuple__ = version_tuple = (0, 18, 1)\n",
    "vllm/config/__init__.py": "",
    "vllm/config/cache.py": "".join(f"setting_{i} = {i}\n" for i in range(40)),
}


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_base_wheel(path: Path, version: str = "0.18.1", so_size: int = 200_000) -> Path:
    """A vLLM-like wheel: Python files, a deflated `vllm/_C.abi3.so` of random bytes, METADATA, WHEEL, RECORD."""
    rng = random.Random(0)
    files = {k: v.encode() for k, v in BASE_FILES.items()}
    files["vllm/_C.abi3.so"] = bytes(rng.getrandbits(8) for _ in range(so_size // 2)) + b"\0" * (so_size // 2)
    dist = f"vllm-{version}.dist-info"
    files[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n".encode()
    files[f"{dist}/WHEEL"] = b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp38-abi3-manylinux_2_31_x86_64\n"
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for name, data in files.items():
        w.writerow((name, record_hash(data), len(data)))
    w.writerow((f"{dist}/RECORD", "", ""))
    files[f"{dist}/RECORD"] = buf.getvalue().encode()
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def unified_diff(path: str, old: str | None, new: str) -> str:
    """A git-style diff of one file (old None: a new file)."""
    if old is None:
        body = "".join(difflib.unified_diff([], new.splitlines(True), "/dev/null", f"b/{path}"))
        return f"diff --git a/{path} b/{path}\nnew file mode 100644\n" + body
    body = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}"))
    return f"diff --git a/{path} b/{path}\n" + body


def _edit(text: str, line: str, new_line: str) -> str:
    assert line in text
    return text.replace(line, new_line)


CACHE = BASE_FILES["vllm/config/cache.py"]
SYNTHETIC_SERIES = {
    # each applies alone on the base and on top of the ones before it
    "0001-new-module.patch": ("Add a module and use it",
                              unified_diff("vllm/hello.py", None, "def hello():\n    return 'hi'\n")
                              + unified_diff("vllm/config/cache.py", CACHE,
                                             _edit(CACHE, "setting_5 = 5\n", "setting_5 = 50\n"))),
    "0002-edit-cache.patch": ("Change a setting",
                              unified_diff("vllm/config/cache.py", CACHE,
                                           _edit(CACHE, "setting_30 = 30\n", "setting_30 = 300\n"))),
    "0003-edit-init.patch": ("Say which build this is",
                             unified_diff("vllm/__init__.py", BASE_FILES["vllm/__init__.py"],
                                          BASE_FILES["vllm/__init__.py"] + "DCU = True\n")),
}


def write_patch(repo: Path, name: str, subject: str, diff: str) -> None:
    (repo / "patches" / name).write_text(HEADER.format(subject=subject) + diff)


def synthetic_repo(root: Path) -> tuple[Path, dict]:
    """(repo, env): the repository's build.sh, tools/, kernels/ and dcu/ with the synthetic pins and series; env
    points build.sh at a cache holding the synthetic base."""
    repo = root / "repo"
    repo.mkdir(parents=True)
    shutil.copy2(REPO / "build.sh", repo / "build.sh")
    for d in ("tools", "kernels", "dcu"):
        shutil.copytree(REPO / d, repo / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    cache = root / "cache"
    cache.mkdir()
    wheel = make_base_wheel(cache / WHEEL_NAME)
    (repo / "vendor").mkdir()
    (repo / "vendor" / "vllm-0.18.1.json").write_text(json.dumps({
        "package": "vllm", "version": "0.18.1",
        "wheel": {"file": WHEEL_NAME, "size": wheel.stat().st_size,
                  "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()},
        "sdist": {"file": "vllm-0.18.1.tar.gz", "sha256": "0" * 64, "size": 1}}))
    (repo / "patches").mkdir()
    for name, (subject, diff) in SYNTHETIC_SERIES.items():
        write_patch(repo, name, subject, diff)
    (repo / "patches" / "series").write_text("# synthetic series\n" + "\n".join(SYNTHETIC_SERIES) + "\n")
    return repo, {"VLLM_DCU_CACHE": str(cache)}


def copy_repo(dst: Path) -> Path:
    """The real repository's build inputs (build.sh, tools/, vendor/, patches/, kernels/, dcu/)."""
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy2(REPO / "build.sh", dst / "build.sh")
    for d in ("tools", "vendor", "patches", "kernels", "dcu"):
        shutil.copytree(REPO / d, dst / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dst


def build(repo: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """build.sh in `repo` with this Python (env may set PYTHON; a value None removes the variable)."""
    e = dict(os.environ, PYTHON=sys.executable)
    for k, v in (env or {}).items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    return subprocess.run(["bash", str(repo / "build.sh"), *args], cwd=repo, env=e, capture_output=True, text=True)


def series_names(repo: Path) -> list[str]:
    return [l.split("#", 1)[0].strip() for l in (repo / "patches" / "series").read_text().splitlines()
            if l.split("#", 1)[0].strip()]


def wheel_patchset(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as zf:
        return json.loads(zf.read("vllm/dcu_patchset.json"))


def assert_one_error_line(p: subprocess.CompletedProcess, *needles: str) -> str:
    assert p.returncode != 0, p.stdout
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def dist_snapshot(repo: Path) -> list[tuple[str, int]]:
    d = repo / "dist"
    return sorted((str(p.relative_to(d)), p.stat().st_size) for p in d.rglob("*")) if d.exists() else []
