"""The series on a cscc-shaped base: the real upstream wheel with the fork's known differences (tests/cscc_base.py:
no module-level `_rocm_C` import, gfx936 routed to the skinny GEMMs, version 0.18.1+das.dtk2604), as a wheel
(`--base-wheel`) and installed with pip into a fresh venv (`--base-installed`, the DCU container's route).

- the series applies to it with no fuzz (git apply, and patch -p1 --fuzz=0 as quilt would);
- the overlay keeps the fork's edits, carries the compiled extensions byte for byte and is versioned
  0.18.1+das.dtk2604.dcu.<n>.<hash>; the installed route gives the same wheel as the wheel route;
- `vllm.platforms.rocm` of the patched tree imports with `_rocm_C` absent and never tries to import it (the
  upstream tree does, which shows the check can fail), and gfx936 still reaches the skinny GEMM through our hook;
- no code of ours (dcu/, kernels/, the patches' added lines) names a `_rocm_C` op (not slow: a scan).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from build_helpers import REPO, build, copy_repo, series_names, wheel_patchset
from cscc_base import DAS, ROCM, UTILS, make_cscc_wheel

from tools.dcubuild import fetch, series, tree

ROCM_C_NAMES = re.compile(r"_rocm_C|\bwvSplitK\w*|\bLLMM1\b|\bLLMM_\w+")
DAS_VERSION_RE = re.compile(r"^0\.18\.1\+das\.dtk2604\.dcu\.(\d+)\.([0-9a-f]{8})$")


def test_no_code_of_ours_names_a_rocm_C_op():
    """The fork does not build `_rocm_C`: nothing we ship or hook may call into it (or name its skinny GEMMs)."""
    hits = []
    for folder in ("dcu", "kernels"):
        for f in sorted((REPO / folder).rglob("*.py")):
            for i, line in enumerate(f.read_text().splitlines(), 1):
                if ROCM_C_NAMES.search(line):
                    hits.append(f"{f.relative_to(REPO)}:{i}: {line.strip()}")
    for p in sorted((REPO / "patches").glob("*.patch")):
        for line in p.read_text().splitlines():
            if line.startswith("+") and not line.startswith("+++") and ROCM_C_NAMES.search(line):
                hits.append(f"{p.name}: {line}")
    assert not hits, "\n".join(hits)
    # and the scan finds what it looks for
    assert ROCM_C_NAMES.search("torch.ops._rocm_C.wvSplitK(w, x)") and ROCM_C_NAMES.search("ops.LLMM1(w, x, 4)")


@pytest.fixture(scope="module")
def cscc(tmp_path_factory):
    root = tmp_path_factory.mktemp("cscc")
    repo = copy_repo(root / "repo")
    upstream = fetch.fetch_base(series.Pins.load(repo))
    return repo, upstream, make_cscc_wheel(upstream, root / "wheels")


def _infos(whl: Path, suffix: str) -> dict[str, tuple[int, int]]:
    with zipfile.ZipFile(whl) as zf:
        return {i.filename: (i.CRC, i.file_size) for i in zf.infolist() if i.filename.endswith(suffix)}


slow = pytest.mark.slow


@slow
def test_series_applies_to_the_cscc_base_with_no_fuzz(cscc, tmp_path):
    repo, _, whl = cscc
    p = build(repo, "--check", "--base-wheel", str(whl), "--tree-dir", str(tmp_path / "t"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"all {len(series_names(repo))} patches apply to {whl.name} with no fuzz" in p.stdout
    base = tmp_path / "quilt"
    tree.unpack(whl, base)
    for name in series_names(repo):
        q = subprocess.run(["patch", "-p1", "--fuzz=0", "--no-backup-if-mismatch", "-i", str(repo / "patches" / name)],
                           cwd=base, capture_output=True, text=True)
        assert q.returncode == 0 and "fuzz" not in q.stdout.lower(), f"{name}: {q.stdout}{q.stderr}"


@pytest.fixture(scope="module")
def overlay(cscc, tmp_path_factory):
    repo, _, whl = cscc
    out = tmp_path_factory.mktemp("overlay")
    p = build(repo, "--base-wheel", str(whl), "--dist", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    return next(out.glob("vllm-*.whl"))


@slow
def test_base_wheel_overlay_keeps_the_forks_edits_and_its_binaries(cscc, overlay):
    repo, upstream, whl = cscc
    rec = wheel_patchset(overlay)
    m = DAS_VERSION_RE.match(rec["version"])
    assert m and int(m.group(1)) == len(series_names(repo)), rec["version"]
    assert overlay.name == f"vllm-{rec['version']}-cp38-abi3-manylinux_2_31_x86_64.whl"
    assert rec["base"]["name"] == whl.name and rec["base"]["version"] == DAS
    so = _infos(overlay, ".so")
    assert so == _infos(whl, ".so") == _infos(upstream, ".so") and "vllm/_C.abi3.so" in so
    with zipfile.ZipFile(overlay) as zf:
        rocm, utils = zf.read(ROCM).decode(), zf.read(UTILS).decode()
        assert f"Version: {rec['version']}" in zf.read(f"vllm-{rec['version']}.dist-info/METADATA").decode()
    assert "# try:\n#     import vllm._rocm_C" in rocm and "def on_gfx936()" in rocm
    assert "DCU_TRITON_ATTN" in rocm  # patch 0003's hook in the same file
    assert "(on_gfx9() or on_gfx936())" in utils and "from vllm.dcu import gemv as dcu_gemv" in utils


PROBE = r"""
import importlib.abc, sys, types
tried = []
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "vllm._rocm_C":
            tried.append(name)
        return None
sys.meta_path.insert(0, Watch())
smi = types.ModuleType("amdsmi")  # the DCU's GPU query, answering gfx936 (no GPU, no torch.cuda here)
smi.AmdSmiException = type("AmdSmiException", (Exception,), {})
smi.amdsmi_init = smi.amdsmi_shut_down = lambda: None
smi.amdsmi_get_processor_handles = lambda: ["gpu0"]
smi.amdsmi_get_gpu_asic_info = lambda h: {"target_graphics_version": "gfx936"}
smi.amdsmi_topo_get_link_type = lambda a, b: {}
sys.modules["amdsmi"] = smi
import vllm.platforms.rocm as rocm
print("file", rocm.__file__)
print("tried", tried, "loaded", "vllm._rocm_C" in sys.modules)
print("gfx936", getattr(rocm, "on_gfx936", lambda: None)(), "gfx9", rocm.on_gfx9())
if len(sys.argv) > 1:
    import torch
    import vllm.model_executor.layers.utils as U
    calls = []
    U.num_compute_units = lambda: 80
    U.ops.wvSplitK = lambda w, x, cu, b: calls.append(tuple(x.shape)) or x.new_zeros(x.shape[0], w.shape[0])
    y = U.rocm_unquantized_gemm_impl(torch.ones(1, 64, dtype=torch.bfloat16), torch.ones(128, 64, dtype=torch.bfloat16))
    print("skinny", calls, tuple(y.shape))
"""


def _probe(tree_dir: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VLLM_DCU_TREE")}
    env["PYTHONPATH"] = f"{tree_dir}{os.pathsep}{REPO}"
    p = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env, cwd=tree_dir)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


@slow
def test_rocm_platform_imports_without_rocm_C_and_gfx936_takes_the_skinny_gemm(cscc, tmp_path, vllm_tree):
    repo, _, whl = cscc
    t = tmp_path / "tree"
    p = build(repo, "--tree", "--base-wheel", str(whl), "--tree-dir", str(t))
    assert p.returncode == 0, p.stdout + p.stderr
    assert not list(t.rglob("*.so"))  # no compiled extension at all in a tree: _rocm_C and _C are absent
    out = _probe(t, "gemm")
    assert f"file {t / ROCM}" in out
    assert "tried [] loaded False" in out and "gfx936 True gfx9 False" in out, out
    assert "skinny [(1, 64)] (1, 128)" in out, out
    if vllm_tree is not None:  # the upstream tree (0.18.1 + series) does try the import: the check can fail
        up = _probe(vllm_tree)
        assert "tried ['vllm._rocm_C'] loaded False" in up and "gfx936 None" in up, up


@slow
def test_base_installed_in_a_venv_builds_the_same_wheel_as_base_wheel(cscc, overlay, tmp_path):
    """pip install --no-deps of the cscc wheel into a fresh venv, then build.sh with that venv's Python."""
    repo, _, whl = cscc
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    pip = subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile", str(whl)],
                         capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr
    env = {"PYTHON": py, "PYTHONPATH": None, "VLLM_DCU_TREE": None}
    out = tmp_path / "out"
    p = build(repo, "--base-installed", "--dist", str(out), env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"installed vllm {DAS} in {venv}" in p.stdout and "edited" not in p.stdout, p.stdout
    got = next(out.glob("vllm-*.whl"))
    # named by the installed WHEEL file's tag (upstream's says linux_x86_64; its file name is manylinux_2_31's)
    with zipfile.ZipFile(whl) as zf:
        tag = re.search(r"^Tag: (\S+)$", zf.read(f"vllm-{DAS}.dist-info/WHEEL").decode(), re.M).group(1)
    assert got.name == f"vllm-{wheel_patchset(overlay)['version']}-{tag}.whl" and tag == "cp38-abi3-linux_x86_64"
    rec = wheel_patchset(got)
    assert rec["base"]["version"] == DAS and rec["base"]["name"] == f"vllm-{DAS}-{tag}.whl"
    skip = ("dcu_patchset.json", "/RECORD")
    with zipfile.ZipFile(got) as a, zipfile.ZipFile(overlay) as b:
        names = sorted(n for n in a.namelist() if not n.endswith(skip))
        assert names == sorted(n for n in b.namelist() if not n.endswith(skip))
        assert _infos(got, ".so") == _infos(overlay, ".so")
        assert all(a.read(n) == b.read(n) for n in names if not n.endswith(".so")), "members differ"
    # --check on the installed base reuses the wheel written from it
    c = build(repo, "--check", "--base-installed", env=env)
    assert c.returncode == 0 and "unchanged since" in c.stdout and "with no fuzz" in c.stdout, c.stdout + c.stderr
