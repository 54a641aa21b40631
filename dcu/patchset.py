"""The vllm-dcu patch set this build carries (patch 0001-report-dcu-patchset).

build.sh writes ``vllm/dcu_patchset.json`` (base wheel and its sha256, applied patches with their sha256, the
kernels package hash, the version). Patch 0001's hooks call ``summary()`` once when the engine core starts and add
the command ``python -m vllm.dcu_patchset [--json]`` (a shim that calls ``main()``), which prints the record.

Pure Python, no vLLM import: unit-tested alone (tests/test_dcu_patchset.py).
"""
from __future__ import annotations

import json
import os
import sys

# vllm/dcu/patchset.py -> vllm/dcu_patchset.json
PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dcu_patchset.json")
USAGE = "usage: python -m vllm.dcu_patchset [--json]"


def load(path: str = PATH) -> dict | None:
    """The recorded patch set, or None when this tree was not built by vllm-dcu's build.sh."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def summary(path: str = PATH) -> str:
    """One line for the engine's start-up log."""
    record = load(path)
    if record is None:
        return "vllm-dcu: no dcu_patchset.json (this vllm was not built by vllm-dcu's build.sh)"
    ids = ", ".join(p["name"].split("-", 1)[0] for p in record["patches"]) or "none"
    return f"vllm-dcu {record['version']} on {record['base']['name']}: patches {ids}"


def main(argv: list[str] | None = None, path: str = PATH) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--json"]):
        print(USAGE, file=sys.stderr)
        return 2
    record = load(path)
    if record is None:
        print(summary(path), file=sys.stderr)
        return 1
    if args == ["--json"]:
        print(json.dumps(record, indent=2))
        return 0
    print(f"version  {record['version']}")
    print(f"base     {record['base']['name']} (sha256 {record['base']['sha256'][:16]})")
    print(f"kernels  {record['kernels']['package']} (sha256 {record['kernels']['sha256'][:16]})")
    print(f"patches  {len(record['patches'])}")
    for p in record["patches"]:
        print(f"  {p['name']:48s} {p['subject']}")
    return 0
