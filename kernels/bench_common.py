"""What the kernels' microbenchmarks share (python -m kernels.<family>.bench): log lines, the repeatable ``LABEL=JSON``
options that try launch entries beside the table's, comma-separated integer options, timing a CUDA/HIP graph of
calls, geometric means, the report's file names and writing, and vLLM 0.18.1's unified attention loaded from its file
with stand-ins for its vllm imports (the attention benches' baseline). Runs from the repository, not shipped (its name
matches kernels/tuning/tuned_file.NOT_SHIPPED's ``bench*.py``).
"""
import importlib.util
import json
import logging
import math
import os
import sys
import types

from .results_io import write_text


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def parse_label_json(item: str, flag: str, reserved=(), empty_ok=False) -> tuple[str, dict]:
    """One ``LABEL=JSON`` option (``--kv8``, ``--try``) -> (label, the JSON object). ValueError naming ``flag`` when
    the label is missing or ``reserved``, the text is not JSON, or not an object (not a non-empty one, unless
    ``empty_ok``)."""
    label, sep, text = item.partition("=")
    label = label.strip()
    if not sep or not label or label in reserved:
        other = f" with a label other than {' / '.join(reserved)}" if reserved else ""
        raise ValueError(f"{flag} needs LABEL=JSON{other}, got {item!r}")
    try:
        val = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{flag} {label}: not JSON: {e}") from None
    if not isinstance(val, dict) or not (val or empty_ok):
        raise ValueError(f"{flag} {label}: JSON must be a{'n' if empty_ok else ' non-empty'} object of launch options")
    return label, val


def parse_ints(text: str) -> tuple:
    """``"1,4,16"`` -> (1, 4, 16); () when any part is not an integer."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        return ()


def graph_of(fns):
    """A CUDA/HIP graph of one call of each fn, in order (each runs once before the capture: Triton compiles there)."""
    import torch

    for f in fns:
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    return g


def graph_ms(fn, warmup=20, rep=100):
    """Median ms of replays of a graph of one ``fn`` call (triton.testing.do_bench: the L2 flushed before each)."""
    import triton

    g = graph_of([fn])
    ms = triton.testing.do_bench(g.replay, warmup=warmup, rep=rep, return_mode="median")
    del g
    return ms


def result_base(out: str, device: str, what: str, tag: str = "") -> str:
    """``<out>/<date>-<device>-<what>[-<tag>]``: a report's path without its suffix (.json, .md, .png)."""
    import datetime

    stamp = datetime.date.today().isoformat()
    dev = device.replace(" ", "-").lower()
    return os.path.join(out, f"{stamp}-{dev}-{what}" + (f"-{tag}" if tag else ""))


def write_report(base: str, doc: dict, md: str) -> None:
    """``base``.json (``doc``) and ``base``.md, each written whole or not at all (results_io)."""
    write_text(base + ".json", json.dumps(doc, indent=1))
    write_text(base + ".md", md)


def load_ua_file(path, extra_stubs=None, module_name="ua_baseline_0181"):
    """0.18.1's triton_unified_attention.py with stand-ins for its four vllm imports (and ``extra_stubs``, module
    name -> stand-in, for a patched file's further imports)."""
    import torch
    import triton

    stubs = {
        "vllm": types.ModuleType("vllm"),
        "vllm.logger": types.SimpleNamespace(init_logger=logging.getLogger),
        "vllm.model_executor.layers.batch_invariant": types.SimpleNamespace(vllm_is_batch_invariant=lambda: False),
        "vllm.platforms": types.SimpleNamespace(
            current_platform=types.SimpleNamespace(fp8_dtype=lambda: torch.float8_e4m3fn)),
        "vllm.triton_utils": types.SimpleNamespace(tl=triton.language, triton=triton),
        **(extra_stubs or {}),
    }
    saved = {k: sys.modules.get(k) for k in stubs}
    sys.modules.update(stubs)
    try:
        spec = importlib.util.spec_from_file_location(module_name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return mod.unified_attention
