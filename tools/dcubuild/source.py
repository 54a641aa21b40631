"""--source: apply the series to a source checkout (a copy of it) and run the checkout's own wheel build."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .common import BuildError, last_line, log, shown
from .series import Patch
from .tree import apply_patch, commit_base, git
from .verbs import install_and_record
from .wheel import add_files_to_wheel


def source_version(work: Path) -> str:
    """VLLM_DCU_SOURCE_VERSION, else the checkout's PKG-INFO version."""
    version = os.environ.get("VLLM_DCU_SOURCE_VERSION")
    if version:
        return version
    pkg_info = work / "PKG-INFO"
    m = re.search(r"^Version: (\S+)", pkg_info.read_text(), re.M) if pkg_info.exists() else None
    if not m:
        raise BuildError("cannot tell the source checkout's version: set VLLM_DCU_SOURCE_VERSION "
                         "(e.g. 0.18.1+das.dtk2604 for vllm_cscc)")
    return m.group(1)


def build_source(repo: Path, src: Path, patches: list[Patch], out_dir: Path, work: Path) -> Path:
    if not (src / "setup.py").is_file() or not (src / "vllm").is_dir():
        raise BuildError(f"--source {src}: not a vLLM source checkout (needs setup.py and vllm/)")
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(src, work, ignore=shutil.ignore_patterns(".git", "build", "dist", "__pycache__", "*.so"))
    log(f"copy    {src} -> {shown(work, repo)}")
    commit_base(work, f"base: source checkout {src}")
    for p in patches:
        apply_patch(work, p)
        log(f"apply   {p.name}")
    base_version = source_version(work)
    version = install_and_record(repo, work, f"source:{src.name}", git(work, "rev-parse", "dcu-base").stdout.strip(),
                                 base_version, patches)
    env = dict(os.environ, VLLM_VERSION_OVERRIDE=version)
    log(f"build   pip wheel --no-build-isolation (VLLM_TARGET_DEVICE={env.get('VLLM_TARGET_DEVICE', 'auto')}, "
        f"version {version})")
    with tempfile.TemporaryDirectory(prefix="vllm-dcu-src-") as tmp:
        p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", tmp,
                            str(work)], env=env, capture_output=True, text=True)
        built = sorted(Path(tmp).glob("vllm-*.whl"))
        if p.returncode != 0 or not built:
            raise BuildError(f"the source checkout's wheel build failed: {last_line(p.stderr + p.stdout)}")
        out_dir.mkdir(parents=True, exist_ok=True)
        final = out_dir / built[0].name
        # setup.py's package_data does not list our json: add it to the built wheel
        add_files_to_wheel(built[0], {"vllm/dcu_patchset.json": (work / "vllm" / "dcu_patchset.json").read_bytes()},
                           final)
    log(f"pack    {shown(final, repo)}")
    return final
