#!/usr/bin/env python3
"""Box side of the GPU harness: install a bundle (ci/gpu/bundle.py) and run targets against its variants.

    bash ci/gpu/run.sh pytest [pytest args]     pytest -m gpu (default tests/gpu) with the variant on PYTHONPATH
    bash ci/gpu/run.sh python SCRIPT [args]     any script with the harness environment
    bash ci/gpu/run.sh list                     the bundle's variants (the default one marked)
    VARIANT=<name> selects the variant (default: the last one in the bundle).

Installs the dependency wheels into <tmp>/site once and unpacks each variant into <tmp>/variants/<name>/
(<tmp>: the system's temporary folder, tempfile.gettempdir(); VLLM_DCU_SITE / VLLM_DCU_VARIANTS override them)
with the compiled-op stand-ins applied (vllm/_C.py, vllm/vllm_flash_attn/__init__.py); a stamp file per
folder makes a second run in the same machine skip both.

Python API for drivers (standard library only, so a driver can import it before vLLM is importable):
    variants() -> list[str]             names in the bundle, in bundle order
    variant_env(name=None) -> dict      environment for a subprocess that runs that variant
    engine_kwargs(model=None, eager=False, **kw) -> dict   LLM(...) arguments that keep vLLM off
                                        compiled-only paths (+ model, load_format="dummy" with a model)
    serve_args(eager=False, **kw) -> list                  the same as `vllm serve` flags (no model/host/port)
    serve_command(model, host=, port=, **kw) -> list       full argv of `vllm serve MODEL ...`
    vllm_command(*args) -> list                            argv of vLLM's CLI (`bench`, `serve`, ...)
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path


def _sibling(name: str):
    """A module of this folder, by path: this file runs as a script, as ci.gpu.x, or loaded from its path."""
    spec = importlib.util.spec_from_file_location(f"vllm_dcu_ci_gpu_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


autotune_cache = _sibling("autotune_cache")

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# Things on the box that need compiled vLLM code, and what replaces them (also in docs/developing.md).
UNAVAILABLE = {
    "attention backends": "FLASH_ATTN / FLASHINFER / FLASHMLA need compiled kernels: use TRITON_ATTN",
    "custom ops": "vLLM's CUDA custom ops (rms_norm, silu_and_mul, rotary, ...): custom_ops=['none'] "
                  "makes them torch-native, compiled by Inductor",
    "GDN prefill": "FlashInfer's JIT kernel: gdn_prefill_backend='triton' (FLA kernels)",
    "custom all-reduce": "compiled; disable_custom_all_reduce=True uses NCCL (pynccl)",
    "sampling penalties": "repetition/frequency/presence penalties call _C::apply_repetition_penalties_",
    "quantized weights": "GPTQ/AWQ/Marlin/FP8 GEMMs are compiled ops",
    "structured output": "xgrammar/llguidance/outlines are not in the bundle",
    "multimodal encoders": "language_model_only=True: the vision tower is not built",
    "sleep mode": "cumem allocator is a compiled extension",
}

# Safety settings of the multi-GPU box (KINDS.md): NVLink multicast must stay off, in every process.
BOX_SAFETY_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                  "NVSHMEM_DISABLE_NVLS": "1"}


class HarnessError(Exception):
    """One-line, user-facing reason the harness cannot go on."""


def bundle_dir() -> Path:
    return Path(os.environ.get("VLLM_DCU_BUNDLE", REPO / ".bundle")).resolve()


def site_dir() -> Path:
    return Path(os.environ.get("VLLM_DCU_SITE", Path(tempfile.gettempdir()) / "site"))


def variants_root() -> Path:
    return Path(os.environ.get("VLLM_DCU_VARIANTS", Path(tempfile.gettempdir()) / "variants"))


def manifest(bundle: Path | None = None) -> dict:
    path = (bundle or bundle_dir()) / "manifest.json"
    if not path.is_file():
        raise HarnessError(f"no bundle at {path.parent} (make one on the CPU machine: "
                           f"python -m ci.gpu.bundle --wheel dist/<wheel>.whl, and carry .bundle)")
    return json.loads(path.read_text())


def variants(bundle: Path | None = None) -> list[str]:
    """Variant names in the bundle, in the order their wheels were given."""
    return [v["name"] for v in manifest(bundle)["variants"]]


def default_variant(bundle: Path | None = None) -> str:
    names = variants(bundle)
    chosen = os.environ.get("VARIANT") or names[-1]
    if chosen not in names:
        raise HarnessError(f"VARIANT={chosen!r} is not in the bundle; it has: {', '.join(names)}")
    return chosen


def variant_dir(name: str) -> Path:
    return variants_root() / name


# ------------------------------------------------------------------------------------------- install
def _stamp_ok(folder: Path, stamp: str) -> bool:
    f = folder / ".harness-stamp"
    return f.is_file() and f.read_text() == stamp


def install_deps(bundle: Path | None = None, python: str = sys.executable) -> bool:
    """pip-install the bundle's dependency wheels into site_dir() once; True if it installed."""
    bundle = bundle or bundle_dir()
    deps = sorted((bundle / "deps").glob("*.whl"))
    site = site_dir()
    stamp = hashlib.sha256("\n".join(p.name for p in deps).encode()).hexdigest()
    if _stamp_ok(site, stamp):
        return False
    if site.exists():
        shutil.rmtree(site)
    site.mkdir(parents=True)
    if deps:
        cmd = [python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
               "--no-cache-dir", "--disable-pip-version-check", "--target", str(site), *map(str, deps)]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if p.returncode != 0:
            raise HarnessError(f"installing {len(deps)} dependency wheels into {site} failed: "
                               + (p.stdout.strip().splitlines() or ["(no output)"])[-1])
    (site / ".harness-stamp").write_text(stamp)
    return True


def apply_standins(tree: Path, compiled_ops: dict, standins: Path) -> None:
    """Put the stand-ins into an unpacked variant tree (so child processes get them too)."""
    pkg = tree / "vllm"
    shutil.copyfile(standins / "vllm_C.py", pkg / "_C.py")
    (pkg / "_C_standin_ops.json").write_text(json.dumps(compiled_ops, indent=1) + "\n")
    fa = pkg / "vllm_flash_attn"
    if fa.is_dir():
        shutil.copyfile(standins / "vllm_flash_attn_init.py", fa / "__init__.py")


def install_variant(entry: dict, bundle: Path | None = None) -> bool:
    """Unpack one variant into variants_root()/<name> with stand-ins; True if it (re)installed."""
    bundle = bundle or bundle_dir()
    dest = variant_dir(entry["name"])
    standins = bundle / "standins"
    stamp = entry["sha256"] + ":" + hashlib.sha256(
        b"".join((standins / s).read_bytes() for s in sorted(os.listdir(standins)))).hexdigest()
    if _stamp_ok(dest, stamp):
        return False
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tarfile.open(bundle / entry["tarball"]) as tar:
        members = tar.getmembers()
        for m in members:
            if m.name.startswith("/") or ".." in Path(m.name).parts or not m.isfile():
                raise HarnessError(f"{entry['tarball']}: unexpected member {m.name!r}")
        tar.extractall(dest, members=members)
    apply_standins(dest, entry["compiled_ops"], standins)
    (dest / ".harness-stamp").write_text(stamp)
    return True


def prepare(bundle: Path | None = None) -> list[str]:
    """Install deps and every variant of the bundle (each only if changed), put back the Triton autotuning
    results an earlier call saved (ci/gpu/autotune_cache.py); return the variant names."""
    bundle = bundle or bundle_dir()
    man = manifest(bundle)
    if install_deps(bundle):
        print(f"harness: installed {len(man['deps'])} dependency wheels into {site_dir()}", flush=True)
    for entry in man["variants"]:
        if install_variant(entry, bundle):
            print(f"harness: unpacked variant {entry['name']} ({entry['version']}) into "
                  f"{variant_dir(entry['name'])}", flush=True)
    n = autotune_cache.restore(REPO / ".gpu" / "triton-autotune")
    if n:
        print(f"harness: restored {n} Triton autotuning results from .gpu/triton-autotune", flush=True)
    return [v["name"] for v in man["variants"]]


# ----------------------------------------------------------------------------------- environment
def variant_env(name: str | None = None, *, inprocess: bool = True, base: dict | None = None) -> dict:
    """Environment for a subprocess running `name` (default: VARIANT or the bundle's last variant).

    PYTHONPATH puts the variant tree first, then the dependency site, then the repository (for `kernels`,
    `bench`, `ci`), so the bundle's transformers 4.x wins over the image's 5.x. inprocess=True keeps the
    offline LLM's engine core in the calling process (VLLM_ENABLE_V1_MULTIPROCESSING=0); `vllm serve`
    always runs its engine in a child process, which finds the stand-ins in the tree.
    """
    name = name or default_variant()
    tree = variant_dir(name)
    if not (tree / "vllm" / "_C.py").is_file():
        raise HarnessError(f"variant {name!r} is not unpacked at {tree} (run: bash ci/gpu/run.sh list)")
    env = dict(os.environ if base is None else base)
    old = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(site_dir()), str(REPO)] + ([old] if old else []))
    env.update(BOX_SAFETY_ENV)
    env.update({
        "PYTHONUNBUFFERED": "1",
        "VLLM_DCU_VARIANT": name,
        "VLLM_DCU_USE_INSTALLED": "1",  # tests/conftest.py: test this tree, do not build one
        # torch symmetric-memory all-reduce would be picked on Hopper; the box must not use multicast
        "VLLM_ALLREDUCE_USE_SYMM_MEM": "0",
        # Triton keeps autotuning results on disk: later processes (serve after offline) skip the sweep
        "TRITON_CACHE_AUTOTUNING": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0" if inprocess else "1",
    })
    env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    return env


# What keeps vLLM 0.18.1 off compiled-only paths on the box (NOTES of the runtime probe; UNAVAILABLE above).
AVOID_COMPILED = {
    "attention_backend": "TRITON_ATTN",
    "gdn_prefill_backend": "triton",
    "compilation_config": {"custom_ops": ["none"]},
    "language_model_only": True,
    "disable_custom_all_reduce": True,
}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _has_tokenizer(model: str) -> bool:
    return any((Path(model) / f).is_file() for f in _TOKENIZER_FILES)


def engine_kwargs(model: str | None = None, *, eager: bool = False, **overrides) -> dict:
    """LLM(...) keyword arguments that avoid vLLM's compiled-only paths.

    With `model` (a folder from dummy_model.py) it adds model, load_format="dummy" and, when the folder has
    no tokenizer and none is passed, skip_tokenizer_init=True (prompt_token_ids in, token ids out).
    eager=True adds enforce_eager (no torch.compile, no CUDA graphs). Any other LLM/EngineArgs keyword
    may be passed; a compilation_config dict is merged into {"custom_ops": ["none"]}.
    """
    kw = json.loads(json.dumps(AVOID_COMPILED))
    if model is not None:
        kw["model"] = str(model)
        kw["load_format"] = "dummy"
        if "tokenizer" not in overrides and not _has_tokenizer(str(model)):
            kw["skip_tokenizer_init"] = True
    if eager:
        kw["enforce_eager"] = True
    extra = dict(overrides)
    if isinstance(extra.get("compilation_config"), dict):
        kw["compilation_config"].update(extra.pop("compilation_config"))
    kw.update(extra)
    return kw


def _flag(key: str, value) -> list[str]:
    opt = "--" + key.replace("_", "-")
    if value is True:
        return [opt]
    if value is False:
        return ["--no-" + key.replace("_", "-")]
    if isinstance(value, (dict, list)):
        return [opt, json.dumps(value, separators=(",", ":"))]
    return [opt, str(value)]


def serve_args(*, eager: bool = False, **overrides) -> list[str]:
    """`vllm serve` flags with the settings of engine_kwargs() (no model, host or port: see serve_command).

    False values become --no-<flag> (e.g. enable_prefix_caching=False), so pass only EngineArgs booleans.
    """
    kw = engine_kwargs(eager=eager, **overrides)
    args: list[str] = []
    for key, value in kw.items():
        if value is None or (value is False and key in ("enforce_eager", "skip_tokenizer_init")):
            continue
        args += _flag(key, value)
    return args


def vllm_command(*args: str, python: str = sys.executable) -> list[str]:
    """argv running vLLM's CLI from the variant on PYTHONPATH (there is no `vllm` script on the box)."""
    return [python, "-m", "vllm.entrypoints.cli.main", *args]


def serve_command(model: str, *, host: str = "127.0.0.1", port: int = 8000, eager: bool = False,
                  python: str = sys.executable, **overrides) -> list[str]:
    """Full argv of `vllm serve MODEL` on host:port with dummy weights and the harness settings."""
    kw = engine_kwargs(model, eager=eager, **overrides)
    model = kw.pop("model")
    flags: list[str] = []
    for key, value in kw.items():
        if value is None or (value is False and key in ("enforce_eager", "skip_tokenizer_init")):
            continue
        flags += _flag(key, value)
    return vllm_command("serve", model, "--host", host, "--port", str(port), *flags, python=python)


# ------------------------------------------------------------------------------------------------ CLI
def _run(argv: list[str], env: dict) -> int:
    try:
        return subprocess.call(argv, env=env, cwd=str(REPO))
    except KeyboardInterrupt:
        return 130


def main(argv: list[str]) -> int:
    usage = "usage: run.sh {pytest [args] | python SCRIPT [args] | list | prepare}"
    if not argv or argv[0] in ("-h", "--help"):
        print(usage + "\n" + __doc__)
        return 0 if argv else 2
    target, rest = argv[0], argv[1:]
    if target not in ("pytest", "python", "list", "prepare"):
        raise HarnessError(f"unknown target {target!r}; {usage}")
    names = prepare()
    if target == "prepare":
        return 0
    if target == "list":
        chosen = default_variant()
        man = manifest()
        for v in man["variants"]:
            mark = "*" if v["name"] == chosen else " "
            print(f"{mark} {v['name']:<24} {v['version']:<32} {v['wheel']}")
        return 0
    name = default_variant()
    env = variant_env(name)
    print(f"harness: variant {name} ({len(names)} in bundle); PYTHONPATH={env['PYTHONPATH']}", flush=True)
    if target == "pytest":
        paths = [a for a in rest if not a.startswith("-")]
        report = Path(tempfile.mkstemp(prefix="gpu-smoke-report-")[1])
        env["VLLM_DCU_SMOKE_REPORT"] = str(report)
        env["VLLM_DCU_HARNESS_CMD"] = " ".join(["bash ci/gpu/run.sh", *argv])
        rc = _run([sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", *rest]
                  + ([] if paths else ["tests/gpu"]), env)
        md = Path(report.read_text().strip()) if report.read_text().strip() else None
        if md is not None and md.is_file():  # the results table, last
            print(f"\n{md}:\n" + md.read_text(), flush=True)
        report.unlink()
        return rc
    if not rest:
        raise HarnessError("target python needs a script: run.sh python SCRIPT [args]")
    return _run([sys.executable, *rest], env)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except HarnessError as e:
        print(f"harness: error: {e}", file=sys.stderr)
        sys.exit(2)
