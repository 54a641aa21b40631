"""build.sh: the pinned base + patches/series -> wheel pipeline, its variants and its bad inputs.

Each test works on a copy of the repository's build inputs (build.sh, tools/, vendor/, patches/, kernels/) in a
temporary folder; the downloaded base wheel is shared through the normal cache (~/.cache/vllm-dcu or
$VLLM_DCU_CACHE), so only the first build of a fresh machine downloads it.
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
import vllm_dcu_build as tool  # noqa: E402

pytestmark = pytest.mark.slow
VERSION_RE = re.compile(r"^0\.18\.1\+dcu\.(\d+)\.([0-9a-f]{8})$")


def copy_repo(dst: Path) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy2(REPO / "build.sh", dst / "build.sh")
    for d in ("tools", "vendor", "patches", "kernels", "dcu"):
        shutil.copytree(REPO / d, dst / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dst


def build(repo: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(env or {})
    e["PYTHON"] = sys.executable
    return subprocess.run(["bash", str(repo / "build.sh"), *args], cwd=repo, env=e, capture_output=True, text=True)


def series_names(repo: Path) -> list[str]:
    return [l.split("#", 1)[0].strip() for l in (repo / "patches" / "series").read_text().splitlines()
            if l.split("#", 1)[0].strip()]


def wheel_patchset(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as zf:
        return json.loads(zf.read("vllm/dcu_patchset.json"))


def assert_one_error_line(p: subprocess.CompletedProcess, *needles: str) -> str:
    assert p.returncode != 0, p.stdout
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def dist_snapshot(repo: Path) -> list[tuple[str, int]]:
    d = repo / "dist"
    return sorted((str(p.relative_to(d)), p.stat().st_size) for p in d.rglob("*")) if d.exists() else []


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    repo = copy_repo(tmp_path_factory.mktemp("built"))
    p = build(repo)
    assert p.returncode == 0, p.stderr
    wheels = sorted((repo / "dist").glob("vllm-*.whl"))
    assert len(wheels) == 1
    return repo, wheels[0], p.stdout


@pytest.fixture
def bad_repo(tmp_path):
    """A repo copy whose dist/ already holds a wheel, to check that failures leave dist/ alone."""
    repo = copy_repo(tmp_path / "repo")
    (repo / "dist").mkdir()
    (repo / "dist" / "vllm-0.18.1+dcu.9.deadbeef-cp38-abi3-manylinux_2_31_x86_64.whl").write_bytes(b"previous")
    return repo


# ------------------------------------------------------------------------------------------ the main build

def test_build_writes_wheel_with_series_version_and_patchset(built):
    repo, wheel, out = built
    names = series_names(repo)
    rec = wheel_patchset(wheel)
    m = VERSION_RE.match(rec["version"])
    assert m and int(m.group(1)) == len(names)
    assert wheel.name.startswith(f"vllm-{rec['version']}-cp38-abi3-manylinux_2_31_x86_64")
    assert [p["name"] for p in rec["patches"]] == names
    for p in rec["patches"]:
        assert p["sha256"] == tool.hashlib.sha256((repo / "patches" / p["name"]).read_bytes()).hexdigest()
    pins = json.loads(next((repo / "vendor").glob("vllm-*.json")).read_text())
    assert rec["base"] == {"name": pins["wheel"]["file"], "version": "0.18.1", "sha256": pins["wheel"]["sha256"]}
    # one progress line per step
    for step in ("fetch", "verify", "unpack", "apply", "kernels", "stamp", "pack"):
        assert re.search(rf"^{step}\s", out, re.M), out


def test_wheel_is_complete_and_record_matches(built):
    _, wheel, _ = built
    with zipfile.ZipFile(wheel) as zf:
        assert zf.testzip() is None
        names = set(zf.namelist())
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        version = wheel_patchset(wheel)["version"]
        assert dist_info == f"vllm-{version}.dist-info"
        assert f"Version: {version}" in zf.read(f"{dist_info}/METADATA").decode()
        assert "vllm/_C.abi3.so" in names and "vllm/dcu_kernels/__init__.py" in names
        assert "vllm/dcu/__init__.py" in names
        rows = list(csv.reader(io.StringIO(zf.read(f"{dist_info}/RECORD").decode())))
        record = {r[0]: r for r in rows if r}
        assert set(record) == names
        for n in ("vllm/_version.py", "vllm/dcu_patchset.json", "vllm/v1/engine/core.py", "vllm/_C.abi3.so"):
            data = zf.read(n)
            assert record[n] == [n, tool._record_hash(data), str(len(data))]
        assert f"__version__ = version = {version!r}" in zf.read("vllm/_version.py").decode()


def test_wheel_installs_into_fresh_venv_and_reports_version_and_patchset(built, tmp_path):
    _, wheel, _ = built
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    # torch and vLLM's other dependencies come from the test environment (the wheel is installed --no-deps)
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    parent = [p for p in sys.path if p.endswith("site-packages")]
    Path(site, "test_parent_env.pth").write_text("\n".join(parent) + "\n")
    p = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import vllm, json; print(vllm.__version__); print(vllm.__file__)"
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    version, location = out.stdout.split()[-2:]
    assert version == wheel_patchset(wheel)["version"] and location.startswith(str(venv))
    rep = subprocess.run([str(py), "-m", "vllm.dcu_patchset", "--json"], capture_output=True, text=True, env=env,
                         cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    assert json.loads(rep.stdout) == wheel_patchset(wheel)


def test_rebuild_is_idempotent_and_keeps_one_wheel(built):
    repo, wheel, _ = built
    p = build(repo)
    assert p.returncode == 0, p.stderr
    assert sorted((repo / "dist").glob("vllm-*.whl")) == [wheel]
    assert not list((repo / "dist").glob(".*partial"))


def test_ablation_builds_baseline_and_every_prefix_with_distinct_versions(built):
    repo, _, _ = built
    p = build(repo, "--ablation")
    assert p.returncode == 0, p.stderr
    abl = repo / "dist" / "ablation"
    wheels = sorted(abl.glob("vllm-*.whl"))
    names = series_names(repo)
    assert len(wheels) == len(names) + 1
    recs = sorted((wheel_patchset(w) for w in wheels), key=lambda r: len(r["patches"]))
    assert [[p["name"] for p in r["patches"]] for r in recs] == [names[:k] for k in range(len(names) + 1)]
    assert len({r["version"] for r in recs}) == len(recs)
    assert json.loads((abl / "ablation.json").read_text())[0]["patches"] == []


def test_upto_and_without_select_patches(built, tmp_path):
    repo, _, _ = built
    names = series_names(repo)
    out = tmp_path / "d"
    p = build(repo, "--upto", names[0][:4], "--dist", str(out))
    assert p.returncode == 0, p.stderr
    rec = wheel_patchset(next(out.glob("*.whl")))
    assert [x["name"] for x in rec["patches"]] == names[:1]
    if len(names) > 1:
        out2 = tmp_path / "d2"
        p = build(repo, "--without", names[0][:4], "--dist", str(out2))
        assert p.returncode == 0, p.stderr
        assert [x["name"] for x in wheel_patchset(next(out2.glob("*.whl")))["patches"]] == names[1:]


def test_every_patch_applies_alone_on_the_base(built):
    """Ablation promise: any subset builds, so each patch must apply on the bare base too."""
    repo, _, _ = built
    names = series_names(repo)
    for n in names:
        others = ",".join(x[:4] for x in names if x != n)
        p = build(repo, "--check", *(["--without", others] if others else []))
        assert p.returncode == 0 and f"check   {n}: applies" in p.stdout, p.stdout + p.stderr


def test_check_and_list_report_every_patch(built):
    repo, _, _ = built
    p = build(repo, "--check")
    assert p.returncode == 0, p.stderr
    for n in series_names(repo):
        assert f"check   {n}: applies" in p.stdout
    p = build(repo, "--list")
    assert p.returncode == 0, p.stderr
    for n in series_names(repo):
        assert re.search(rf"^{re.escape(n)}\s+applies$", p.stdout, re.M)


def test_series_applies_with_quilt_style_patch_no_fuzz(built, tmp_path):
    """`quilt push -a` runs `patch -p1` per series entry; every patch must apply that way with fuzz 0."""
    repo, _, _ = built
    tree = repo / "build" / "tree"
    base = tmp_path / "base"
    subprocess.run(["git", "-C", str(tree), "worktree", "add", "-q", "--detach", str(base), "dcu-base"], check=True)
    for name in series_names(repo):
        p = subprocess.run(["patch", "-p1", "--fuzz=0", "--no-backup-if-mismatch", "-i",
                            str(repo / "patches" / name)], cwd=base, capture_output=True, text=True)
        assert p.returncode == 0, f"{name}: {p.stdout}{p.stderr}"
        assert "fuzz" not in p.stdout.lower(), p.stdout


def test_edit_then_refresh_writes_commits_back_to_patches(built, tmp_path):
    repo = copy_repo(tmp_path / "r")
    assert build(repo, "--edit").returncode == 0
    tree = repo / "build" / "tree"
    first = series_names(repo)[0]
    before = (repo / "patches" / first).read_text()
    # amend the first patch: add a comment line to a file it creates
    rev = subprocess.run(["git", "-C", str(tree), "rev-list", "--reverse", "dcu-base..HEAD"], capture_output=True,
                         text=True, check=True).stdout.split()[0]
    changed = subprocess.run(["git", "-C", str(tree), "diff", "--name-only", f"{rev}^", rev], capture_output=True,
                             text=True, check=True).stdout.split()[0]
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t", GIT_SEQUENCE_EDITOR=f"sed -i '1s/^pick/edit/'")
    subprocess.run(["git", "-C", str(tree), "rebase", "-q", "-i", "dcu-base"], env=env, check=True,
                   capture_output=True)
    with open(tree / changed, "a") as f:
        f.write("# refreshed by test\n")
    subprocess.run(["git", "-C", str(tree), "commit", "-q", "-a", "--amend", "--no-edit"], env=env, check=True)
    subprocess.run(["git", "-C", str(tree), "rebase", "--continue"], env=env, check=True, capture_output=True)
    p = build(repo, "--refresh")
    assert p.returncode == 0, p.stderr
    after = (repo / "patches" / first).read_text()
    assert after != before and "+# refreshed by test" in after
    assert tool.parse_header(after)["Description"] == tool.parse_header(before)["Description"]
    assert series_names(repo) == series_names(REPO)
    assert build(repo, "--check").returncode == 0


def test_refresh_refuses_a_commit_that_carries_a_file_the_build_stamps(built, tmp_path):
    """A build run inside the edit tree stamps vllm/_version.py; `git commit -a --amend` then sweeps the stamp
    into the last patch. Refresh must stop with one clear line and leave patches/ as it was."""
    repo = copy_repo(tmp_path / "r")
    assert build(repo, "--edit").returncode == 0
    tree = repo / "build" / "tree"
    last = series_names(repo)[-1]
    before = (repo / "patches" / last).read_text()
    with open(tree / "vllm" / "_version.py", "a") as f:
        f.write("# stamped\n")
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    subprocess.run(["git", "-C", str(tree), "commit", "-q", "-a", "--amend", "--no-edit"], env=env, check=True)
    p = build(repo, "--refresh")
    assert p.returncode != 0
    err = [line for line in p.stderr.splitlines() if "error" in line.lower()]
    assert len(err) == 1 and "vllm/_version.py, which the build writes itself" in err[0], p.stderr
    assert (repo / "patches" / last).read_text() == before


def test_base_wheel_overlay_records_given_base(built, tmp_path):
    repo, _, _ = built
    base = next(tool.cache_dir().glob("vllm-0.18.1-*.whl"))
    other = tmp_path / base.name
    os.link(base, other) if base.stat().st_dev == tmp_path.stat().st_dev else shutil.copy(base, other)
    p = build(repo, "--base-wheel", str(other), "--dist", str(tmp_path / "o"))
    assert p.returncode == 0, p.stderr
    rec = wheel_patchset(next((tmp_path / "o").glob("*.whl")))
    assert rec["base"]["name"] == base.name and "not pinned" in p.stdout


def test_local_base_version_gets_dcu_suffix():
    assert tool.make_version("0.18.1+das.dtk2604", [], "0" * 64).startswith("0.18.1+das.dtk2604.dcu.0.")
    assert VERSION_RE.match(tool.make_version("0.18.1", [], "0" * 64))


# ------------------------------------------------------------------------------------------ bad input

def test_hash_mismatch_of_cached_base_fails_cleanly(bad_repo, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    pins = json.loads(next((bad_repo / "vendor").glob("vllm-*.json")).read_text())
    (cache / pins["wheel"]["file"]).write_bytes(b"not the wheel")
    before = dist_snapshot(bad_repo)
    p = build(bad_repo, env={"VLLM_DCU_CACHE": str(cache)})
    assert_one_error_line(p, "sha256 mismatch", pins["wheel"]["file"])
    assert dist_snapshot(bad_repo) == before


def test_series_entry_without_file_fails_cleanly(bad_repo):
    with open(bad_repo / "patches" / "series", "a") as f:
        f.write("0098-missing.patch\n")
    before = dist_snapshot(bad_repo)
    assert_one_error_line(build(bad_repo), "0098-missing.patch", "has no file")
    assert dist_snapshot(bad_repo) == before


def test_patch_file_not_in_series_fails_cleanly(bad_repo):
    shutil.copy(bad_repo / "patches" / series_names(bad_repo)[0], bad_repo / "patches" / "0097-stray.patch")
    assert_one_error_line(build(bad_repo), "0097-stray.patch", "not listed")


def test_patch_that_does_not_apply_names_patch_file_and_hunk(bad_repo):
    broken = """From: t <t@t>
Subject: broken on purpose

Description: context that is not in the base
Author: t
Forwarded: not-needed
Last-Update: 2026-11-30
---
diff --git a/vllm/config/cache.py b/vllm/config/cache.py
--- a/vllm/config/cache.py
+++ b/vllm/config/cache.py
@@ -14,3 +14,4 @@
 this line is not in cache.py
 nor this one
 nor this
+added
"""
    (bad_repo / "patches" / "0099-broken.patch").write_text(broken)
    with open(bad_repo / "patches" / "series", "a") as f:
        f.write("0099-broken.patch\n")
    before = dist_snapshot(bad_repo)
    assert_one_error_line(build(bad_repo), "patch 0099-broken.patch does not apply", "vllm/config/cache.py hunk 1",
                          "line 14")
    assert dist_snapshot(bad_repo) == before


@pytest.mark.parametrize("flag", ["--upto", "--without"])
def test_unknown_patch_id_fails_cleanly(bad_repo, flag):
    before = dist_snapshot(bad_repo)
    assert_one_error_line(build(bad_repo, flag, "0042"), "unknown patch id", "0042")
    assert dist_snapshot(bad_repo) == before


@pytest.mark.parametrize("kind", ["missing", "not-a-zip"])
def test_unreadable_base_wheel_fails_cleanly(bad_repo, tmp_path, kind):
    path = tmp_path / "vllm-x.whl"
    if kind == "not-a-zip":
        path.write_text("hello")
    before = dist_snapshot(bad_repo)
    assert_one_error_line(build(bad_repo, "--base-wheel", str(path)), str(path))
    assert dist_snapshot(bad_repo) == before


def test_no_network_fails_cleanly(bad_repo, tmp_path):
    env = {"VLLM_DCU_CACHE": str(tmp_path / "empty-cache"), "PIP_CONFIG_FILE": os.devnull,
           "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "",
           "PIP_RETRIES": "0", "PIP_TIMEOUT": "3", "PIP_NO_INDEX": ""}
    before = dist_snapshot(bad_repo)
    assert_one_error_line(build(bad_repo, env=env), "cannot download")
    assert dist_snapshot(bad_repo) == before
    assert not any((tmp_path / "empty-cache").glob("*.whl"))


def test_bad_arguments_exit_nonzero(bad_repo):
    p = build(bad_repo, "--ablation", "--upto", "0001")
    assert_one_error_line(p, "--ablation")
    p = build(bad_repo, "--no-such-flag")
    assert p.returncode == 2


def test_source_mode_applies_series_to_upstream_sdist_and_builds_its_wheel(tmp_path):
    """--source on the pinned upstream sdist (the stand-in for a vllm_cscc clone), VLLM_TARGET_DEVICE=empty."""
    repo = copy_repo(tmp_path / "r")
    pins = tool.Pins.load(repo)
    sdist = tool.fetch_sdist(pins)
    src = tmp_path / "src"
    subprocess.run(["tar", "-xzf", str(sdist), "-C", str(tmp_path)], check=True)
    (tmp_path / sdist.name[: -len(".tar.gz")]).rename(src)
    p = build(repo, "--source", str(src), "--dist", str(tmp_path / "out"), env={"VLLM_TARGET_DEVICE": "empty"})
    assert p.returncode == 0, p.stdout + p.stderr
    wheel = next((tmp_path / "out").glob("vllm-*.whl"))
    rec = wheel_patchset(wheel)
    assert VERSION_RE.match(rec["version"]) and [x["name"] for x in rec["patches"]] == series_names(repo)
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert "vllm/dcu_kernels/__init__.py" in names and "vllm/dcu_patchset.py" in names
        assert rec["version"] in zf.read("vllm/_version.py").decode()
    # the checkout itself is left untouched
    assert not (src / "vllm" / "dcu_patchset.py").exists()
