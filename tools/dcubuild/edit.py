"""The developer loop: --edit leaves build/tree with one commit per patch; --refresh writes them back."""
from __future__ import annotations

import datetime as _dt
import os
import re
from pathlib import Path

from .common import BuildError, log
from .series import load_series, series_entries
from .stamp import STAMPED_FILES
from .tree import AUTHOR, PACKAGES, git


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _new_header(subject: str) -> str:
    today = _dt.date.today().isoformat()
    return (f"From: {AUTHOR[0]} <{AUTHOR[1]}>\nSubject: {subject}\n\nDescription: {subject}\n"
            f"Author: {AUTHOR[0]}\nForwarded: not-needed\nLast-Update: {today}\n")


def refresh(repo: Path, tree: Path) -> None:
    if not (tree / ".git").is_dir():
        raise BuildError(f"{tree} is not an edit tree; run ./build.sh --edit first")
    revs = git(tree, "rev-list", "--reverse", "dcu-base..HEAD").stdout.split()
    if git(tree, "status", "--porcelain", "--untracked-files=no").stdout.strip():
        raise BuildError(f"{tree} has uncommitted changes; commit them (git commit --amend / fixup) first")
    series_patches = {p.name: p for p in load_series(repo)}
    order: list[str] = []
    changed: dict[str, str] = {}  # every commit is read and checked before any file is written
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
        order.append(name)
        diff = git(tree, "diff", "--no-color", "--no-ext-diff", "--full-index", f"{rev}^", rev).stdout
        old = series_patches.get(name)
        if old is not None:
            header = old.header_text()
            if old.text[len(header):] == diff:
                continue
            header = re.sub(r"^Last-Update: .*$", f"Last-Update: {_dt.date.today().isoformat()}", header,
                            count=1, flags=re.M)
            header = re.sub(r"^---\n(?:.*\n)*$", "", header, flags=re.M).rstrip("\n") + "\n"
        else:
            header = _new_header(msg.splitlines()[0])
        stat = git(tree, "diff", "--stat=100", f"{rev}^", rev).stdout
        changed[name] = header + "---\n" + stat + "\n" + diff
    for name, text in changed.items():
        _write(repo / "patches" / name, text)
        log(f"refresh patches/{name}")
    # keep comments where they are; entries follow the commit order
    series = repo / "patches" / "series"
    lines = series.read_text().splitlines()
    entry_idx = [lineno - 1 for lineno, _ in series_entries(series.read_text())]
    if len(entry_idx) != len(order):
        lines = [l for l in lines if not l.split("#", 1)[0].strip()] + order
    else:
        for i, name in zip(entry_idx, order):
            lines[i] = name
    _write(series, "\n".join(lines) + "\n")
    for name in set(series_patches) - set(order):
        log(f"note    {name} has no commit in the edit tree: it was dropped from the series (file kept)")
