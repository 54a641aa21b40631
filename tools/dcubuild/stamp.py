"""What identifies a build: its PEP 440 version and vllm/dcu_patchset.json."""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from .series import Patch
from .tree import PACKAGES

# Files the build writes into the tree after the patches (version stamp, patch-set record); PACKAGES go to
# vllm/dcu_kernels/ and vllm/dcu/. A patch must never carry them.
STAMPED_FILES = ("vllm/_version.py", "vllm/dcu_patchset.json")


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
