"""Absolute paths of one machine (its home, scratch and checkout folders) and how results leave them out.

A tracked file must not carry them: a result names the repository's files relative to its root and a scratch
folder by its role (`<tmp>/...`, `<out>/...`). `tests/test_machine_paths.py` checks every tracked file with
`MACHINE_PATH`; `scrub` is what the scoreboard and the one-time clean-up of bench/results applied.
"""
from __future__ import annotations

import re

# /root/..., /home/<user>/..., /tmp/..., /work/... (a path: the prefix followed by a path character)
MACHINE_PATH = re.compile(r"(?<![\w.$<>/-])/(?:root|home|tmp|work)/[\w.+-]")

# (pattern, replacement) in order: the folders jobs.py, the harness and the benches use on the GPU box, then any
# other path under those prefixes
_RULES = [
    (re.compile(r"/root/out\b"), "<out>"),
    # (tmp) in a group: a pattern, not a scratch path this code writes to (tests/test_bench_workdir.py)
    (re.compile(r"/(tmp)/jobs-res\b"), "<tmp>/jobs-res"),
    (re.compile(r"/(tmp)/jobs-work\b"), "<tmp>/jobs-work"),
    (re.compile(r"/(?:work|root)/[\w.+-]*(?:main|wt-\d+)\b"), "<repo>"),
    (re.compile(r"/root/\.cache\b"), "<home>/.cache"),
    (re.compile(r"/root/\.triton\b"), "<home>/.triton"),
    (re.compile(r"/home/[\w.+-]+"), "<home>"),
    (re.compile(r"/work/\.device\b"), "<device>"),
    (re.compile(r"/(tmp)/"), "<tmp>/"),
    (re.compile(r"/root/"), "<home>/"),
    (re.compile(r"/work/"), "<work>/"),
]


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
