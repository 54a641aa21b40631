"""Reading and writing wheels: the base's metadata, the packed wheel with a rebuilt RECORD.

The base's compiled members (hundreds of MiB) are copied as they are stored, compressed bytes and all, instead
of being inflated and deflated again; `zipfile` has no public call for that, so `copy_stored_member` writes the
member's local header and data itself and registers it in the archive's central directory. That function is the
only place that touches zipfile's internals (tests/test_build_tool.py checks it against the Python in use).
"""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import tempfile
import zipfile
from pathlib import Path

from .common import BuildError

BINARY_SUFFIXES = (".so",)
FIXED_TIME = (2026, 1, 1, 0, 0, 0)


def open_wheel(path: Path) -> zipfile.ZipFile:
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise BuildError(f"cannot read wheel {path}: {e}") from None
    if not any(n.endswith(".dist-info/WHEEL") for n in zf.namelist()):
        zf.close()
        raise BuildError(f"{path} is not a wheel (no .dist-info/WHEEL)")
    return zf


def wheel_dist_info(zf: zipfile.ZipFile) -> tuple[str, str]:
    """(dist-info dir, version) of a vLLM wheel."""
    names = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
    if not names:
        raise BuildError("wheel has no top-level .dist-info/METADATA")
    meta = zf.read(names[0]).decode(errors="replace")
    m = re.search(r"^Version: (\S+)", meta, re.M)
    name = re.search(r"^Name: (\S+)", meta, re.M)
    if not m or not name or name.group(1).lower() != "vllm":
        raise BuildError("wheel is not a vllm wheel (METADATA Name/Version)")
    return names[0].split("/")[0], m.group(1)


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_member(dst: zipfile.ZipFile, rel: str, data: bytes | str, records: list | None = None) -> None:
    """Deflate one member with a fixed timestamp and mode 0644; add its RECORD row when `records` is given."""
    zi = zipfile.ZipInfo(rel, FIXED_TIME)
    zi.external_attr = (0o644 & 0xFFFF) << 16
    zi.compress_type = zipfile.ZIP_DEFLATED
    dst.writestr(zi, data)
    if records is not None:
        records.append((rel, record_hash(data), str(len(data))))


def record_text(rows: list, record_name: str) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerows(rows)
    w.writerow((record_name, "", ""))
    return buf.getvalue()


def read_record(zf: zipfile.ZipFile, record_name: str) -> dict[str, list[str]]:
    return {row[0]: row for row in csv.reader(io.StringIO(zf.read(record_name).decode())) if row}


def copy_stored_member(src_fp, info: zipfile.ZipInfo, dst: zipfile.ZipFile) -> None:
    """Copy one member's local header + compressed bytes verbatim from the open file `src_fp` (no recompression)."""
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


class _PartialFile:
    """A temporary file beside `final`, renamed onto it only by commit(): dist/ never holds a partial wheel."""

    def __init__(self, final: Path):
        self.final = final
        fd, name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent)
        os.close(fd)
        self.path = Path(name)

    def commit(self) -> None:
        os.chmod(self.path, 0o644)
        os.replace(self.path, self.final)

    def __enter__(self) -> "_PartialFile":
        return self

    def __exit__(self, *exc) -> None:
        self.path.unlink(missing_ok=True)


def pack_wheel(base_wheel: Path, tree_pkg_root: Path, version: str, out_dir: Path,
               base_dist_info: str) -> Path:
    """Write the wheel: tree files (recompressed) + the base's binaries (copied raw) + a new dist-info."""
    new_dist_info = f"vllm-{version}.dist-info"
    plat = base_wheel.name[:-4].split("-")[-3:]  # python, abi and platform tags stay the base's
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / f"vllm-{version}-{'-'.join(plat)}.whl"
    with open_wheel(base_wheel) as src, open(base_wheel, "rb") as src_fp, _PartialFile(final) as part:
        records: list[tuple[str, str, str]] = []
        with zipfile.ZipFile(part.path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as dst:
            # binaries from the base wheel, byte for byte
            old_record = read_record(src, f"{base_dist_info}/RECORD")
            for info in src.infolist():
                if info.filename.endswith(BINARY_SUFFIXES) and not info.filename.startswith(base_dist_info):
                    copy_stored_member(src_fp, info, dst)
                    row = old_record.get(info.filename)
                    records.append((info.filename, row[1], row[2]) if row else
                                   (info.filename, record_hash(src.read(info)), str(info.file_size)))
            # everything else from the tree
            files = sorted(p for p in tree_pkg_root.rglob("*")
                           if p.is_file() and ".git" not in p.relative_to(tree_pkg_root).parts
                           and "__pycache__" not in p.parts and not p.name.endswith(BINARY_SUFFIXES))
            for f in files:
                rel = f.relative_to(tree_pkg_root).as_posix()
                if rel.startswith(base_dist_info + "/"):
                    continue
                write_member(dst, rel, f.read_bytes(), records)
            # dist-info: metadata with the new version, everything else as in the base
            for info in src.infolist():
                if not info.filename.startswith(base_dist_info + "/") or info.is_dir():
                    continue
                leaf = info.filename.split("/", 1)[1]
                if leaf in ("RECORD", "RECORD.jws", "RECORD.p7s"):
                    continue
                data = src.read(info)
                if leaf == "METADATA":
                    data = re.sub(rb"^Version: .*$", f"Version: {version}".encode(), data, count=1, flags=re.M)
                write_member(dst, f"{new_dist_info}/{leaf}", data, records)
            write_member(dst, f"{new_dist_info}/RECORD", record_text(records, f"{new_dist_info}/RECORD"))
        with zipfile.ZipFile(part.path) as check:
            bad = check.testzip()
            if bad:
                raise BuildError(f"packed wheel failed its CRC check at {bad}")
        part.commit()
    return final


def add_files_to_wheel(wheel: Path, files: dict[str, bytes], final: Path) -> None:
    """Rewrite a wheel with extra files (raw-copying the existing members) and a rebuilt RECORD."""
    with open_wheel(wheel) as src, open(wheel, "rb") as src_fp, _PartialFile(final) as part:
        dist_info, _ = wheel_dist_info(src)
        record_name = f"{dist_info}/RECORD"
        rows = [r for name, r in read_record(src, record_name).items() if name != record_name and name not in files]
        with zipfile.ZipFile(part.path, "w", compression=zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                if info.filename != record_name and info.filename not in files:
                    copy_stored_member(src_fp, info, dst)
            for rel, data in files.items():
                write_member(dst, rel, data, rows)
            write_member(dst, record_name, record_text(rows, record_name))
        part.commit()
