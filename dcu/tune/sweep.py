"""One kernel family's run, shared by decode and prefill: its launch widths swept over candidates (``--full``), the
best launch per width kept, then every launch kind timed against upstream with the chosen launch."""
from __future__ import annotations

import dataclasses
import json
from typing import Callable

from .._kernels import merge, one_line

from .common import Failed, Side, compare, env, geomean, run_ours, sweep_over, time_us


BETTER = 0.97  # a candidate replaces the table's entry when it takes less than this share of its time


class UpstreamFailed(Exception):
    pass


@dataclasses.dataclass
class Case:
    """One timed case of a launch kind: ``ours()`` and ``upstream()`` each run the whole call and return its output
    (their own output tensors)."""
    label: str
    ours: Callable
    upstream: Callable
    tol: tuple
    _want: object = None

    def want(self):
        if self._want is None:
            try:
                self._want = self.upstream().clone()
            except Exception as e:  # noqa: BLE001 - upstream's own failure is reported, not raised
                raise UpstreamFailed(one_line(e)) from e
        return self._want

    def check(self):
        """Run ours and compare it with upstream's output (Failed when it does not run or differs)."""
        got = run_ours(self.ours)
        return compare(got, self.want(), self.tol, self.label)


@dataclasses.dataclass
class Family:
    name: str  # "decode" / "prefill": the tuned file's launch family
    env_var: str
    validate: Callable  # override text -> raises ValueError when the family's get_params refuses it
    cases: dict  # launch kind path ("decode.bf16", ...) -> {"main": [Case], "short": [Case]}
    widths: dict  # width -> (launch kind paths, which case list)
    candidates: Callable  # width -> [(label, override)]
    # how a launch kind's cases add up to its decision: False, the geomean of ours / upstream per case (decode: a batch
    # of 1 counts as much as one of 16); True, total time over total time (prefill: a prompt's prefill is the sum of
    # its chunks, so a 16-token chunk's 2x must not outvote a 4096-token chunk's 0.5x)
    by_total_time: bool = False


def _validate(family: Family, override: dict) -> str | None:
    try:
        family.validate(json.dumps(override, sort_keys=True))
    except ValueError as e:
        return one_line(e)
    return None


def sweep_width(family: Family, width: str, full: bool, rows: list, log) -> dict:
    """The override (of this width only) that ran fastest over the width's cases (geomean), {} for the table's
    entry (also when nothing beat it by 3%)."""
    paths, which = family.widths[width]
    cands = [("table", {})] + (family.candidates(width) if full else [])
    scored = []
    for label, cand in cands:
        bad = _validate(family, cand)
        row = {"phase": family.name, "sweep": width, "candidate": label, "override": cand}
        if not bad and label != "table" and sweep_over():
            bad = "sweep budget spent (--sweep-budget-s)"
        if bad:
            rows.append({**row, "skipped": bad})
            continue
        times, failure = [], None
        with env(family.env_var, cand):
            for path in paths:
                for case in family.cases[path][which]:
                    try:
                        case.check()
                        times.append(time_us({"ours": lambda i, c=case: c.ours()})["ours"])
                    except (Failed, UpstreamFailed) as e:
                        failure = getattr(e, "why", f"upstream failed: {e}")
                        break
                if failure:
                    break
        if failure:
            rows.append({**row, "failed": failure})
            log(f"  {family.name} {width} {label}: {failure}")
            continue
        score = geomean(times)
        scored.append((score, len(scored), label, cand))
        rows.append({**row, "us": [round(t, 2) for t in times], "geomean_us": round(score, 2)})
        log(f"  {family.name} {width} {label}: {score:.1f} us (geomean of {len(times)})")
    if not scored:
        return {}
    score, _, label, cand = min(scored)
    table = next((s for s, _, lab, _ in scored if lab == "table"), None)
    # noise must not move the launch: a candidate replaces the table's entry only when clearly faster
    return cand if table is None or score < BETTER * table else {}


def final_sides(family: Family, override: dict, rows: list) -> list:
    """Every launch kind of the family with ``override``: ours checked against upstream and timed beside it."""
    sides = []
    with env(family.env_var, override):
        for path, lists in family.cases.items():
            cases = lists["main"] + lists.get("short", [])
            side = Side(path, [c.label for c in cases], ours_us=[], upstream_us=[],
                        launch="chosen" if override else "table", by_total_time=family.by_total_time)
            for case in cases:
                try:
                    side.errors.append(case.check())
                    t = time_us({"ours": lambda i, c=case: c.ours(), "upstream": lambda i, c=case: c.upstream()})
                except Failed as e:
                    side.failure = e.why
                    break
                except UpstreamFailed as e:
                    side.failure = f"upstream failed: {e}"
                    break
                side.ours_us.append(t["ours"])
                side.upstream_us.append(t["upstream"])
            rows.append({"phase": family.name, "path": path, "cases": side.cases, "failure": side.failure,
                         "ours_us": [round(t, 2) for t in side.ours_us],
                         "upstream_us": [round(t, 2) for t in side.upstream_us], "errors": side.errors})
            sides.append(side)
    return sides


def run_family(family: Family, full: bool, rows: list, log) -> tuple[list, dict]:
    """(sides, the family's launch override for the tuned file: each width's chosen keys, {} when that is the table's
    entry). The DCU rehearsal's entries need no dropped ROCm-only options here: the launch tables drop them
    (kernels/targets.cached_entry)."""
    chosen = [sweep_width(family, w, full, rows, log) for w in family.widths] if full else []
    override = merge(*chosen)
    return final_sides(family, override, rows), override
