"""The build's verbs on a resolved base: build a wheel, an ablation, a check of the series, a bare tree."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .common import BuildError, log, sha256_file, shown
from .fetch import fetch_base
from .installed import installed_base_wheel
from .series import Patch, Pins
from .stamp import make_version, patchset_record, stamp_version_file, write_patchset_json
from .tree import PACKAGES, apply_series, check_series, install_packages
from .wheel import open_wheel, pack_wheel, wheel_dist_info


@dataclass
class Base:
    wheel: Path
    sha256: str
    version: str
    dist_info: str


def resolve_base(repo: Path, base_wheel: str | None, base_installed: bool = False) -> Base:
    """The pinned upstream wheel (fetched and verified), a given wheel (--base-wheel, not pinned), or the vLLM
    installed in this Python written as a wheel (--base-installed, installed.py)."""
    if base_installed:
        path, version = installed_base_wheel(repo / "build" / "installed-base")
        with open_wheel(path) as zf:
            dist_info, _ = wheel_dist_info(zf)
        return Base(path, sha256_file(path), version, dist_info)
    if base_wheel:
        path = Path(base_wheel)
        if not path.is_file() or not os.access(path, os.R_OK):
            raise BuildError(f"--base-wheel {base_wheel}: no readable file there")
        with open_wheel(path) as zf:
            dist_info, version = wheel_dist_info(zf)
        sha = sha256_file(path)
        log(f"verify  base wheel {path.name} (version {version}, sha256 {sha[:12]}, not pinned)")
        return Base(path, sha, version, dist_info)
    pins = Pins.load(repo)
    path = fetch_base(pins)
    size = path.stat().st_size
    if size != pins.wheel_size:
        raise BuildError(f"size mismatch for {path}: {size} bytes, expected {pins.wheel_size} ({pins.path.name})")
    log(f"verify  sha256 {pins.wheel_sha256[:12]} ok ({pins.path.relative_to(repo)})")
    with open_wheel(path) as zf:
        dist_info, version = wheel_dist_info(zf)
    return Base(path, pins.wheel_sha256, version, dist_info)


def install_and_record(repo: Path, tree: Path, base_name: str, base_sha: str, base_version: str,
                       patches: list[Patch]) -> str:
    """Install kernels/ and dcu/ into the tree and write vllm/dcu_patchset.json; return the build's version."""
    kernels_sha = install_packages(repo, tree)
    log(f"kernels {', '.join(f'{a}/ -> vllm/{b}' for a, b in PACKAGES)} (sha256 {kernels_sha[:12]})")
    version = make_version(base_version, patches, kernels_sha)
    write_patchset_json(tree, patchset_record(base_name, base_sha, base_version, version, patches, kernels_sha))
    return version


def build_wheel(repo: Path, base: Base, patches: list[Patch], out_dir: Path, tree: Path) -> Path:
    apply_series(base.wheel, patches, tree, repo)
    version = install_and_record(repo, tree, base.wheel.name, base.sha256, base.version, patches)
    stamp_version_file(tree, version)
    log(f"stamp   version {version}, vllm/dcu_patchset.json ({len(patches)} patches)")
    wheel = pack_wheel(base.wheel, tree, version, out_dir, base.dist_info)
    log(f"pack    {shown(wheel, repo)} ({wheel.stat().st_size / 2**20:.0f} MiB)")
    return wheel


def build_one(repo: Path, base: Base, patches: list[Patch], out_dir: Path, tree: Path) -> Path:
    """The default verb: one wheel, and no other vllm wheel left in out_dir (`pip install dist/*.whl`)."""
    wheel = build_wheel(repo, base, patches, out_dir, tree)
    for stale in out_dir.glob("vllm-*.whl"):
        if stale != wheel:
            stale.unlink()
            log(f"clean   removed older {stale.name}")
    return wheel


def build_ablation(repo: Path, base: Base, patches: list[Patch], out_dir: Path, tree: Path) -> list[Path]:
    """Baseline (no patches) and every cumulative prefix of the series into out_dir/ablation/."""
    abl = out_dir / "ablation"
    built = []
    for k in range(len(patches) + 1):
        prefix = patches[:k]
        log(f"--- ablation {k}/{len(patches)}: {'baseline (no patches)' if k == 0 else 'up to ' + prefix[-1].name}")
        built.append(build_wheel(repo, base, prefix, abl, tree))
    for stale in abl.glob("vllm-*.whl"):
        if stale not in built:
            stale.unlink()
    (abl / "ablation.json").write_text(json.dumps(
        [{"wheel": w.name, "patches": [p.name for p in patches[:k]]} for k, w in enumerate(built)], indent=2) + "\n")
    log(f"done    {len(built)} wheels in {abl}")
    return built


def report_check(base: Base, patches: list[Patch], tree: Path, listing: bool) -> None:
    """--check / --list: apply cumulatively, one line per patch; BuildError naming every patch that failed."""
    results = check_series(base.wheel, patches, tree)
    for p, err in results:
        status = "applies" if err is None else f"FAILS: {err}"
        if listing:
            log(f"{p.name:48s} {status}\n    {p.subject}")
        else:
            log(f"check   {p.name}: {status}")
    failed = [p.name for p, err in results if err]
    if failed:
        raise BuildError(f"{len(failed)} of {len(results)} patches do not apply to {base.wheel.name}: "
                         f"{', '.join(failed)}")
    log(f"check   all {len(results)} patches apply to {base.wheel.name} with no fuzz")


def make_tree(repo: Path, base: Base, patches: list[Patch], tree: Path) -> str:
    """--tree: the patched tree with our packages installed (no version stamp, no wheel); return its version."""
    apply_series(base.wheel, patches, tree, repo)
    version = install_and_record(repo, tree, base.wheel.name, base.sha256, base.version, patches)
    log(f"tree    {tree} ready ({len(patches)} patches + kernels, version {version}; not stamped)")
    return version
