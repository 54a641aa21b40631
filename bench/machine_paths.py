"""Absolute paths of one machine (its home, scratch and checkout folders) and how results leave them out.

A tracked file must not carry them: a result names the repository's files relative to its root and a scratch
folder by its role (`<tmp>/...`, `<out>/...`). `tests/test_machine_paths.py` checks every tracked file with
`MACHINE_PATH`; `scrub` is what the scoreboard and the one-time clean-up of bench/results applied.
"""
from __future__ import annotations

import re

# The top-level folders whose paths belong to one machine: root's home, users' homes, the temporary folder and the
# workplace. Spelled as names, not as paths, so this file names no path of a machine itself.
ADMIN_HOME, HOMES, TMP, WORK = "root", "home", "tmp", "work"
PREFIXES = (ADMIN_HOME, HOMES, TMP, WORK)

# a path under one of them: the prefix followed by a path character
MACHINE_PATH = re.compile(rf"(?<![\w.$<>/-])/(?:{'|'.join(PREFIXES)})/[\w.+-]")

# (pattern, replacement) in order: the folders jobs.py, the harness and the benches use on the GPU box, then any
# other path under those prefixes
_RULES = [
    (re.compile(rf"/{ADMIN_HOME}/out\b"), "<out>"),
    (re.compile(rf"/{TMP}/jobs-res\b"), "<tmp>/jobs-res"),
    (re.compile(rf"/{TMP}/jobs-work\b"), "<tmp>/jobs-work"),
    (re.compile(rf"/(?:{WORK}|{ADMIN_HOME})/[\w.+-]*(?:main|wt-\d+)\b"), "<repo>"),
    (re.compile(rf"/{ADMIN_HOME}/\.cache\b"), "<home>/.cache"),
    (re.compile(rf"/{ADMIN_HOME}/\.triton\b"), "<home>/.triton"),
    (re.compile(rf"/{HOMES}/[\w.+-]+"), "<home>"),
    (re.compile(rf"/{WORK}/\.device\b"), "<device>"),
    (re.compile(rf"/{TMP}/"), "<tmp>/"),
    (re.compile(rf"/{ADMIN_HOME}/"), "<home>/"),
    (re.compile(rf"/{WORK}/"), "<work>/"),
]


def host_path(prefix: str, rest: str) -> str:
    """A path of this kind on some machine (``prefix``: one of PREFIXES), for tests and examples."""
    return f"/{prefix}/{rest}"


def scrub(text: str) -> str:
    """text with every machine path replaced by its role (`<tmp>/...`, `<out>`, `<repo>`, `<home>`)."""
    for pat, rep in _RULES:
        text = pat.sub(rep, text)
    return text


def find(text: str) -> list[str]:
    """The machine paths in text (each with the line it is on, first 120 characters)."""
    out = []
    for line in text.splitlines():
        if MACHINE_PATH.search(line):
            out.append(line.strip()[:120])
    return out
