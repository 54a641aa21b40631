"""The build tool (tools/dcubuild) without the 413 MiB upstream base: its parts one by one (series and pins,
applying patches and naming what failed, packing wheels, installing our packages, versions), then every verb of
build.sh end to end on a synthetic repository (tests/build_helpers.py: a small vLLM-like base wheel and a
three-patch series). tests/test_build.py runs the real base and the real series.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from build_helpers import (
    REPO,
    SYNTHETIC_SERIES,
    WHEEL_NAME,
    assert_one_error_line,
    build,
    dist_snapshot,
    make_base_wheel,
    series_names,
    synthetic_repo,
    unified_diff,
    wheel_patchset,
    write_patch,
)

from tools.dcubuild import BuildError, fetch, series, stamp, tree, wheel
from tools.dcubuild.series import Pins

VERSION_RE = re.compile(r"^0\.18\.1\+dcu\.(\d+)\.([0-9a-f]{8})$")


# ------------------------------------------------------------------------------------------ series and pins

def _series_repo(tmp_path: Path, entries: str, files: dict[str, str] | None = None) -> Path:
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "series").write_text(entries)
    for name, text in (files or {}).items():
        (tmp_path / "patches" / name).write_text(text)
    return tmp_path


PATCH_TEXT = """From: a <a@b>
Subject: One idea

Description: Why, first line
 and a folded second line.
Author: a
Forwarded: no (a reason
 on two lines)
Last-Update: 2026-12-02
---
 x | 1 +
diff --git a/x b/x
"""


def test_series_keeps_order_skips_comments_and_reads_folded_dep3_fields(tmp_path):
    repo = _series_repo(tmp_path, "# 1. group\n0002-b.patch -p1  # why\n\n0001-a.patch\n",
                        {"0001-a.patch": PATCH_TEXT, "0002-b.patch": PATCH_TEXT})
    patches = series.load_series(repo)
    assert [p.name for p in patches] == ["0002-b.patch", "0001-a.patch"]
    p = patches[0]
    assert p.id == "0002" and p.subject == "One idea"
    assert p.header["Description"] == "Why, first line\nand a folded second line."
    assert p.header["Forwarded"] == "no (a reason\non two lines)"
    assert p.header_text() == PATCH_TEXT[: PATCH_TEXT.index("diff --git")]
    series.check_headers(patches)


@pytest.mark.parametrize("entries, files, message", [
    ("0001-a.patch\n", {}, "patches/series line 1: 0001-a.patch has no file patches/0001-a.patch"),
    ("0001-a.patch\n0001-a.patch\n", {"0001-a.patch": PATCH_TEXT}, "line 2: 0001-a.patch is listed twice"),
    ("1-a.patch\n", {"1-a.patch": PATCH_TEXT}, "1-a.patch is not named NNNN-name.patch"),
    ("0001-a.patch\n0001-b.patch\n", {"0001-a.patch": PATCH_TEXT, "0001-b.patch": PATCH_TEXT},
     "two patches share a number"),
    ("0001-a.patch\n", {"0001-a.patch": PATCH_TEXT, "0002-stray.patch": PATCH_TEXT},
     "patches/0002-stray.patch is not listed in patches/series"),
])
def test_series_errors_name_the_line_and_the_file(tmp_path, entries, files, message):
    with pytest.raises(BuildError, match=re.escape(message)):
        series.load_series(_series_repo(tmp_path, entries, files))


def test_a_header_without_a_required_dep3_field_is_refused(tmp_path):
    repo = _series_repo(tmp_path, "0001-a.patch\n", {"0001-a.patch": PATCH_TEXT.replace("Forwarded: no (a reason\n"
                                                                                      " on two lines)\n", "")})
    with pytest.raises(BuildError, match="0001-a.patch header lacks Forwarded"):
        series.check_headers(series.load_series(repo))


def test_upto_and_without_select_by_number_or_name(tmp_path):
    names = ["0001-a.patch", "0002-b.patch", "0004-d.patch"]
    repo = _series_repo(tmp_path, "\n".join(names), {n: PATCH_TEXT for n in names})
    patches = series.load_series(repo)
    pick = lambda upto, without: [p.id for p in series.select(patches, upto, without)]  # noqa: E731
    assert pick("0002", None) == ["0001", "0002"]
    assert pick("2", "1") == ["0002"]
    assert pick(None, "0002-b,4") == ["0001"]
    with pytest.raises(BuildError, match=r"unknown patch id '0003' \(series has: 0001, 0002, 0004\)"):
        series.select(patches, "0003", None)


def test_pins_need_exactly_one_well_formed_file(tmp_path):
    (tmp_path / "vendor").mkdir()
    with pytest.raises(BuildError, match="found 0"):
        Pins.load(tmp_path)
    (tmp_path / "vendor" / "vllm-0.18.1.json").write_text(json.dumps({"package": "vllm", "version": "0.18.1"}))
    with pytest.raises(BuildError, match="vendor/vllm-0.18.1.json is malformed: 'wheel'"):
        Pins.load(tmp_path)


def test_the_repositorys_pins_name_no_download_url():
    """The base and the sdist come through pip, from whatever index it is configured for."""
    text = next((REPO / "vendor").glob("vllm-*.json")).read_text()
    assert "://" not in text.replace(json.loads(text)["vllm_cscc"]["git"], "")
    pins = Pins.load(REPO)
    assert pins.sdist["file"] and len(pins.sdist["sha256"]) == 64


# ------------------------------------------------------------------------------------------ applying patches

@pytest.fixture
def base_tree(tmp_path):
    """An unpacked synthetic base (a git tree tagged dcu-base) and its wheel."""
    whl = make_base_wheel(tmp_path / WHEEL_NAME)
    t = tmp_path / "tree"
    tree.unpack(whl, t)
    return t, whl


def _patch(tmp_path: Path, name: str, diff: str) -> series.Patch:
    (tmp_path / name).write_text(PATCH_TEXT.split("---\n")[0] + "---\n" + diff)
    text = (tmp_path / name).read_text()
    return series.Patch(name, tmp_path / name, text, series.parse_header(text))


def test_unpack_leaves_compiled_members_in_the_wheel_and_tags_the_base(base_tree):
    t, _ = base_tree
    assert (t / "vllm" / "config" / "cache.py").is_file() and not (t / "vllm" / "_C.abi3.so").exists()
    assert tree.git(t, "tag").stdout.split() == ["dcu-base"]


def test_a_patch_that_does_not_apply_is_named_with_its_file_hunk_and_line(base_tree, tmp_path):
    t, _ = base_tree
    p = _patch(tmp_path, "0009-bad.patch", """diff --git a/vllm/config/cache.py b/vllm/config/cache.py
--- a/vllm/config/cache.py
+++ b/vllm/config/cache.py
@@ -1,4 +1,4 @@
 setting_0 = 0
 setting_1 = 1
-setting_2 = 2
+setting_2 = 20
 setting_3 = 3
@@ -29,3 +29,3 @@
 setting_28 = 28
-setting_29 = 290
+setting_29 = 29
 setting_30 = 30
""")
    with pytest.raises(BuildError, match=re.escape("patch 0009-bad.patch does not apply: vllm/config/cache.py "
                                                   "hunk 2 (line 29)")):
        tree.apply_patch(t, p)
    missing = _patch(tmp_path, "0010-missing.patch", unified_diff("vllm/nope.py", "a\n", "b\n"))
    with pytest.raises(BuildError, match="0010-missing.patch does not apply: vllm/nope.py: "):
        tree.apply_patch(t, missing)
    assert tree.git(t, "status", "--porcelain").stdout == ""  # nothing half-applied


def test_check_reports_each_patch_and_goes_on_after_a_failure(base_tree, tmp_path):
    t, whl = base_tree
    init = (t / "vllm" / "__init__.py").read_text()
    ok = _patch(tmp_path, "0001-ok.patch", unified_diff("vllm/__init__.py", init, init + "A = 1\n"))
    bad = _patch(tmp_path, "0002-bad.patch", unified_diff("vllm/nope.py", "a\n", "b\n"))
    ok2 = _patch(tmp_path, "0003-ok.patch", unified_diff("vllm/hello.py", None, "B = 2\n"))
    results = tree.check_series(whl, [ok, bad, ok2], tmp_path / "check")
    assert [(p.name, err is None) for p, err in results] == [("0001-ok.patch", True), ("0002-bad.patch", False),
                                                             ("0003-ok.patch", True)]


def test_applied_patches_are_commits_carrying_their_name_and_hash(base_tree, tmp_path):
    t, _ = base_tree
    p = _patch(tmp_path, "0001-new.patch", unified_diff("vllm/hello.py", None, "B = 2\n"))
    tree.apply_patch(t, p)
    msg = tree.git(t, "log", "-1", "--format=%B").stdout
    assert msg.startswith("One idea\n") and f"Patch-Name: 0001-new.patch\nPatch-Sha256: {p.sha256}" in msg


# ------------------------------------------------------------------------------------------ our packages

def test_installed_packages_leave_benchmarks_in_the_repository(tmp_path):
    sha = tree.install_packages(REPO, tmp_path)
    kernels = tmp_path / "vllm" / "dcu_kernels"
    assert (kernels / "gemv" / "gemv.py").is_file() and (tmp_path / "vllm" / "dcu" / "gemv.py").is_file()
    shipped = [p.name for p in kernels.rglob("*.py")]
    for script in ("bench.py", "bench_attention.py", "compile_check.py", "compile_tools.py", "numerics.py",
                   "results_io.py"):
        assert script not in shipped
    assert (REPO / "kernels" / "gemv" / "bench.py").is_file()  # still run from the repository
    for f in kernels.rglob("*.py"):  # what ships imports no benchmark module
        assert not re.search(r"import .*\b(bench\w*|compile_check|compile_tools|numerics|results_io)\b",
                             f.read_text()), f
    assert tree.install_packages(REPO, tmp_path / "again") == sha


# ------------------------------------------------------------------------------------------ wheels

def _packed(tmp_path: Path, version: str = "0.18.1+dcu.3.abcdef12") -> tuple[Path, Path]:
    base = make_base_wheel(tmp_path / WHEEL_NAME)
    t = tmp_path / "t"
    tree.unpack(base, t)
    (t / "vllm" / "hello.py").write_text("B = 2\n")
    stamp.stamp_version_file(t, version)
    with wheel.open_wheel(base) as zf:
        dist_info, _ = wheel.wheel_dist_info(zf)
    return base, wheel.pack_wheel(base, t, version, tmp_path / "dist", dist_info)


def _raw_member(path: Path, name: str) -> bytes:
    with zipfile.ZipFile(path) as zf, open(path, "rb") as f:
        info = zf.getinfo(name)
        f.seek(info.header_offset + 26)
        skip = int.from_bytes(f.read(2), "little") + int.from_bytes(f.read(2), "little")
        f.seek(skip, 1)
        return f.read(info.compress_size)


def test_packed_wheel_has_the_new_version_a_complete_record_and_the_bases_binary_bytes(tmp_path):
    base, out = _packed(tmp_path)
    assert out.name == "vllm-0.18.1+dcu.3.abcdef12-cp38-abi3-manylinux_2_31_x86_64.whl"
    assert oct(out.stat().st_mode & 0o777) == "0o644" and not list(out.parent.glob(".*partial"))
    dist = "vllm-0.18.1+dcu.3.abcdef12.dist-info"
    with zipfile.ZipFile(out) as zf:
        assert zf.testzip() is None
        names = set(zf.namelist())
        assert "vllm/hello.py" in names and f"{dist}/WHEEL" in names
        assert not any(n.startswith("vllm-0.18.1.dist-info/") for n in names)
        assert "Version: 0.18.1+dcu.3.abcdef12" in zf.read(f"{dist}/METADATA").decode()
        record = {r[0]: r for r in wheel.read_record(zf, f"{dist}/RECORD").values()}
        assert set(record) == names
        for n in names - {f"{dist}/RECORD"}:
            data = zf.read(n)
            assert record[n] == [n, wheel.record_hash(data), str(len(data))], n
    # the compiled member is the base's stored bytes, not a recompression
    assert _raw_member(out, "vllm/_C.abi3.so") == _raw_member(base, "vllm/_C.abi3.so")


def test_a_failed_pack_leaves_no_file_in_dist(tmp_path, monkeypatch):
    def broken(dst, rel, data, records=None):
        raise BuildError("disk full")
    monkeypatch.setattr(wheel, "write_member", broken)
    with pytest.raises(BuildError, match="disk full"):
        _packed(tmp_path)
    assert list((tmp_path / "dist").iterdir()) == []


def test_files_added_to_a_built_wheel_get_record_rows(tmp_path):
    base = make_base_wheel(tmp_path / WHEEL_NAME)
    out = tmp_path / "out.whl"
    wheel.add_files_to_wheel(base, {"vllm/dcu_patchset.json": b"{}\n"}, out)
    with zipfile.ZipFile(out) as zf:
        assert zf.testzip() is None and zf.read("vllm/dcu_patchset.json") == b"{}\n"
        record = wheel.read_record(zf, "vllm-0.18.1.dist-info/RECORD")
        assert set(record) == set(zf.namelist())
        assert record["vllm/dcu_patchset.json"][1] == wheel.record_hash(b"{}\n")
    assert _raw_member(out, "vllm/_C.abi3.so") == _raw_member(base, "vllm/_C.abi3.so")


@pytest.mark.parametrize("content, message", [(b"hello", "cannot read wheel"), (None, "is not a wheel")])
def test_a_file_that_is_not_a_wheel_is_refused(tmp_path, content, message):
    path = tmp_path / "x.whl"
    if content is None:
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("a.txt", "a")
    else:
        path.write_bytes(content)
    with pytest.raises(BuildError, match=message):
        wheel.open_wheel(path)


# ------------------------------------------------------------------------------------------ version and record

def test_version_names_the_series_and_changes_with_any_input(tmp_path):
    names = ["0001-a.patch", "0002-b.patch"]
    repo = _series_repo(tmp_path, "\n".join(names), {n: PATCH_TEXT + n for n in names})
    p = series.load_series(repo)
    v = stamp.make_version("0.18.1", p, "k" * 64)
    assert VERSION_RE.match(v) and v.startswith("0.18.1+dcu.2.")
    assert v == stamp.make_version("0.18.1", p, "k" * 64)  # a rebuild of the same inputs has the same version
    others = {stamp.make_version("0.18.1", p[:1], "k" * 64), stamp.make_version("0.18.1", p, "j" * 64),
              stamp.make_version("0.18.1", p[::-1], "k" * 64), v}
    assert len(others) == 4
    assert stamp.make_version("0.18.1+das.dtk2604", [], "0" * 64).startswith("0.18.1+das.dtk2604.dcu.0.")


def test_version_file_is_stamped_in_place(tmp_path):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "_version.py").write_text("# x\n__version__ = version = '0.18.1'\n"
                                                   "__version_tuple__ = version_tuple = (0, 18, 1)\n")
    stamp.stamp_version_file(tmp_path, "0.18.1+dcu.2.abcdef12")
    assert (tmp_path / "vllm" / "_version.py").read_text() == (
        "# x\n__version__ = version = '0.18.1+dcu.2.abcdef12'\n"
        "__version_tuple__ = version_tuple = (0, 18, 1, 'dcu.2.abcdef12')\n")


# ------------------------------------------------------------------------------------------ fetch

def test_a_cached_base_with_the_wrong_hash_is_refused_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_DCU_CACHE", str(tmp_path))
    pins = Pins.load(REPO)
    (tmp_path / pins.wheel_file).write_bytes(b"not the wheel")
    with pytest.raises(BuildError, match=f"sha256 mismatch for cached {re.escape(str(tmp_path / pins.wheel_file))}"):
        fetch.fetch_base(pins)


# ------------------------------------------------------------------------------------------ build.sh, every verb

@pytest.fixture
def synth(tmp_path):
    return synthetic_repo(tmp_path)


def test_build_runs_every_step_and_writes_one_wheel_with_its_record(synth):
    repo, env = synth
    p = build(repo, env=env)
    assert p.returncode == 0, p.stderr
    for step in ("fetch", "verify", "unpack", "apply", "kernels", "stamp", "pack"):
        assert re.search(rf"^{step}\s", p.stdout, re.M), p.stdout
    wheels = sorted((repo / "dist").glob("vllm-*.whl"))
    assert len(wheels) == 1
    rec = wheel_patchset(wheels[0])
    assert VERSION_RE.match(rec["version"]) and [x["name"] for x in rec["patches"]] == list(SYNTHETIC_SERIES)
    assert rec["base"]["name"] == WHEEL_NAME and rec["kernels"]["packages"] == ["vllm.dcu_kernels", "vllm.dcu"]
    with zipfile.ZipFile(wheels[0]) as zf:
        assert zf.read("vllm/__init__.py").decode().endswith("DCU = True\n")
        assert "vllm/dcu/patchset.py" in zf.namelist() and "vllm/dcu_kernels/gemv/bench.py" not in zf.namelist()
    # the same inputs again: the same wheel, still one in dist/
    assert build(repo, env=env).returncode == 0
    assert sorted((repo / "dist").glob("vllm-*.whl")) == wheels and not list((repo / "dist").glob(".*partial"))
    # a subset replaces it (`pip install dist/*.whl` must see one wheel)
    p = build(repo, "--upto", "0001", env=env)
    assert p.returncode == 0 and "clean   removed older" in p.stdout, p.stderr
    (only,) = (repo / "dist").glob("vllm-*.whl")
    assert [x["name"] for x in wheel_patchset(only)["patches"]] == ["0001-new-module.patch"]
    out = repo / "d2"
    assert build(repo, "--without", "0001,0003", "--dist", str(out), env=env).returncode == 0
    assert [x["name"] for x in wheel_patchset(next(out.glob("*.whl")))["patches"]] == ["0002-edit-cache.patch"]


def test_ablation_builds_the_baseline_and_every_prefix_with_distinct_versions(synth):
    repo, env = synth
    p = build(repo, "--ablation", env=env)
    assert p.returncode == 0, p.stderr
    abl = repo / "dist" / "ablation"
    recs = sorted((wheel_patchset(w) for w in abl.glob("vllm-*.whl")), key=lambda r: len(r["patches"]))
    names = list(SYNTHETIC_SERIES)
    assert [[x["name"] for x in r["patches"]] for r in recs] == [names[:k] for k in range(len(names) + 1)]
    assert len({r["version"] for r in recs}) == len(recs)
    assert [a["patches"] for a in json.loads((abl / "ablation.json").read_text())] == [names[:k] for k in range(4)]
    assert_one_error_line(build(repo, "--ablation", "--upto", "0001", env=env), "--ablation")


def test_check_and_list_report_every_patch(synth):
    repo, env = synth
    p = build(repo, "--check", env=env)
    assert p.returncode == 0, p.stderr
    assert [l for l in p.stdout.splitlines() if l.startswith("check   0")] == [
        f"check   {n}: applies" for n in SYNTHETIC_SERIES]
    assert "all 3 patches apply" in p.stdout
    p = build(repo, "--list", env=env)
    for n, (subject, _) in SYNTHETIC_SERIES.items():
        assert re.search(rf"^{re.escape(n)}\s+applies\n    {subject}$", p.stdout, re.M), p.stdout
    write_patch(repo, "0004-stale.patch", "Stale", unified_diff("vllm/nope.py", "a\n", "b\n"))
    with open(repo / "patches" / "series", "a") as f:
        f.write("0004-stale.patch\n")
    p = build(repo, "--check", env=env)
    assert "check   0004-stale.patch: FAILS: vllm/nope.py: " in p.stdout
    assert_one_error_line(p, "1 of 4 patches do not apply", "0004-stale.patch")


def _git_env() -> dict:
    return dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                GIT_COMMITTER_EMAIL="t@t")


def test_edit_then_refresh_writes_the_amended_commit_back_and_keeps_the_header(synth):
    repo, env = synth
    assert build(repo, "--edit", env=env).returncode == 0
    assert build(repo, "--refresh", env=env).returncode == 0  # the synthetic patches in git's own diff format
    t = repo / "build" / "tree"
    before = (repo / "patches" / "0002-edit-cache.patch").read_text()
    genv = dict(_git_env(), GIT_SEQUENCE_EDITOR="sed -i '2s/^pick/edit/'")
    subprocess.run(["git", "-C", str(t), "rebase", "-q", "-i", "dcu-base"], env=genv, check=True, capture_output=True)
    with open(t / "vllm" / "config" / "cache.py", "a") as f:
        f.write("# refreshed by test\n")
    subprocess.run(["git", "-C", str(t), "commit", "-q", "-a", "--amend", "--no-edit"], env=genv, check=True)
    subprocess.run(["git", "-C", str(t), "rebase", "--continue"], env=genv, check=True, capture_output=True)
    p = build(repo, "--refresh", env=env)
    assert p.returncode == 0 and p.stdout.strip() == "refresh patches/0002-edit-cache.patch", p.stdout + p.stderr
    after = (repo / "patches" / "0002-edit-cache.patch").read_text()
    assert "+# refreshed by test" in after
    hb, ha = series.parse_header(before), series.parse_header(after)
    assert ha["Description"] == hb["Description"] and ha["Last-Update"] != "2026-11-30"
    assert series_names(repo) == list(SYNTHETIC_SERIES) and "# synthetic series" in (
        repo / "patches" / "series").read_text()
    assert build(repo, "--check", env=env).returncode == 0


def test_refresh_writes_a_new_commit_as_a_patch_with_a_header_skeleton(synth):
    repo, env = synth
    assert build(repo, "--edit", env=env).returncode == 0
    t = repo / "build" / "tree"
    (t / "vllm" / "new.py").write_text("C = 3\n")
    subprocess.run(["git", "-C", str(t), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(t), "commit", "-q", "-m", "Add C\n\nPatch-Name: 0004-add-c.patch"],
                   env=_git_env(), check=True)
    assert build(repo, "--refresh", env=env).returncode == 0
    h = series.parse_header((repo / "patches" / "0004-add-c.patch").read_text())
    assert h["Subject"] == h["Description"] == "Add C" and set(series.REQUIRED_HEADER_FIELDS) <= set(h)
    assert series_names(repo) == [*SYNTHETIC_SERIES, "0004-add-c.patch"]


SERIES_WITH_GROUPS = "# head\n\n# 0. a\n0001-a.patch\n# 1. b\n0002-b.patch\n# 2. c\n0003-c.patch\n"


@pytest.mark.parametrize("order,expected", [
    # a new last patch lands under the last entry, every comment where it was
    (["0001-a.patch", "0002-b.patch", "0003-c.patch", "0004-d.patch"],
     "# head\n\n# 0. a\n0001-a.patch\n# 1. b\n0002-b.patch\n# 2. c\n0003-c.patch\n0004-d.patch\n"),
    # a new patch between two: right after the one before it in commit order
    (["0001-a.patch", "0001x-new.patch", "0002-b.patch", "0003-c.patch"],
     "# head\n\n# 0. a\n0001-a.patch\n0001x-new.patch\n# 1. b\n0002-b.patch\n# 2. c\n0003-c.patch\n"),
    # a new first patch: before the first entry; a dropped one: its line goes
    (["0000-z.patch", "0001-a.patch", "0003-c.patch"],
     "# head\n\n# 0. a\n0000-z.patch\n0001-a.patch\n# 1. b\n# 2. c\n0003-c.patch\n"),
    # same count, reordered: each entry line takes the name at its position
    (["0002-b.patch", "0001-a.patch", "0003-c.patch"],
     "# head\n\n# 0. a\n0002-b.patch\n# 1. b\n0001-a.patch\n# 2. c\n0003-c.patch\n"),
    # reordered and grown: entries to the end, comments kept
    (["0002-b.patch", "0001-a.patch", "0003-c.patch", "0004-d.patch"],
     "# head\n\n# 0. a\n# 1. b\n# 2. c\n0002-b.patch\n0001-a.patch\n0003-c.patch\n0004-d.patch\n"),
])
def test_refresh_keeps_the_series_comments_beside_their_entries(order, expected):
    from tools.dcubuild.edit import series_in_commit_order

    assert series_in_commit_order(SERIES_WITH_GROUPS, order) == expected


def test_refresh_refuses_a_commit_that_carries_a_file_the_build_stamps(synth):
    """A build run inside the edit tree stamps vllm/_version.py; `git commit -a --amend` then sweeps the stamp
    into the last patch. Refresh must stop with one clear line and leave patches/ as it was."""
    repo, env = synth
    assert build(repo, "--edit", env=env).returncode == 0
    t = repo / "build" / "tree"
    before = {f.name: f.read_text() for f in (repo / "patches").iterdir()}
    with open(t / "vllm" / "_version.py", "a") as f:
        f.write("# stamped\n")
    subprocess.run(["git", "-C", str(t), "commit", "-q", "-a", "--amend", "--no-edit"], env=_git_env(), check=True)
    p = build(repo, "--refresh", env=env)
    assert_one_error_line(p, "vllm/_version.py, which the build writes itself")
    assert {f.name: f.read_text() for f in (repo / "patches").iterdir()} == before
    subprocess.run(["git", "-C", str(t), "commit", "-q", "--amend", "-m", "no trailer"], env=_git_env(), check=True)
    assert_one_error_line(build(repo, "--refresh", env=env), "has no 'Patch-Name: NNNN-name.patch' trailer")


def test_base_wheel_overlay_records_the_given_base_and_extends_its_local_version(synth, tmp_path):
    repo, env = synth
    other = make_base_wheel(tmp_path / "vllm-0.18.1+das.dtk2604-cp38-abi3-manylinux_2_31_x86_64.whl",
                            version="0.18.1+das.dtk2604")
    p = build(repo, "--base-wheel", str(other), "--dist", str(tmp_path / "o"), env=env)
    assert p.returncode == 0, p.stderr
    assert "not pinned" in p.stdout
    rec = wheel_patchset(next((tmp_path / "o").glob("*.whl")))
    assert rec["base"]["name"] == other.name and rec["version"].startswith("0.18.1+das.dtk2604.dcu.3.")


def test_tree_verb_installs_the_packages_and_records_the_series_without_a_wheel(synth):
    repo, env = synth
    p = build(repo, "--tree", "--tree-dir", str(repo / "tt"), env=env)
    assert p.returncode == 0, p.stderr
    rec = json.loads((repo / "tt" / "vllm" / "dcu_patchset.json").read_text())
    assert [x["name"] for x in rec["patches"]] == list(SYNTHETIC_SERIES)
    assert (repo / "tt" / "vllm" / "dcu" / "__init__.py").is_file() and not (repo / "dist").exists()


# ------------------------------------------------------------------------------------------ bad input

@pytest.fixture
def bad_repo(synth):
    """The synthetic repo with a wheel already in dist/, to check that failures leave dist/ alone."""
    repo, env = synth
    (repo / "dist").mkdir()
    (repo / "dist" / "vllm-0.18.1+dcu.9.deadbeef-cp38-abi3-manylinux_2_31_x86_64.whl").write_bytes(b"previous")
    return repo, env


def _fails_cleanly(repo: Path, env: dict, args: tuple = (), *needles: str) -> None:
    before = dist_snapshot(repo)
    assert_one_error_line(build(repo, *args, env=env), *needles)
    assert dist_snapshot(repo) == before


def test_hash_mismatch_of_the_cached_base_fails_cleanly(bad_repo):
    repo, env = bad_repo
    (Path(env["VLLM_DCU_CACHE"]) / WHEEL_NAME).write_bytes(b"not the wheel")
    _fails_cleanly(repo, env, (), "sha256 mismatch", WHEEL_NAME)


def test_series_entry_without_file_and_stray_patch_file_fail_cleanly(bad_repo):
    repo, env = bad_repo
    shutil.copy(repo / "patches" / "0001-new-module.patch", repo / "patches" / "0097-stray.patch")
    _fails_cleanly(repo, env, (), "0097-stray.patch", "not listed")
    with open(repo / "patches" / "series", "a") as f:
        f.write("0097-stray.patch\n0098-missing.patch\n")
    _fails_cleanly(repo, env, (), "0098-missing.patch", "has no file")


def test_patch_that_does_not_apply_names_patch_file_and_hunk(bad_repo):
    repo, env = bad_repo
    write_patch(repo, "0099-broken.patch", "broken on purpose", """\
diff --git a/vllm/config/cache.py b/vllm/config/cache.py
--- a/vllm/config/cache.py
+++ b/vllm/config/cache.py
@@ -14,3 +14,4 @@
 this line is not in cache.py
 nor this one
 nor this
+added
""")
    with open(repo / "patches" / "series", "a") as f:
        f.write("0099-broken.patch\n")
    _fails_cleanly(repo, env, (), "patch 0099-broken.patch does not apply", "vllm/config/cache.py hunk 1", "line 14")


@pytest.mark.parametrize("flag", ["--upto", "--without"])
def test_unknown_patch_id_fails_cleanly(bad_repo, flag):
    _fails_cleanly(*bad_repo, (flag, "0042"), "unknown patch id", "0042")


@pytest.mark.parametrize("kind", ["missing", "not-a-zip"])
def test_unreadable_base_wheel_fails_cleanly(bad_repo, tmp_path, kind):
    path = tmp_path / "vllm-x.whl"
    if kind == "not-a-zip":
        path.write_text("hello")
    _fails_cleanly(*bad_repo, ("--base-wheel", str(path)), str(path))


def test_no_network_fails_cleanly(bad_repo, tmp_path):
    repo, env = bad_repo
    env = dict(env, VLLM_DCU_CACHE=str(tmp_path / "empty-cache"), PIP_CONFIG_FILE=os.devnull,
               PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_EXTRA_INDEX_URL="", PIP_FIND_LINKS="", PIP_RETRIES="0",
               PIP_TIMEOUT="3", PIP_NO_INDEX="")
    _fails_cleanly(repo, env, (), "cannot download")
    assert not any((tmp_path / "empty-cache").iterdir())


def test_bad_arguments_exit_with_status_2(bad_repo):
    repo, env = bad_repo
    assert build(repo, "--no-such-flag", env=env).returncode == 2


# ------------------------------------------------------------------------------------------ the tests' tree, --source

def test_the_tests_tree_is_built_once_and_again_only_when_an_input_changes(synth, monkeypatch):
    from tools.dcubuild import testtree

    repo, env = synth
    monkeypatch.setenv("VLLM_DCU_CACHE", env["VLLM_DCU_CACHE"])
    t = repo / "build" / "test-tree"
    assert testtree.prepared_tree(t, repo) == t and testtree.is_current(t, repo)
    marker = t / "vllm" / "marker"
    marker.write_text("kept while nothing changed")
    testtree.prepared_tree(t, repo)
    assert marker.exists()
    with open(repo / "dcu" / "__init__.py", "a") as f:
        f.write("# changed\n")
    assert not testtree.is_current(t, repo)
    testtree.prepared_tree(t, repo)
    assert not marker.exists() and testtree.is_current(t, repo)
    assert (t / "vllm" / "dcu" / "__init__.py").read_text().endswith("# changed\n")
    write_patch(repo, "0004-stale.patch", "Stale", unified_diff("vllm/nope.py", "a\n", "b\n"))
    with open(repo / "patches" / "series", "a") as f:
        f.write("0004-stale.patch\n")
    with pytest.raises(BuildError, match="could not prepare the patched vLLM tree"):
        testtree.prepared_tree(t, repo)


def test_source_version_comes_from_the_environment_or_pkg_info(tmp_path, monkeypatch):
    from tools.dcubuild import source

    monkeypatch.delenv("VLLM_DCU_SOURCE_VERSION", raising=False)
    with pytest.raises(BuildError, match="set VLLM_DCU_SOURCE_VERSION"):
        source.source_version(tmp_path)
    (tmp_path / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.18.1\n")
    assert source.source_version(tmp_path) == "0.18.1"
    monkeypatch.setenv("VLLM_DCU_SOURCE_VERSION", "0.18.1+das.dtk2604")
    assert source.source_version(tmp_path) == "0.18.1+das.dtk2604"


def test_source_mode_refuses_a_folder_that_is_not_a_vllm_checkout(synth, tmp_path):
    repo, env = synth
    _fails_cleanly(repo, env, ("--source", str(tmp_path)), "not a vLLM source checkout")
