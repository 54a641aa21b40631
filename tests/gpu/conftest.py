"""GPU smoke tests: shared fixtures, the skip rule, and the results file.

Run on the H200 box through the harness (it puts the bundled variant on PYTHONPATH):
    bash ci/gpu/run.sh pytest tests/gpu -x
Every test here is marked `gpu` (deselected on CPU by pytest.ini) and skipped when no CUDA GPU is visible;
a skip is never a pass. At the end the session writes <date>-<gpu>-gpu-smoke.{json,md} into $OUT (default
bench/results/): per test the outcome, wall time and the numbers each test recorded.
"""
from __future__ import annotations

import datetime
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_harness = _load("vllm_dcu_gpu_harness", REPO / "ci" / "gpu" / "harness.py")
_dummy_model = _load("vllm_dcu_dummy_model", REPO / "ci" / "gpu" / "dummy_model.py")
_server = _load("vllm_dcu_gpu_server", HERE / "_server.py")


def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def pytest_collection_modifyitems(config, items):
    n = gpu_count()
    for item in items:
        if not str(item.fspath).startswith(str(HERE)):
            continue
        need = item.get_closest_marker("gpus")
        want = need.args[0] if need else 1
        if n < want:
            item.add_marker(pytest.mark.skip(reason=f"needs {want} CUDA GPU(s), found {n}"))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpus(n): needs at least n CUDA GPUs")


# --------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def harness():
    """ci/gpu/harness.py (engine_kwargs, serve_command, variant_env, ...)."""
    return _harness


@pytest.fixture(scope="session")
def server_lib():
    """tests/gpu/_server.py: Server (a `vllm serve` process with an HTTP client) and free_port()."""
    return _server


def _run_env(inprocess: bool) -> dict:
    name = os.environ.get("VLLM_DCU_VARIANT")
    if name:
        return _harness.variant_env(name, inprocess=inprocess)
    env = dict(os.environ)
    env.update(_harness.BOX_SAFETY_ENV)
    env.update({"PYTHONUNBUFFERED": "1", "VLLM_ALLREDUCE_USE_SYMM_MEM": "0",
                "TRITON_CACHE_AUTOTUNING": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0" if inprocess else "1"})
    return env


@pytest.fixture(scope="session")
def run_env() -> dict:
    """Environment for a child process running offline vLLM in-process: the harness variant, or the
    vllm this interpreter finds (when pytest runs outside the harness)."""
    return _run_env(inprocess=True)


@pytest.fixture(scope="session")
def serve_env() -> dict:
    """Environment for `vllm serve` (engine core in its own process, as in production)."""
    return _run_env(inprocess=False)


@pytest.fixture(scope="session")
def model_4l(tmp_path_factory) -> str:
    """A 4-layer Qwen3.5-27B-shaped dummy model folder (one full-attention layer, three GDN layers)."""
    return str(_dummy_model.write_config(tmp_path_factory.mktemp("qwen35-4l"), 4))


@pytest.fixture(scope="session")
def smoke_engine() -> dict:
    """Engine settings shared by the smoke tests (on top of harness.engine_kwargs), so that the second
    engine start reuses the first one's torch.compile and Triton caches; small, so starts are short."""
    return dict(max_model_len=4096, max_num_seqs=16, max_num_batched_tokens=2048, gpu_memory_utilization=0.45,
                compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 8, 16]})


@pytest.fixture
def record(request):
    """record(key=value, ...): numbers that go into this test's row of the results file."""
    data = request.node.stash.setdefault(_RECORD, {})

    def add(**kw):
        data.update(kw)

    return add


_RECORD = pytest.StashKey[dict]()
_ROWS: list[dict] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if not str(item.fspath).startswith(str(HERE)):
        return
    if rep.when == "call" or (rep.when == "setup" and rep.outcome != "passed"):
        row = {"test": item.nodeid, "outcome": rep.outcome, "seconds": round(rep.duration, 1)}
        row.update(item.stash.get(_RECORD, {}))
        if rep.outcome == "skipped" and isinstance(rep.longrepr, tuple):
            row["reason"] = rep.longrepr[2]
        elif rep.outcome == "failed":
            row["reason"] = (rep.longreprtext.strip().splitlines() or [""])[-1][:300]
        _ROWS.append(row)


def _gpu_label() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.split("\n")[0]
        return out.strip().split()[-1].lower() if out.strip() else "gpu"
    except Exception:
        return "gpu"


def pytest_sessionfinish(session, exitstatus):
    # results only from a machine with a GPU (or where $OUT asks for them): a CPU run only skips
    if not _ROWS or not (gpu_count() or os.environ.get("OUT")):
        return
    out = Path(os.environ.get("OUT") or REPO / "bench" / "results")
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{datetime.date.today().isoformat()}-{_gpu_label()}-gpu-smoke"
    prog = "python -m pytest" if sys.argv[0].endswith("__main__.py") else Path(sys.argv[0]).name
    command = os.environ.get("VLLM_DCU_HARNESS_CMD") or " ".join([prog, *map(shlex.quote, sys.argv[1:])])
    variant = os.environ.get("VLLM_DCU_VARIANT", "(installed vllm)")
    meta = {"command": command, "variant": variant, "gpus": gpu_count(), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
            "exitstatus": int(exitstatus)}
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "tests": _ROWS}, indent=1) + "\n")
    keys = [k for k in dict.fromkeys(k for r in _ROWS for k in r) if k not in ("test", "outcome", "seconds",
                                                                                  "reason")]
    lines = [f"# GPU smoke tests ({variant})", "", f"Command: `{command}`", "",
             f"{meta['time']}, {meta['gpus']} GPU(s), pytest exit status {meta['exitstatus']}", "",
             "| " + " | ".join(["test", "outcome", "s", *keys]) + " |",
             "|" + "---|" * (3 + len(keys))]
    for r in _ROWS:
        name = r["test"].split("::")[-1]
        outcome = r["outcome"] + (f" ({r['reason']})" if r.get("reason") else "")
        lines.append("| " + " | ".join([name, outcome, str(r["seconds"]), *(str(r.get(k, "")) for k in keys)])
                     + " |")
    md = out / f"{stem}.md"
    md.write_text("\n".join(lines) + "\n")
    os.environ["VLLM_DCU_SMOKE_REPORT_WRITTEN"] = str(md)
    report = os.environ.get("VLLM_DCU_SMOKE_REPORT")
    if report:  # the harness prints it after pytest's own summary
        Path(report).write_text(str(md))
