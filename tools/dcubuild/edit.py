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
    series = repo / "patches" / "series"
    _write(series, series_in_commit_order(series.read_text(), order))
    for name in set(series_patches) - set(order):
        log(f"note    {name} has no commit in the edit tree: it was dropped from the series (file kept)")


def series_in_commit_order(text: str, order: list[str]) -> str:
    """The series file with its entries in ``order`` (the edit tree's commit order), comments kept where they are.
    The same patches: each entry line takes the name at its position. Otherwise, when the entries still in
    ``order`` keep their relative order: dropped entries' lines go, each new entry goes right after the entry that
    precedes it in ``order`` (a new last patch lands under the last one, below the comments above it). Otherwise
    (a reordering together with an addition or a removal) every entry moves to the end, after the comments."""
    lines = text.splitlines()
    entries = [(lineno - 1, name) for lineno, name in series_entries(text)]
    if sorted(name for _, name in entries) == sorted(order):
        for (i, _), name in zip(entries, order):
            lines[i] = name
        return "\n".join(lines) + "\n"
    kept = [name for _, name in entries if name in order]
    if kept == [name for name in order if name in kept]:
        at = {name: i for i, name in entries}
        dropped = {i for i, name in entries if name not in order}
        after: dict[int, list[str]] = {}
        prev = None
        for name in order:
            if name in at:
                prev = at[name]
            else:
                key = prev if prev is not None else (min(at.values()) - 1 if at else len(lines) - 1)
                after.setdefault(key, []).append(name)  # several after one line keep their commit order
        out = list(after.get(-1, []))
        for i, line in enumerate(lines):
            if i not in dropped:
                out.append(line)
            out.extend(after.get(i, []))
        return "\n".join(out) + "\n"
    return "\n".join([l for l in lines if not l.split("#", 1)[0].strip()] + order) + "\n"
