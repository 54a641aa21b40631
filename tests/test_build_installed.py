"""build.sh --base-installed on a synthetic installed vLLM (tests/build_helpers.py's small base wheel unpacked into
a folder as pip would, found through PYTHONPATH): the overlay equals --base-wheel's on the same wheel, files
edited after install are used and reported, a patch that no longer applies is named with its file and hunk, and
every installation the build cannot use gives one error line. The real 413 MiB wheel installed with pip into a
venv is tests/test_build_cscc.py's.
"""
from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from build_helpers import assert_one_error_line, build, dist_snapshot, make_base_wheel, synthetic_repo, wheel_patchset

DAS = "0.18.1+das.dtk2604"


@pytest.fixture
def synth(tmp_path):
    return synthetic_repo(tmp_path)


def install(wheel: Path, site: Path) -> Path:
    """What pip does with a wheel, minus the scripts: its members under site/ (RECORD included) + INSTALLER."""
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
        dist_info = next(n.split("/")[0] for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
    (site / dist_info / "INSTALLER").write_text("pip\n")
    return site


def installed(tmp_path: Path, version: str = DAS) -> Path:
    whl = make_base_wheel(tmp_path / f"vllm-{version}-cp38-abi3-manylinux_2_31_x86_64.whl", version=version)
    return install(whl, tmp_path / f"site-{version}")


def members(whl: Path, skip: tuple = ()) -> dict[str, bytes]:
    with zipfile.ZipFile(whl) as zf:
        return {n: zf.read(n) for n in zf.namelist() if not n.endswith(skip)}


def test_installed_overlay_matches_the_base_wheel_overlay_and_is_reused(synth, tmp_path):
    repo, env = synth
    site = installed(tmp_path)
    p = build(repo, "--base-installed", "--dist", str(tmp_path / "a"), env=dict(env, PYTHONPATH=str(site)))
    assert p.returncode == 0, p.stderr
    assert f"installed vllm {DAS} in {site.resolve()}" in p.stdout and "edited" not in p.stdout, p.stdout
    got = next((tmp_path / "a").glob("*.whl"))
    rec = wheel_patchset(got)
    assert rec["version"].startswith(DAS + ".dcu.3.") and got.name == f"vllm-{rec['version']}-cp38-abi3-manylinux_2_31_x86_64.whl"
    assert rec["base"]["version"] == DAS
    # the same overlay as --base-wheel on the wheel that was installed (but for the record of the base)
    q = build(repo, "--base-wheel", str(tmp_path / f"vllm-{DAS}-cp38-abi3-manylinux_2_31_x86_64.whl"),
              "--dist", str(tmp_path / "b"), env=env)
    assert q.returncode == 0, q.stderr
    want = next((tmp_path / "b").glob("*.whl"))
    assert want.name == got.name
    skip = ("dcu_patchset.json", "RECORD")
    assert members(got, skip) == members(want, skip)
    with zipfile.ZipFile(got) as zf:
        assert zf.read("vllm/_C.abi3.so") == (site / "vllm" / "_C.abi3.so").read_bytes()
        assert not [n for n in zf.namelist() if "INSTALLER" in n]
    # a second build reuses the base wheel written from the installed files
    r = build(repo, "--base-installed", "--dist", str(tmp_path / "a"), env=dict(env, PYTHONPATH=str(site)))
    assert r.returncode == 0 and "unchanged since" in r.stdout, r.stdout + r.stderr
    assert next((tmp_path / "a").glob("*.whl")).read_bytes() == got.read_bytes()


def test_plain_0181_install_gets_the_plain_dcu_version(synth, tmp_path):
    repo, env = synth
    site = installed(tmp_path, "0.18.1")
    p = build(repo, "--base-installed", "--dist", str(tmp_path / "o"), env=dict(env, PYTHONPATH=str(site)))
    assert p.returncode == 0, p.stderr
    assert wheel_patchset(next((tmp_path / "o").glob("*.whl")))["version"].startswith("0.18.1+dcu.3.")


def test_files_edited_after_install_are_used_reported_and_checked(synth, tmp_path):
    """The installed files are the base (a wheel edited in place runs as edited): an edit under a hunk of the
    series is reported by --check with the patch, the file and the hunk."""
    repo, env = synth
    site = installed(tmp_path)
    cache = site / "vllm" / "config" / "cache.py"
    cache.write_text(cache.read_text().replace("setting_30 = 30\n", "setting_30 = 31  # edited in place\n"))
    (site / "vllm" / "_rocm_C.abi3.so").write_bytes(b"dropped in by hand")  # not the distribution's: left out
    env = dict(env, PYTHONPATH=str(site))
    p = build(repo, "--check", "--base-installed", env=env)
    assert "1 edited after install: vllm/config/cache.py" in p.stdout, p.stdout
    assert "note    1 file under" in p.stdout and "not in vllm's RECORD, left out: vllm/_rocm_C.abi3.so" in p.stdout
    assert "check   0001-new-module.patch: applies" in p.stdout
    assert_one_error_line(p, "1 of 3 patches do not apply", "0002-edit-cache.patch")
    assert "0002-edit-cache.patch: FAILS: vllm/config/cache.py hunk 1 (line 28)" in p.stdout, p.stdout
    # without 0002 the overlay carries the edit
    q = build(repo, "--base-installed", "--without", "0002", "--dist", str(tmp_path / "o"), env=env)
    assert q.returncode == 0, q.stderr
    with zipfile.ZipFile(next((tmp_path / "o").glob("*.whl"))) as zf:
        assert b"setting_30 = 31  # edited in place" in zf.read("vllm/config/cache.py")
        assert "vllm/_rocm_C.abi3.so" not in zf.namelist()


def _record_without(site: Path, name: str) -> None:
    rec = next(site.glob("*.dist-info/RECORD"))
    rec.write_text("".join(l for l in rec.read_text().splitlines(True) if not l.startswith(name + ",")))


@pytest.mark.parametrize("case, needle", [
    ("none", "no vllm distribution is installed"),
    ("0.19.0", "the installed vllm is 0.19.0, not 0.18.1"),
    ("0.18.1+dcu.3.0123abcd", "is already a vllm-dcu build"),
    ("0.18.1+das.dtk2604.dcu.9.0123abcd", "is already a vllm-dcu build"),
    ("missing", "files of vllm's RECORD are missing"),
    ("editable", "lists no vllm/__init__.py"),
    ("no-record", "has no RECORD"),
])
def test_unusable_installations_fail_with_one_line(synth, tmp_path, case, needle):
    repo, env = synth
    (repo / "dist").mkdir()
    (repo / "dist" / "vllm-0.18.1+dcu.9.deadbeef-cp38-abi3-manylinux_2_31_x86_64.whl").write_bytes(b"previous")
    before = dist_snapshot(repo)
    if case == "none":
        site = tmp_path / "empty-site"
        site.mkdir()
    else:
        site = installed(tmp_path, case if case[0].isdigit() else DAS)
    if case == "missing":
        (site / "vllm" / "config" / "cache.py").unlink()
    elif case == "editable":
        _record_without(site, "vllm/__init__.py")
    elif case == "no-record":
        next(site.glob("*.dist-info/RECORD")).unlink()
    p = build(repo, "--base-installed", env=dict(env, PYTHONPATH=str(site)))
    assert_one_error_line(p, "--base-installed: ", needle)
    assert dist_snapshot(repo) == before
