"""One format for launch options: what a bench suggests is what the tuned file's ``launch`` section and the variables
(VLLM_DCU_DECODE_PARAMS, VLLM_DCU_PREFILL_PARAMS, VLLM_DCU_GEMV_PARAMS) take.

A bench's sweep ends with an entry of its family's launch table. ``as_override`` turns it into the override object that
gives that entry when applied over the device's table entry (keys the entry drops become null, which the tables accept
only for options that may be dropped), and proves it: the family's own parser applies it and must give the entry back,
else ValueError. ``suggestion_lines`` is what a bench prints: the variable to export for one run, and where the tuning
command keeps the same object.
"""
from __future__ import annotations

import json

from . import tuned_file

NOT_OVERRIDABLE = ("measured", "lds_limit")  # a table entry's notes about itself, not launch options


def _launch_params(family: str):
    if family == "decode":
        from ..decode_attention import launch_params
    elif family == "prefill":
        from ..prefill_attention import launch_params
    elif family == "gemv":
        from ..gemv import launch_params
    else:
        raise ValueError(f"unknown kernel family {family!r}; known: {', '.join(tuned_file.FAMILIES)}")
    return launch_params


def _strip(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k not in NOT_OVERRIDABLE}


def _with_nulls(table: dict, entry: dict, depth: int) -> dict:
    """``entry`` with a null for each key ``table`` has and ``entry`` lacks, ``depth`` levels of objects deep."""
    out = {}
    for key, val in entry.items():
        sub = table.get(key)
        out[key] = _with_nulls(sub, val, depth - 1) if depth > 1 and isinstance(val, dict) and isinstance(sub, dict) \
            else val
    for key in table:
        if key not in entry and key not in NOT_OVERRIDABLE:
            out[key] = None
    return out


def as_override(family: str, target: str, entry: dict) -> dict:
    """The override object (``family``'s variable format) that turns ``target``'s table entry into ``entry``;
    ValueError when the family's parser would not give ``entry`` back from it."""
    lp = _launch_params(family)
    want = _strip(entry)
    last = None
    for depth in (0, 1, 2, 3):  # the whole entry first; then nulls for dropped keys, level by level
        override = _strip(entry) if depth == 0 else _with_nulls(_strip(lp.PARAMS[target]), want, depth)
        try:
            got = lp.get_params(target, override=json.dumps(override))
        except ValueError as e:
            last = e
            continue
        if _strip(got) == want:
            return override
        last = ValueError(f"applied over the {target} entry it gives {json.dumps(_strip(got), sort_keys=True)}")
    raise ValueError(f"{family} entry {json.dumps(want, sort_keys=True)} cannot be written as "
                     f"{tuned_file.FAMILIES[family]}: {last}")


def suggestion_lines(family: str, target: str, entry: dict) -> list[str]:
    """What a bench prints for its suggested entry: the variable for a run of the engine or a bench, and the tuned
    file's key holding the same object (``python -m vllm.dcu.tune --full`` writes it per device)."""
    override = as_override(family, target, entry)
    text = json.dumps(override, separators=(",", ":"), sort_keys=True)
    return [f"Suggested launch options for {target} (the {tuned_file.FAMILIES[family]} format, as the tuned file's "
            f"launch.{family} holds them; `python -m vllm.dcu.tune --full` measures and keeps them per device):",
            f"{tuned_file.FAMILIES[family]}='{text}'"]


def suggestion(family: str, target: str, entry: dict) -> tuple[dict, str]:
    """(the fields a bench's JSON keeps, the markdown it prints) for its suggested entry. A suggestion the family's
    format cannot express is reported in both, not raised: a long sweep's results are still written."""
    try:
        lines = suggestion_lines(family, target, entry)
    except ValueError as e:
        return {"suggested_override": None, "suggestion_error": str(e)}, f"\nNo suggestion: {e}\n"
    override = json.loads(lines[1].split("=", 1)[1].strip("'"))
    return {"suggested_override": override}, f"\n{lines[0]}\n\n```\n{lines[1]}\n```\n"
