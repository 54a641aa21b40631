"""build.sh on the real inputs: the pinned 413 MiB upstream wheel and patches/series.

What only the real base can show: the series applies to it (in order, each patch alone, and as quilt would apply
it, with no fuzz), the wheel it builds is complete and installs, the patches are in the form --refresh writes, and
--source builds the upstream sdist. The build tool's mechanisms (every verb, every bad input) are tested on a
synthetic base in tests/test_build_tool.py. Each test works on a copy of the repository's build inputs in a
temporary folder; the base wheel is shared through the normal cache (~/.cache/vllm-dcu or $VLLM_DCU_CACHE), so only
the first build of a fresh machine downloads it.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from build_helpers import build, copy_repo, series_names, wheel_patchset

from tools.dcubuild import fetch, series, tree, wheel

pytestmark = pytest.mark.slow
VERSION_RE = re.compile(r"^0\.18\.1\+dcu\.(\d+)\.([0-9a-f]{8})$")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    repo = copy_repo(tmp_path_factory.mktemp("built"))
    p = build(repo)
    assert p.returncode == 0, p.stderr
    wheels = sorted((repo / "dist").glob("vllm-*.whl"))
    assert len(wheels) == 1
    return repo, wheels[0], p.stdout


def test_build_writes_wheel_with_series_version_and_patchset(built):
    repo, whl, out = built
    names = series_names(repo)
    rec = wheel_patchset(whl)
    m = VERSION_RE.match(rec["version"])
    assert m and int(m.group(1)) == len(names)
    assert whl.name.startswith(f"vllm-{rec['version']}-cp38-abi3-manylinux_2_31_x86_64")
    assert [p["name"] for p in rec["patches"]] == names
    for p in rec["patches"]:
        assert p["sha256"] == hashlib.sha256((repo / "patches" / p["name"]).read_bytes()).hexdigest()
    pins = json.loads(next((repo / "vendor").glob("vllm-*.json")).read_text())
    assert rec["base"] == {"name": pins["wheel"]["file"], "version": "0.18.1", "sha256": pins["wheel"]["sha256"]}
    for step in ("fetch", "verify", "unpack", "apply", "kernels", "stamp", "pack"):
        assert re.search(rf"^{step}\s", out, re.M), out


def test_wheel_is_complete_and_record_matches(built):
    _, whl, _ = built
    with zipfile.ZipFile(whl) as zf:
        assert zf.testzip() is None
        names = set(zf.namelist())
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        version = wheel_patchset(whl)["version"]
        assert dist_info == f"vllm-{version}.dist-info"
        assert f"Version: {version}" in zf.read(f"{dist_info}/METADATA").decode()
        for n in ("vllm/_C.abi3.so", "vllm/dcu_kernels/__init__.py", "vllm/dcu/__init__.py", "vllm/dcu_patchset.py",
                  "vllm/dcu/patchset.py", "vllm/dcu/triton_attn.py", "vllm/dcu/scheduler/budget.py"):
            assert n in names, n
        assert not [n for n in names if re.search(r"dcu_kernels/.*/(bench\w*|compile_check)\.py$", n)]
        rows = list(csv.reader(io.StringIO(zf.read(f"{dist_info}/RECORD").decode())))
        record = {r[0]: r for r in rows if r}
        assert set(record) == names
        for n in ("vllm/_version.py", "vllm/dcu_patchset.json", "vllm/v1/engine/core.py", "vllm/_C.abi3.so"):
            data = zf.read(n)
            assert record[n] == [n, wheel.record_hash(data), str(len(data))]
        assert f"__version__ = version = {version!r}" in zf.read("vllm/_version.py").decode()


def test_wheel_installs_into_fresh_venv_and_reports_version_and_patchset(built, tmp_path):
    _, whl, _ = built
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    # torch and vLLM's other dependencies come from the test environment (the wheel is installed --no-deps)
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    parent = [p for p in sys.path if p.endswith("site-packages")]
    Path(site, "test_parent_env.pth").write_text("\n".join(parent) + "\n")
    p = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(whl)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import vllm, json; print(vllm.__version__); print(vllm.__file__)"
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    version, location = out.stdout.split()[-2:]
    assert version == wheel_patchset(whl)["version"] and location.startswith(str(venv))
    rep = subprocess.run([str(py), "-m", "vllm.dcu_patchset", "--json"], capture_output=True, text=True, env=env,
                         cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    assert json.loads(rep.stdout) == wheel_patchset(whl)


@pytest.fixture(scope="module")
def base_checkout(built, tmp_path_factory):
    """A worktree of the built tree at tag dcu-base: the unpatched upstream files."""
    repo, _, _ = built
    base = tmp_path_factory.mktemp("base") / "tree"
    subprocess.run(["git", "-C", str(repo / "build" / "tree"), "worktree", "add", "-q", "--detach", str(base),
                    "dcu-base"], check=True)
    return base


def test_every_patch_applies_alone_on_the_base(built, base_checkout):
    """Ablation promise: any subset builds, so each patch must apply on the bare base too (no fuzz)."""
    repo, _, _ = built
    for p in series.load_series(repo):
        tree.git(base_checkout, "checkout", "-q", "-f", "dcu-base")
        tree.apply_patch(base_checkout, p)  # BuildError names the file and hunk that failed
    tree.git(base_checkout, "checkout", "-q", "-f", "dcu-base")


def test_series_applies_with_quilt_style_patch_no_fuzz(built, base_checkout):
    """`quilt push -a` runs `patch -p1` per series entry; every patch must apply that way with fuzz 0."""
    repo, _, _ = built
    tree.git(base_checkout, "checkout", "-q", "-f", "dcu-base")
    tree.git(base_checkout, "clean", "-q", "-fd")
    for name in series_names(repo):
        p = subprocess.run(["patch", "-p1", "--fuzz=0", "--no-backup-if-mismatch", "-i",
                            str(repo / "patches" / name)], cwd=base_checkout, capture_output=True, text=True)
        assert p.returncode == 0, f"{name}: {p.stdout}{p.stderr}"
        assert "fuzz" not in p.stdout.lower() and "offset" not in p.stdout.lower(), p.stdout


def test_patches_are_in_the_form_refresh_writes(tmp_path):
    """--edit then --refresh changes nothing: a developer's refresh rewrites only the patches they changed."""
    repo = copy_repo(tmp_path / "r")
    assert build(repo, "--edit").returncode == 0
    before = {f.name: f.read_text() for f in (repo / "patches").iterdir()}
    p = build(repo, "--refresh")
    assert p.returncode == 0 and "refresh " not in p.stdout, p.stdout + p.stderr
    assert {f.name: f.read_text() for f in (repo / "patches").iterdir()} == before


def test_source_mode_applies_series_to_upstream_sdist_and_builds_its_wheel(tmp_path):
    """--source on the pinned upstream sdist (the stand-in for a vllm_cscc clone), VLLM_TARGET_DEVICE=empty."""
    repo = copy_repo(tmp_path / "r")
    sdist = fetch.fetch_sdist(series.Pins.load(repo))  # through pip, verified against the pin
    src = tmp_path / "src"
    subprocess.run(["tar", "-xzf", str(sdist), "-C", str(tmp_path)], check=True)
    (tmp_path / sdist.name[: -len(".tar.gz")]).rename(src)
    p = build(repo, "--source", str(src), "--dist", str(tmp_path / "out"), env={"VLLM_TARGET_DEVICE": "empty"})
    assert p.returncode == 0, p.stdout + p.stderr
    whl = next((tmp_path / "out").glob("vllm-*.whl"))
    rec = wheel_patchset(whl)
    assert VERSION_RE.match(rec["version"]) and [x["name"] for x in rec["patches"]] == series_names(repo)
    with zipfile.ZipFile(whl) as zf:
        names = set(zf.namelist())
        assert "vllm/dcu_kernels/__init__.py" in names and "vllm/dcu_patchset.py" in names
        assert rec["version"] in zf.read("vllm/_version.py").decode()
    # the checkout itself is left untouched
    assert not (src / "vllm" / "dcu_patchset.py").exists()
