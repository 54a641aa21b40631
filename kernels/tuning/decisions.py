"""Which side runs each launch kind, ours or upstream's, and why: decided once at engine start, logged as one table.

For a launch kind (tuned_file.PATHS: decode.bf16, prefill.int8, kv_write.fp8, ...) the decision comes from, in order:
1. its variable, when set: ``1`` forces ours (a failing startup check is then an error, not a fallback), ``0`` runs
   upstream's path (VLLM_DCU_DECODE_ATTN, VLLM_DCU_PREFILL_ATTN, VLLM_DCU_KV_WRITE);
2. the device's tuned file (``active_file``): its measured choice and ratio;
3. otherwise ours, with the launch table's entry ("no tuned file: table entry").
Then the startup check (``check_at_start``): ours is compiled and run once at small shapes against a reference; a
kernel that fails to compile or differs is replaced by upstream's path for that launch kind with one warning line.
The GEMV keeps its per-shape table (kernels/gemv/dispatch.py); ``table_lines`` adds its summary.

No vLLM import; torch only inside the tuned file's identity.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Callable

from . import tuned_file

log = logging.getLogger("vllm.dcu.tuning")

ENV_BY_FAMILY = {"decode": "VLLM_DCU_DECODE_ATTN", "prefill": "VLLM_DCU_PREFILL_ATTN", "kv_write": "VLLM_DCU_KV_WRITE"}
ENV_TUNED = "VLLM_DCU_TUNED"  # 0: read no tuned file (table entries, every path ours unless its variable says)
# what upstream's path is, per family, for the decision table
UPSTREAM_NAME = {"decode": "unified attention", "prefill": "unified attention",
                 "kv_write": "torch per-token-head write"}


class MismatchError(RuntimeError):
    """Our kernel ran but its output differs from the reference beyond the tests' tolerance."""


@dataclasses.dataclass
class Decision:
    runs: str  # "ours" | "upstream"
    why: str
    forced: bool = False  # the variable asked for ours: a failed check is an error
    checked: bool = False  # the startup check ran (and passed, when runs == "ours")


_DECISIONS: dict[str, Decision] = {}
_FILE: dict = {}  # "loaded": True once looked for; "file": TunedFile | None; "path": where it was looked for
_LOGGED: dict = {}
_EXTRA: dict[str, Callable[[], list[str]]] = {}  # other tables' lines (the GEMV's), by name


def env_choice(family: str, environ=None) -> str:
    """The family's variable: '' (decide), '1' (ours, forced) or '0' (upstream); anything else fails naming them."""
    var = ENV_BY_FAMILY[family]
    raw = (os.environ if environ is None else environ).get(var, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"{var}={raw!r}: supported values are 1 (ours, forced), 0 (upstream's path) or unset")
    return raw


def reading_enabled(environ=None) -> bool:
    raw = (os.environ if environ is None else environ).get(ENV_TUNED, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"{ENV_TUNED}={raw!r}: supported values are 1 (default) and 0")
    return raw != "0"


def active_file(device=None, warn: Callable[[str], None] | None = None):
    """The device's tuned file (loaded once per process), or None: reading switched off, none written yet, or
    ignored (one line). Under Triton's CPU interpreter a file is read only where a variable names it or its folder
    (VLLM_DCU_TUNED_FILE, VLLM_DCU_CACHE, VLLM_DCU_GEMV_CACHE_DIR): the tests stay apart from the machine's cache."""
    if _FILE.get("loaded"):
        return _FILE["file"]
    _FILE.update(loaded=True, file=None, path=None)
    if not reading_enabled():
        _FILE["path"] = f"not read ({ENV_TUNED}=0)"
        return None
    named = any(os.environ.get(v, "").strip() for v in (tuned_file.ENV_FILE, tuned_file.ENV_CACHE_DIR,
                                                         tuned_file.ENV_CACHE_DIR_OLD))
    if os.environ.get("TRITON_INTERPRET") == "1" and not named:
        _FILE["path"] = "not read (interpreter)"
        return None
    identity = tuned_file.device_identity(device)
    path = tuned_file.default_path(identity)
    _FILE["path"] = str(path)
    _FILE["file"] = tuned_file.load(path, identity, warn or log.warning)
    return _FILE["file"]


def launch_override(family: str) -> str | None:
    """The tuned file's launch override for a kernel family (its variable's JSON format), or None. Called by the
    launch tables; never raises (a file that cannot be read is ignored with one line)."""
    try:
        tf = active_file()
    except Exception as e:  # noqa: BLE001 - no GPU, no Triton: tables only
        _FILE.update(loaded=True, file=None, path=f"not read ({type(e).__name__}: {e})")
        return None
    return tf.launch_override(family) if tf is not None else None


def decide(path: str, attention: dict | None = None) -> Decision:
    """The decision for ``path`` before its startup check (module docstring, steps 1-3); recorded, and returned as
    recorded on later calls."""
    if path in _DECISIONS:
        return _DECISIONS[path]
    family = path.split(".")[0]
    choice = env_choice(family)
    var = ENV_BY_FAMILY[family]
    if choice == "1":
        d = Decision("ours", f"{var}=1", forced=True)
    elif choice == "0":
        d = Decision("upstream", f"{var}=0")
    else:
        tf = active_file()
        entry = tf.path_entry(path, attention) if tf is not None else None
        if entry is not None:
            ratio = entry.get("ratio")
            measured = f"measured {ratio:.2f}x upstream" if ratio else "tuned"
            why = entry.get("why") or tf.path.name
            # the tuning command's own lines already say "measured ...x upstream at ..."
            d = Decision(entry["use"], why if why.startswith("measured ") else f"{measured}: {why}")
        elif tf is not None:
            d = Decision("ours", f"not in the tuned file {tf.path.name}: table entry")
        else:
            d = Decision("ours", "no tuned file: table entry")
    _DECISIONS[path] = d
    return d


def runs_ours(path: str) -> bool:
    """Whether ``path`` runs our kernel (decided on first call, as ``decide`` would without a shape)."""
    d = _DECISIONS.get(path)
    return (d if d is not None else decide(path)).runs == "ours"


def one_line(e: BaseException, limit: int = 200) -> str:
    """An exception as one line: its type and its message's first ``limit`` characters, white space folded."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:limit]}" if text else type(e).__name__


def check_at_start(path: str, check: Callable[[], None], attention: dict | None = None,
                   warn: Callable[[str], None] | None = None) -> bool:
    """Decide ``path`` and, when ours would run, run ``check()`` (compile, run once, compare; raises
    MismatchError when the output differs). On a failure upstream's path takes the launch kind, with one warning
    line; when the variable forced ours, a RuntimeError naming the variable instead. Returns whether ours runs.
    Runs once per process and path."""
    d = decide(path, attention)
    if d.runs != "ours" or d.checked:
        return d.runs == "ours"
    try:
        check()
    except Exception as e:  # noqa: BLE001 - any failure of our kernel: fall back
        what = f"differs from upstream: {e}" if isinstance(e, MismatchError) else f"failed to compile or run: {one_line(e)}"
        var = ENV_BY_FAMILY[path.split(".")[0]]
        if d.forced:
            raise RuntimeError(f"vllm-dcu: {path} {what}; it was forced with {var}=1 (unset it to fall back to "
                               f"{UPSTREAM_NAME[path.split('.')[0]]})") from e
        _DECISIONS[path] = Decision("upstream", what, checked=True)
        (warn or log.warning)(f"vllm-dcu: {path}: our kernel {what}; {UPSTREAM_NAME[path.split('.')[0]]} runs "
                              "instead")
        return False
    d.checked = True
    return True


def add_table(name: str, lines: Callable[[], list[str]]) -> None:
    """Another table's lines for the decision table (the GEMV dispatch's summary)."""
    _EXTRA[name] = lines


def table_lines() -> list[str]:
    """The decision table: one line per decided launch kind, then the other tables' lines."""
    where = _FILE.get("path")
    tf = _FILE.get("file")
    head = f"tuned file: {tf.path}" if tf is not None else f"tuned file: none ({where or 'not looked for'})"
    lines = [head]
    width = max((len(p) for p in _DECISIONS), default=0)
    for path in tuned_file.PATHS:
        d = _DECISIONS.get(path)
        if d is not None:
            runs = "ours" if d.runs == "ours" else f"upstream ({UPSTREAM_NAME[path.split('.')[0]]})"
            lines.append(f"{path:<{width}}  {runs}: {d.why}{' (checked at start)' if d.checked else ''}")
    for name in sorted(_EXTRA):
        lines += _EXTRA[name]()
    return lines


def log_table_once(logger: Callable[[str], None] | None = None) -> bool:
    """Log the decision table once per process (after the warm-up); whether it was logged now."""
    if _LOGGED.get("done"):
        return False
    _LOGGED["done"] = True
    (logger or log.info)("vllm-dcu: which kernels run on this device:\n  " + "\n  ".join(table_lines()))
    return True


def reset() -> None:
    """Forget every decision and the loaded file (tests, and the tuning command between phases)."""
    _DECISIONS.clear()
    _FILE.clear()
    _LOGGED.clear()
