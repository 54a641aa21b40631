"""The tuned file: what one device's tuning run (``python -m vllm.dcu.tune``) measured, read by the engine at start.

One JSON file per device (``<cache>/tuned/<arch>-<device>.json``; ``VLLM_DCU_TUNED_FILE`` names another), written
whole or not at all (a temporary file, then a rename). Its document:

  format      FORMAT
  identity    what the file is valid for: device name, arch, Triton and torch versions, the kernels hash (every
              shipped source file of ``vllm.dcu_kernels``). A file whose identity differs from the device the engine
              runs on is ignored with one line naming the mismatch.
  model       the shapes it was tuned at: {"name", "attention": {"heads_q", "heads_kv", "head_dim"}, "gemv": [ids]}.
              Path decisions for attention apply only to an engine with the same attention shape.
  created, tune   when, and how (mode, seconds per phase).
  launch      per kernel family ("decode", "prefill", "gemv") an override object in the format of that family's
              variable (VLLM_DCU_DECODE_PARAMS, VLLM_DCU_PREFILL_PARAMS, VLLM_DCU_GEMV_PARAMS), applied over the
              launch table's entry for the device; the variable, when set, applies over it.
  paths       per launch kind (PATHS) which side runs: {"use": "ours" | "upstream", "ratio": ours / upstream time,
              "why": one line}.
  gemv        the GEMV dispatch table: {shape id: {"1" | "2" | "4" | "8": {"choice", "triton_us", "platform_us"}}}
              (kernels/gemv/dispatch.py reads and extends it; shapes first seen by the engine are measured there and
              merged in).
  rows        the tuning run's measurements (free-form, for the report).

Bad input never stops the engine: an unreadable, truncated or foreign file is ignored with one line naming it; an
entry with an unknown key or a bad value is refused with one line naming the key, and its path falls back.
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Callable

from ..atomic_file import write_via_temp

FORMAT = "vllm-dcu-tuned/1"
ENV_FILE = "VLLM_DCU_TUNED_FILE"
ENV_CACHE_DIR = "VLLM_DCU_CACHE"  # the project's one cache folder: the build's downloads, the tuned files, the real model
ENV_CACHE_DIR_OLD = "VLLM_DCU_GEMV_CACHE_DIR"  # the GEMV dispatch cache's variable before the tuned file; still read
FAMILIES = {"decode": "VLLM_DCU_DECODE_PARAMS", "prefill": "VLLM_DCU_PREFILL_PARAMS", "gemv": "VLLM_DCU_GEMV_PARAMS"}
PATHS = ("decode.bf16", "decode.int8", "decode.fp8", "prefill.bf16", "prefill.int8", "prefill.fp8",
         "kv_write.int8", "kv_write.fp8")
USES = ("ours", "upstream")
IDENTITY_KEYS = ("device", "arch", "triton", "torch", "kernels")
TOP_KEYS = {"format", "identity", "model", "created", "tune", "launch", "paths", "gemv", "rows"}
GEMV_BUCKETS = ("1", "2", "4", "8")
# what the build leaves out of vllm.dcu_kernels (tools/dcubuild/tree.py reads it): the kernels hash skips these
# files too, so a checkout and the wheel built from it hash alike
NOT_SHIPPED = ("bench*.py", "compile_check.py", "compile_tools.py", "numerics.py", "results_io.py")

_DIGEST: dict = {}


def kernels_digest(root: Path | None = None) -> str:
    """sha256 (16 hex digits) over every shipped file of the kernels package: a changed kernel, launch table or
    dispatch invalidates every tuned file."""
    root = Path(__file__).resolve().parents[1] if root is None else Path(root)
    if root not in _DIGEST:
        h = hashlib.sha256()
        for f in sorted(root.rglob("*.py")):
            rel = f.relative_to(root)
            if "__pycache__" in rel.parts or any(fnmatch.fnmatch(f.name, p) for p in NOT_SHIPPED):
                continue
            h.update(rel.as_posix().encode() + b"\0")
            h.update(f.read_bytes())
        _DIGEST[root] = h.hexdigest()[:16]
    return _DIGEST[root]


def device_identity(device=None) -> dict:
    """The identity of the current GPU (or ``device``) as the tuned file records it. An emulated arch
    (VLLM_DCU_EMULATE_ARCH) is recorded as such, so a file from a rehearsal never matches a real device."""
    import torch
    import triton

    from ..targets import device_arch, emulated_arch

    if getattr(device, "type", "cuda") != "cuda" or not torch.cuda.is_available():
        name = "cpu"
    else:
        index = device.index if getattr(device, "index", None) is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        name = f"{props.name} {props.multi_processor_count} CUs"
    arch = device_arch(device)
    if emulated_arch():
        arch = f"{arch} (emulated)"
    return {"device": name, "arch": arch, "triton": triton.__version__, "torch": torch.__version__.split("+")[0],
            "kernels": kernels_digest()}


def cache_dir(environ=None) -> Path:
    """The project's cache folder: ``VLLM_DCU_CACHE``, default ``~/.cache/vllm-dcu`` (tools/dcubuild's base wheel,
    bench/real_model's model and text, and the tuned files under ``tuned/``)."""
    environ = os.environ if environ is None else environ
    raw = environ.get(ENV_CACHE_DIR, "").strip()
    return Path(raw).expanduser() if raw else Path.home() / ".cache" / "vllm-dcu"


def default_path(identity: dict, environ=None) -> Path:
    """``VLLM_DCU_TUNED_FILE`` when set, else ``<cache>/tuned/<arch>-<device>.json`` (one file per device kind; the
    cache folder ``VLLM_DCU_CACHE``, or the GEMV dispatch's older ``VLLM_DCU_GEMV_CACHE_DIR`` when only that is set)."""
    environ = os.environ if environ is None else environ
    if environ.get(ENV_FILE, "").strip():
        return Path(environ[ENV_FILE]).expanduser()
    old = environ.get(ENV_CACHE_DIR_OLD, "").strip()
    base = Path(old).expanduser() if old and not environ.get(ENV_CACHE_DIR, "").strip() else cache_dir(environ)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{identity['arch']}-{identity['device']}").strip("-").lower()
    return base / "tuned" / f"{slug}.json"


def new_doc(identity: dict, model: dict, mode: str) -> dict:
    """An empty document for a tuning run."""
    return {"format": FORMAT, "identity": dict(identity), "model": dict(model), "created": None,
            "tune": {"mode": mode, "seconds": None, "phases": {}}, "launch": {}, "paths": {}, "gemv": {}, "rows": []}


def write(path: Path | str, doc: dict) -> Path:
    """Write ``doc`` to ``path`` whole or not at all (temporary file in the same folder, then a rename)."""
    path = Path(path)
    problems = check_doc(doc)
    if problems:
        raise ValueError(f"tuned file {path}: {problems[0]}")

    def dump(tmp):
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")

    return Path(write_via_temp(path, dump))


def check_path_entry(name: str, entry) -> str | None:
    """Why ``paths[name]`` is refused, or None."""
    if name not in PATHS:
        return f"paths: unknown launch kind {name!r}; known: {', '.join(PATHS)}"
    if not isinstance(entry, dict) or set(entry) - {"use", "ratio", "why"}:
        keys = sorted(set(entry) - {"use", "ratio", "why"}) if isinstance(entry, dict) else entry
        return f"paths.{name}: unknown key(s) {keys}; allowed: use, ratio, why"
    if entry.get("use") not in USES:
        return f"paths.{name}.use must be one of {', '.join(USES)}, got {entry.get('use')!r}"
    ratio = entry.get("ratio")
    if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not ratio > 0):
        return f"paths.{name}.ratio must be a positive number or null, got {ratio!r}"
    if not isinstance(entry.get("why", ""), str):
        return f"paths.{name}.why must be a string"
    return None


def check_gemv_entry(shape: str, entry) -> str | None:
    """Why ``gemv[shape]`` is refused, or None."""
    if not isinstance(entry, dict) or set(entry) != set(GEMV_BUCKETS):
        return f"gemv.{shape}: must hold the row buckets {list(GEMV_BUCKETS)}"
    for b, e in entry.items():
        if not isinstance(e, dict) or set(e) - {"choice", "triton_us", "platform_us"}:
            return f"gemv.{shape}.{b}: unknown key(s); allowed: choice, triton_us, platform_us"
        if e.get("choice") not in ("triton", "platform"):
            return f"gemv.{shape}.{b}.choice must be triton or platform, got {e.get('choice')!r}"
        for k in ("triton_us", "platform_us"):
            v = e.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                return f"gemv.{shape}.{b}.{k} must be a number or null, got {v!r}"
    return None


def check_doc(doc) -> list[str]:
    """The document's problems, one line each (empty: valid). Whole-file problems come first."""
    if not isinstance(doc, dict):
        return ["not a JSON object"]
    if doc.get("format") != FORMAT:
        return [f"format {doc.get('format')!r}, expected {FORMAT!r}"]
    unknown = sorted(set(doc) - TOP_KEYS)
    if unknown:
        return [f"unknown key(s) {unknown}; allowed: {sorted(TOP_KEYS)}"]
    ident = doc.get("identity")
    if not isinstance(ident, dict) or set(ident) != set(IDENTITY_KEYS):
        return [f"identity must hold exactly {list(IDENTITY_KEYS)}"]
    for key in ("launch", "paths", "gemv"):
        if not isinstance(doc.get(key, {}), dict):
            return [f"{key} must be an object"]
    problems = []
    for family, override in doc.get("launch", {}).items():
        if family not in FAMILIES:
            problems.append(f"launch: unknown kernel family {family!r}; known: {', '.join(FAMILIES)}")
        elif not isinstance(override, dict):
            problems.append(f"launch.{family} must be an object (the format of {FAMILIES[family]})")
    problems += [p for p in (check_path_entry(k, v) for k, v in doc.get("paths", {}).items()) if p]
    problems += [p for p in (check_gemv_entry(k, v) for k, v in doc.get("gemv", {}).items()) if p]
    return problems


def identity_mismatch(found: dict, expected: dict) -> str | None:
    """One line naming what differs between a file's identity and this device's, or None."""
    diffs = [f"{k} {found.get(k)!r} (this device: {expected.get(k)!r})" for k in IDENTITY_KEYS
             if found.get(k) != expected.get(k)]
    return "made for " + ", ".join(diffs) if diffs else None


class TunedFile:
    """A loaded tuned file, its refused entries dropped (each named once through ``warn`` when loaded)."""

    def __init__(self, path: Path, doc: dict):
        self.path = Path(path)
        self.doc = doc

    @property
    def attention_shape(self) -> dict | None:
        return (self.doc.get("model") or {}).get("attention")

    def launch_override(self, family: str) -> str | None:
        """The family's override object as the JSON text its variable takes, or None."""
        override = self.doc.get("launch", {}).get(family)
        return json.dumps(override, sort_keys=True) if override else None

    def path_entry(self, name: str, attention: dict | None = None) -> dict | None:
        """``paths[name]`` when the file was tuned for this attention shape (``attention``: heads_q, heads_kv,
        head_dim of the engine; None skips the check), else None."""
        entry = self.doc.get("paths", {}).get(name)
        if entry is None:
            return None
        if attention is not None and name.split(".")[0] in ("decode", "prefill", "kv_write"):
            tuned = self.attention_shape or {}
            if any(tuned.get(k) != attention.get(k) for k in ("heads_q", "heads_kv", "head_dim")):
                return None
        return entry

    def gemv_entries(self) -> dict:
        return self.doc.get("gemv", {})


def load(path: Path | str, identity: dict, warn: Callable[[str], None]) -> TunedFile | None:
    """The tuned file at ``path`` for the device with ``identity``, or None (missing: silently; unreadable,
    truncated, of another format or made for another device: one line through ``warn``). Entries with an unknown
    key or a bad value are dropped, one line each."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        warn(f"vllm-dcu: ignoring tuned file {path}: {e.strerror or e}")
        return None
    try:
        doc = json.loads(text)
    except ValueError as e:
        warn(f"vllm-dcu: ignoring tuned file {path}: not valid JSON ({e}); run the tuning command again")
        return None
    problems = check_doc(doc)
    if problems and (not isinstance(doc, dict) or doc.get("format") != FORMAT or set(doc) - TOP_KEYS
                     or not isinstance(doc.get("identity"), dict) or set(doc["identity"]) != set(IDENTITY_KEYS)
                     or any(not isinstance(doc.get(k, {}), dict) for k in ("launch", "paths", "gemv"))):
        warn(f"vllm-dcu: ignoring tuned file {path}: {problems[0]}")
        return None
    why = identity_mismatch(doc["identity"], identity)
    if why:
        warn(f"vllm-dcu: ignoring tuned file {path}: {why}")
        return None
    for p in problems:  # entry-level problems: drop the entry, keep the rest
        warn(f"vllm-dcu: tuned file {path}: refused {p}")
    doc = dict(doc)
    doc["launch"] = {k: v for k, v in doc.get("launch", {}).items() if k in FAMILIES and isinstance(v, dict)}
    doc["paths"] = {k: v for k, v in doc.get("paths", {}).items() if check_path_entry(k, v) is None}
    doc["gemv"] = {k: v for k, v in doc.get("gemv", {}).items() if check_gemv_entry(k, v) is None}
    return TunedFile(path, doc)
