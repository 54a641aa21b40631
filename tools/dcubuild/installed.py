"""--base-installed: the vLLM distribution installed in the running Python, as a base wheel.

The DCU container already holds Hygon's vLLM (0.18.1+das.dtk2604) in its site-packages; that installed copy, not
the fork's source, is what runs there. This module reads the distribution's dist-info RECORD and writes its files
into a wheel under build/installed-base/ (compiled extensions byte for byte; console scripts and caches left out,
pip makes them again), which the build then overlays like any --base-wheel. The wheel is reused while the
installed files are unchanged (RECORD, sizes and modification times), so a later build takes seconds.
"""
from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata as md
import io
import os
import re
import sys
import zipfile
from pathlib import Path

from .common import BuildError, log, sha256_file
from .wheel import _PartialFile, record_text

# 0.18.1, or 0.18.1 with a local version (Hygon's +das.dtk2604); a vllm-dcu build is refused (see below)
VERSION_RE = re.compile(r"^0\.18\.1(\+[A-Za-z0-9]+(?:\.[A-Za-z0-9]+)*)?$")
# dist-info files pip writes at install time (not part of a wheel) and RECORD, which is rebuilt
INSTALL_ONLY = ("INSTALLER", "REQUESTED", "direct_url.json", "RECORD")


def find_distribution() -> md.Distribution:
    try:
        dist = md.distribution("vllm")
    except md.PackageNotFoundError:
        raise BuildError(f"--base-installed: no vllm distribution is installed in {sys.executable} "
                         f"(run build.sh with the Python that has it: PYTHON=/path/to/python ./build.sh ...)") from None
    version = dist.version or "?"
    if re.search(r"[+.]dcu\.", version):
        raise BuildError(f"--base-installed: the installed vllm {version} is already a vllm-dcu build; build with "
                         f"--base-wheel on the base it was made from (--base-installed left it in "
                         f"build/installed-base/) or reinstall that base first")
    if not VERSION_RE.match(version):
        raise BuildError(f"--base-installed: the installed vllm is {version}, not 0.18.1 (this series is for "
                         f"vLLM 0.18.1 and its DCU builds, e.g. 0.18.1+das.dtk2604)")
    return dist


def record_rows(dist: md.Distribution) -> tuple[str, list[tuple[str, str, str]]]:
    """(dist-info folder name, RECORD rows) of the installed distribution; BuildError when it has no RECORD."""
    text = dist.read_text("RECORD")
    if not text:
        raise BuildError(f"--base-installed: vllm {dist.version} has no RECORD in its metadata (installed from "
                         f"an egg or in develop mode?); install it from a wheel, or use --base-wheel FILE")
    rows = [tuple((r + ["", ""])[:3]) for r in csv.reader(io.StringIO(text)) if r]
    infos = {r[0].split("/")[0] for r in rows if r[0].split("/")[0].endswith(".dist-info")}
    if len(infos) != 1:
        raise BuildError(f"--base-installed: vllm's RECORD names {len(infos)} .dist-info folders, expected one")
    if not any(r[0] == "vllm/__init__.py" for r in rows):
        raise BuildError("--base-installed: vllm's RECORD lists no vllm/__init__.py (an editable install?); "
                         "install vllm from a wheel, or use --base-wheel FILE")
    return infos.pop(), rows


def wheel_members(dist_info: str, rows: list) -> list[tuple[str, str]]:
    """(path, RECORD hash) of every file that belongs in the wheel."""
    out = []
    for path, digest, _ in rows:
        parts = Path(path).parts
        if path.startswith("/") or ".." in parts or "__pycache__" in parts or path.endswith(".pyc"):
            continue  # console scripts (bin/), bytecode: pip writes them again
        if parts[0] == dist_info and parts[-1] in INSTALL_ONLY:
            continue
        out.append((path, digest))
    return out


def wheel_tag(root: Path, dist_info: str) -> str:
    wheel_file = root / dist_info / "WHEEL"
    text = wheel_file.read_text() if wheel_file.is_file() else ""
    tags = re.findall(r"^Tag: (\S+)$", text, re.M)
    if not tags:
        raise BuildError(f"--base-installed: {wheel_file} names no Tag (not installed from a wheel?)")
    return tags[0]


def _key(root: Path, rows: list, members: list) -> str:
    """What the base wheel is made from: the RECORD and each member's size and modification time."""
    h = hashlib.sha256(str(root).encode())
    for path, digest, size in rows:
        h.update(f"{path},{digest},{size}\n".encode())
    for path, _ in members:
        st = (root / path).stat()
        h.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256=" + base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()


def installed_base_wheel(out_dir: Path) -> tuple[Path, str]:
    """Write (or reuse) the installed vLLM as a wheel in out_dir; return (wheel, version)."""
    dist = find_distribution()
    dist_info, rows = record_rows(dist)
    root = Path(dist.locate_file("")).resolve()
    members = wheel_members(dist_info, rows)
    missing = [p for p, _ in members if not (root / p).is_file()]
    if missing:
        raise BuildError(f"--base-installed: {len(missing)} files of vllm's RECORD are missing under {root}, e.g. "
                         f"{missing[0]} (a damaged install: reinstall it)")
    listed = {p for p, _ in members}
    extra = sorted(f.relative_to(root).as_posix() for f in (root / "vllm").rglob("*")
                   if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"
                   and f.relative_to(root).as_posix() not in listed)
    if extra:  # e.g. an extension dropped in by hand: not the distribution's, so not carried (pip keeps it)
        log(f"note    {len(extra)} file{'s' * (len(extra) != 1)} under {root / 'vllm'} not in vllm's RECORD, left out: "
            f"{', '.join(extra[:3])}{' ...' if len(extra) > 3 else ''}")
    tag = wheel_tag(root, dist_info)
    version = dist.version
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / f"vllm-{version}-{tag}.whl"
    key = _key(root, rows, members)
    key_file = out_dir / (final.name + ".key")
    if final.is_file() and key_file.is_file() and key_file.read_text() == key:
        log(f"verify  installed vllm {version} in {root} (unchanged since {final.name} was written)")
        return final, version
    for old in out_dir.glob("vllm-*.whl*"):
        old.unlink()
    edited, records = [], []
    with _PartialFile(final) as part:
        # deflate level 1: the compiled extensions (over 1 GiB) are carried into the overlay wheel as stored here
        with zipfile.ZipFile(part.path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
            for path, digest in members:
                f = root / path
                got = _file_hash(f)
                if digest and got != digest:
                    edited.append(path)
                zf.write(f, path)
                records.append((path, got, str(f.stat().st_size)))
            rec_name = f"{dist_info}/RECORD"
            zf.writestr(rec_name, record_text(records, rec_name))
        part.commit()
    key_file.write_text(key)
    note = (f", {len(edited)} edited after install: {', '.join(edited[:3])}{' ...' if len(edited) > 3 else ''}"
            if edited else "")
    log(f"verify  installed vllm {version} in {root}: {len(members)} files from its RECORD{note} "
        f"-> {final.name} (sha256 {sha256_file(final)[:12]})")
    return final, version
