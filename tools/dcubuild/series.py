"""The build's inputs as data: the pins (vendor/vllm-<version>.json) and the patch series (patches/series)."""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from .common import BuildError

REQUIRED_HEADER_FIELDS = ("Description", "Author", "Forwarded", "Last-Update")
PATCH_NAME = re.compile(r"^\d{4}-[a-z0-9][a-z0-9.-]*\.patch$")


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


def series_entries(series_text: str) -> list[tuple[int, str]]:
    """(line number, patch file name) of each entry; `#` comments and blank lines skipped."""
    out = []
    for lineno, raw in enumerate(series_text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if line:
            out.append((lineno, line.split()[0]))  # quilt allows options after the name (-p1); we only use -p1
    return out


def load_series(repo: Path) -> list[Patch]:
    pdir = repo / "patches"
    series = pdir / "series"
    if not series.is_file():
        raise BuildError("patches/series is missing")
    patches, seen = [], set()
    for lineno, name in series_entries(series.read_text()):
        p = pdir / name
        if not p.is_file():
            raise BuildError(f"patches/series line {lineno}: {name} has no file patches/{name}")
        if name in seen:
            raise BuildError(f"patches/series line {lineno}: {name} is listed twice")
        if not PATCH_NAME.match(name):
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
