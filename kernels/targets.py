"""Which launch-parameter entry a device uses, and the JSON override every kernel's launch_params reads.

Each kernel family keeps its own table (``PARAMS`` in its launch_params.py) keyed by target: an exact arch
('sm90', 'gfx936', ...), a generic 'cuda' / 'rocm' for archs it has no entry for, or 'interpreter' (Triton's
CPU interpreter, TRITON_INTERPRET=1).
"""
import json
import os

_ARCH: dict = {}  # device index -> 'sm90' / 'gfx936' / ...
EMULATE_ENV = "VLLM_DCU_EMULATE_ARCH"
EMULATED = ("gfx936", "gfx928")


def emulated_arch() -> str | None:
    """``VLLM_DCU_EMULATE_ARCH`` (gfx936 / gfx928) on a CUDA GPU: the DCU rehearsal. The kernels then take the DCU's
    table entries and code paths (no PTX, no Gluon, software fp8, portable conversions); Triton still compiles for
    the GPU at hand, which ignores the ROCm-only launch options. None when unset; any other value fails naming the
    supported ones."""
    raw = os.environ.get(EMULATE_ENV, "").strip()
    if not raw:
        return None
    if raw not in EMULATED:
        raise ValueError(f"{EMULATE_ENV}={raw!r}: supported values are {', '.join(EMULATED)} (or unset)")
    return raw


def device_arch(device=None) -> str:
    """'interpreter', or the device's arch: 'sm<major><minor>' on CUDA, the gcnArchName's base on ROCm (the emulated
    DCU arch under ``VLLM_DCU_EMULATE_ARCH``)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "interpreter"
    emulated = emulated_arch()
    if emulated:
        return emulated
    import torch

    index = getattr(device, "index", None) if getattr(device, "type", None) == "cuda" else None
    if index is None:
        index = torch.cuda.current_device()
    if index not in _ARCH:
        props = torch.cuda.get_device_properties(index)
        _ARCH[index] = props.gcnArchName.split(":")[0] if torch.version.hip else f"sm{props.major}{props.minor}"
    return _ARCH[index]


def target_for(known, device=None) -> str:
    """The key into a table with the keys ``known`` for the device: its arch if known, else 'rocm' / 'cuda'."""
    arch = device_arch(device)
    if arch == "interpreter" or arch in known:
        return arch
    return "rocm" if arch.startswith("gfx") else "cuda"


def parse_override_object(env_var: str, text: str, allowed) -> dict:
    """``text`` (the value of ``env_var``) as a JSON object whose keys are all in ``allowed``; ValueError naming
    the variable otherwise."""
    try:
        override = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{env_var} is not valid JSON ({e.msg} at char {e.pos}): {text!r}") from None
    if not isinstance(override, dict):
        raise ValueError(f"{env_var} must be a JSON object, got {text!r}")
    unknown = sorted(set(override) - set(allowed))
    if unknown:
        raise ValueError(f"{env_var}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    return override


def cached_entry(cache: dict, env_var: str, build, target: str, override: str | None = None,
                 family: str | None = None, tuned_override=None) -> dict:
    """``build(target, text)`` once per (target, override text), the text being ``override`` or, when that is None,
    the value of ``env_var``; later calls return the same (validated, not to be modified) dict. With ``family`` and
    no ``override``, the device's tuned file's launch override for that family, ``tuned_override(family)`` (the
    launch tables pass kernels/tuning/decisions.launch_override: kernels/tuning imports this module, so this module
    does not import it), is applied first, ``build(target, tuned)``, and the variable over it, ``build(target, text,
    base=that)``; a tuned override the builder refuses is dropped with one line naming the key, and the table's entry
    is used."""
    text = os.environ.get(env_var, "") if override is None else override
    tuned = None
    if family is not None and override is None and tuned_override is not None:
        tuned = tuned_override(family)
    key = (target, text, tuned)
    if key not in cache:
        base = None
        if tuned:
            try:
                base = build(target, tuned)
            except ValueError as e:
                import logging

                logging.getLogger("vllm.dcu.tuning").warning(
                    "vllm-dcu: tuned file's launch.%s refused (%s); the launch table's entry is used", family, e)
        entry = build(target, text) if base is None else build(target, text, base=base)
        if emulated_arch() and target == emulated_arch():  # the DCU rehearsal: Triton compiles for CUDA here
            entry = _without_rocm_options(entry)
        cache[key] = entry
    return cache[key]


# launch options only ROCm's Triton knows (every family's tables use these names); CUDA's Triton refuses them
ROCM_ONLY_OPTIONS = ("waves_per_eu", "matrix_instr_nonkdim")


def _without_rocm_options(obj):
    """A copy of a launch entry without ROCm-only options at any depth: the DCU's entry, validated as the DCU's, made
    launchable by CUDA's Triton for the rehearsal (VLLM_DCU_EMULATE_ARCH)."""
    if isinstance(obj, dict):
        return {k: _without_rocm_options(v) for k, v in obj.items() if k not in ROCM_ONLY_OPTIONS}
    return obj


_NUM_CUS: dict = {}  # device index -> multiprocessors (CUDA) / compute units (ROCm)


def num_compute_units(device) -> int:
    """SMs / CUs of a GPU device (1 for anything else, e.g. the CPU under Triton's interpreter); read once."""
    if device.type != "cuda":
        return 1
    import torch

    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _NUM_CUS:
        _NUM_CUS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _NUM_CUS[idx]
