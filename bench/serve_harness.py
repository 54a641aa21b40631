"""The serving benchmark's view of the GPU harness (ci/gpu/harness.py, or a stand-in in the tests): loading it,
and the few calls whose signature differs between harness versions."""
from __future__ import annotations

import importlib.util
import inspect
import os

from bench.serve_config import BenchError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_harness():
    """The GPU harness (ci/gpu/harness.py), or the module named by VLLM_DCU_BENCH_HARNESS (tests)."""
    path = os.environ.get("VLLM_DCU_BENCH_HARNESS") or os.path.join(REPO, "ci", "gpu", "harness.py")
    if not os.path.exists(path):
        raise BenchError(f"GPU harness not found at {path}; run through `bash ci/gpu/run.sh python -m "
                         f"bench.serve_bench ...` after `python -m ci.gpu.bundle --wheel ...`")
    return _load_by_path("vllm_dcu_bench_harness", path)


def _load_by_path(name: str, path: str):
    """A module from its file: the harness is a standalone script, not a package of this repository."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def harness_write_config(harness, model_dir: str, layers: int) -> None:
    fn = getattr(harness, "write_config", None)
    if fn is None:
        path = os.path.join(os.path.dirname(os.path.abspath(harness.__file__)), "dummy_model.py")
        fn = _load_by_path("vllm_dcu_bench_dummy_model", path).write_config
    fn(model_dir, layers)


def _accepts(fn, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def harness_env(harness, name: str, serve: bool) -> dict:
    """Environment for a process of variant `name`; a server gets its engine core in a child process."""
    if serve and _accepts(harness.variant_env, "inprocess"):
        return harness.variant_env(name, inprocess=False)
    return harness.variant_env(name)


def harness_serve_args(harness, mode: str, capture_sizes: list[int] | None = None) -> list[str]:
    """The harness's serve flags; eager mode adds --enforce-eager unless the harness takes `eager=`."""
    fn = harness.serve_args
    kw = {}
    cc = {}
    if capture_sizes:
        cc["cudagraph_capture_sizes"] = capture_sizes
    if mode == "decode-graph":  # no torch.compile (fast starts), full CUDA graphs for decode batches
        cc.update({"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"})
    if cc:
        if not _accepts(fn, "compilation_config"):
            raise BenchError("--capture-sizes and --mode decode-graph need a harness serve_args() that takes "
                             "compilation_config")
        kw["compilation_config"] = cc
    if _accepts(fn, "eager"):
        args = list(fn(eager=(mode == "eager"), **kw))
    else:
        args = list(fn(**kw))
        if mode == "eager" and "--enforce-eager" not in args:
            args.append("--enforce-eager")
    if mode in ("graph", "decode-graph") and "--enforce-eager" in args:
        raise BenchError("harness serve_args() forces --enforce-eager; use --mode eager")
    return args
