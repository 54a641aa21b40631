#!/usr/bin/env python3
"""Make the GPU-box bundle from built vLLM wheels (runs on the CPU machine).

    python -m ci.gpu.bundle --wheel dist/A.whl [dist/B.whl ...] [--name N ...] [--out .bundle]

(from the repository root, which is the import root: the bundle hashes files with the build tool's helper)

The H200 test box has torch 2.11 + CUDA 13, no network, and takes at most 64 MiB per run, so the wheels'
compiled extensions cannot run there. The bundle carries what can:

    .bundle/manifest.json            variants (name, wheel, version, sizes, compiled-op names), deps, total
    .bundle/variants/<name>.tar.gz   the wheel's Python files and metadata only: no .so, no swagger
                                     static files, no helion configs
    .bundle/deps/*.whl               dependency wheels the box image lacks (cp312 manylinux x86_64), listed in
                                     ci/gpu/dependency-wheels.txt, downloaded once into a cache
    .bundle/standins/                the compiled-op stand-ins (ci/gpu/standins)

The variant name is the local part of the wheel's version (0.18.1+dcu.1.ab12cd34 -> dcu.1.ab12cd34,
0.18.1+base -> base, plain 0.18.1 -> upstream) unless --name gives one. The same wheel given again under
another name (same file, or same sha256: `--wheel dist/X.whl dist/X.whl --name full --name full8`) is packed
once: the later name's manifest entry points to the first's tarball and adds nothing to the size. The bundle
is built beside --out and moved into place only when complete and under the size cap; any error prints one line
and leaves no bundle.
On the box: bash ci/gpu/run.sh (see ci/gpu/harness.py).
"""
from __future__ import annotations

import argparse
import datetime
import gzip
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from tools.dcubuild.common import sha256_file as sha256  # one file hash for the build and the bundle

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEFAULT_DEPS = HERE / "dependency-wheels.txt"
DEFAULT_CACHE = Path(os.environ.get("VLLM_DCU_WHEEL_CACHE",
                                    Path.home() / ".cache" / "vllm-dcu" / "gpu-wheels"))
MAX_MIB = 60.0
STANDINS = ("vllm_C.py", "vllm_flash_attn_init.py")

# Parts of the wheel that never run on the box (or are too big to carry).
EXCLUDE_SUFFIXES = (".so",)
EXCLUDE_PREFIXES = ("vllm/entrypoints/serve/instrumentator/static/", "vllm/kernels/helion/configs/")

# torch.ops namespaces registered by vllm/_C*.so and vllm/_moe_C*.so on CUDA; the stand-in declares the
# names the variant's Python refers to in them.
OP_NAMESPACES = ("_C", "_C_cache_ops", "_C_custom_ar", "_moe_C", "_C_cuda_utils")
_NS = "|".join(OP_NAMESPACES)
_OP_ATTR = re.compile(rf"torch\.ops\.({_NS})\.([A-Za-z_]\w*)")
_OP_NAMED = re.compile(rf"torch\.ops\.({_NS})\s*,\s*[\"']([A-Za-z_]\w*)[\"']")
_OP_QUALNAME = re.compile(rf"[\"']({_NS})::([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*))?[\"']")

# Box platform for the dependency wheels.
PIP_PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3",
                "--abi", "none"] + [x for n in ("2_28", "2_27", "2_26", "2_24", "2_17", "2_5")
                                    for x in ("--platform", f"manylinux_{n}_x86_64")] + \
               ["--platform", "manylinux2014_x86_64", "--platform", "manylinux1_x86_64",
                "--platform", "linux_x86_64"]
_WHEEL_NAME = re.compile(r"^(?P<dist>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-"
                         r"(?P<plat>[^-]+)\.whl$")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class BundleError(Exception):
    """One-line, user-facing reason the bundle cannot be made."""


def normalize(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def mib(n: int) -> float:
    return n / (1 << 20)


# ---------------------------------------------------------------------------------------------- wheels
def read_wheel(path: Path) -> dict:
    """Validate one vLLM wheel and return {path, filename, version, files}."""
    if not path.exists():
        raise BundleError(f"wheel not found: {path}")
    if not path.is_file():
        raise BundleError(f"not a file: {path}")
    m = _WHEEL_NAME.match(path.name)
    if not m:
        raise BundleError(f"not a wheel file name (want NAME-VERSION-PY-ABI-PLATFORM.whl): {path}")
    if not zipfile.is_zipfile(path):
        raise BundleError(f"not a wheel (not a zip archive): {path}")
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        if "vllm/__init__.py" not in names:
            raise BundleError(f"not a vLLM wheel (no vllm/__init__.py): {path}")
        version = m.group("version")
        meta = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        if meta:
            for line in zf.read(meta[0]).decode("utf-8", "replace").splitlines():
                if line.startswith("Version:"):
                    version = line.split(":", 1)[1].strip()
                    break
    return {"path": path, "filename": path.name, "version": version}


def variant_name(version: str) -> str:
    return version.split("+", 1)[1] if "+" in version else "upstream"


def _keep(name: str) -> bool:
    if re.match(r"vllm-[^/]+\.dist-info/", name):
        # importlib.metadata.version("vllm") decides the platform (vllm/platforms/__init__.py); RECORD
        # would list files that are not there
        return not name.endswith(("/RECORD", "/"))
    if not name.startswith("vllm/") or name.endswith("/"):
        return False
    if "/__pycache__/" in name or name.endswith(".pyc"):
        return False
    if name.endswith(EXCLUDE_SUFFIXES) or ".so." in name.rsplit("/", 1)[-1]:
        return False
    return not name.startswith(EXCLUDE_PREFIXES)


def scan_compiled_ops(sources: dict[str, str]) -> dict:
    """Names of compiled ops the Python sources refer to, per torch.ops namespace."""
    found: dict[str, dict[str, set]] = {ns: {"ops": set(), "overloads": set()} for ns in OP_NAMESPACES}
    for text in sources.values():
        for ns, name in _OP_ATTR.findall(text):
            found[ns]["ops"].add(name)
        for ns, name in _OP_NAMED.findall(text):
            found[ns]["ops"].add(name)
        for ns, name, overload in _OP_QUALNAME.findall(text):
            found[ns]["ops"].add(name)
            if overload and overload != "default":
                found[ns]["overloads"].add(f"{name}.{overload}")
    return {ns: {"ops": sorted(v["ops"]), "overloads": sorted(v["overloads"])}
            for ns, v in found.items() if v["ops"]}


def pack_variant(wheel: dict, dest: Path) -> dict:
    """Write the wheel's kept files as a reproducible tar.gz; return its manifest entry."""
    kept = excluded = 0
    sources: dict[str, str] = {}
    raw = io.BytesIO()
    with zipfile.ZipFile(wheel["path"]) as zf, tarfile.open(fileobj=raw, mode="w") as tar:
        for info in sorted(zf.infolist(), key=lambda i: i.filename):
            name = info.filename
            if name.endswith("/") or not (name.startswith("vllm/") or name.startswith("vllm-")):
                continue
            if not _keep(name):
                excluded += 1
                continue
            data = zf.read(info)
            if name.endswith(".py"):
                sources[name] = data.decode("utf-8", "replace")
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            ti.mode = 0o644
            ti.mtime = 0
            tar.addfile(ti, io.BytesIO(data))
            kept += 1
    with open(dest, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0,
                                              compresslevel=9) as gz:
        gz.write(raw.getvalue())
    ops = scan_compiled_ops(sources)
    if "_C" not in ops:
        raise BundleError(f"{wheel['filename']}: found no torch.ops._C references; is this vLLM?")
    return {"wheel": wheel["filename"], "version": wheel["version"], "tarball": f"variants/{dest.name}",
            "bytes": dest.stat().st_size, "sha256": sha256(dest), "files": kept,
            "excluded_files": excluded, "compiled_ops": ops}


def _same_wheel(info: dict, packed: list[tuple[dict, dict]]) -> tuple[dict, dict] | None:
    """The (info, entry) of an already packed wheel that is the same file as `info`'s (same resolved path, or
    same size and sha256), else None. Hashes only wheels whose sizes match."""
    path = Path(info["path"]).resolve()
    size = path.stat().st_size
    for other in packed:
        o = other[0]
        if Path(o["path"]).resolve() == path:
            return other
        if Path(o["path"]).stat().st_size == size:
            if "sha256" not in o:
                o["sha256"] = sha256(Path(o["path"]))
            if "sha256" not in info:
                info["sha256"] = sha256(path)
            if o["sha256"] == info["sha256"]:
                return other
    return None


# ------------------------------------------------------------------------------------------------ deps
def read_deps(path: Path) -> list[tuple[str, str]]:
    if not path.is_file():
        raise BundleError(f"dependency list not found: {path}")
    deps = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9._+!-]+)", line)
        if not m:
            raise BundleError(f"{path}:{lineno}: want NAME==VERSION, got {line!r}")
        deps.append((m.group(1), m.group(2)))
    return deps


def _cached_wheel(cache: Path, dist: str, version: str) -> Path | None:
    if not cache.is_dir():
        return None
    for p in sorted(cache.glob("*.whl")):
        m = _WHEEL_NAME.match(p.name)
        if m and normalize(m.group("dist")) == normalize(dist) and m.group("version") == version:
            return p
    return None


def fetch_deps(deps: list[tuple[str, str]], cache: Path, offline: bool) -> list[Path]:
    missing = [(d, v) for d, v in deps if _cached_wheel(cache, d, v) is None]
    if missing and offline:
        raise BundleError(f"{len(missing)} dependency wheel(s) not in {cache} and --offline given: "
                          + ", ".join(f"{d}=={v}" for d, v in missing))
    if missing:
        cache.mkdir(parents=True, exist_ok=True)
        print(f"bundle: downloading {len(missing)} dependency wheel(s) into {cache}", flush=True)
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               *PIP_PLATFORM, "-d", str(cache)] + [f"{d}=={v}" for d, v in missing]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        still = [(d, v) for d, v in missing if _cached_wheel(cache, d, v) is None]
        if proc.returncode != 0 or still:
            tail = [ln for ln in proc.stdout.splitlines() if ln.startswith("ERROR")][-1:]
            raise BundleError("pip download failed for " + ", ".join(f"{d}=={v}" for d, v in still)
                              + (f": {tail[0]}" if tail else ""))
    return [_cached_wheel(cache, d, v) for d, v in deps]  # type: ignore[misc]


# ----------------------------------------------------------------------------------------------- build
def build(wheels: list[Path], names: list[str], out: Path, deps_file: Path, cache: Path,
          max_mib: float, offline: bool) -> dict:
    if not wheels:
        raise BundleError("give at least one --wheel")
    if names and len(names) != len(wheels):
        raise BundleError(f"--name given {len(names)} time(s) for {len(wheels)} --wheel(s); give one per "
                          f"wheel or none")
    infos = [read_wheel(Path(w)) for w in wheels]
    for i, info in enumerate(infos):
        info["name"] = names[i] if names else variant_name(info["version"])
        if not _SAFE_NAME.match(info["name"]):
            raise BundleError(f"variant name {info['name']!r} (from {info['filename']}) must be letters, "
                              f"digits, '.', '_' or '-'")
    seen: dict[str, str] = {}
    for info in infos:
        if info["name"] in seen:
            raise BundleError(f"two wheels give variant {info['name']!r}: {seen[info['name']]} and "
                              f"{info['filename']}; use --name")
        seen[info["name"]] = info["filename"]
    deps = read_deps(deps_file)
    dep_paths = fetch_deps(deps, cache, offline)

    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-tmp-", dir=out.parent))
    try:
        tmp.chmod(0o755)
        (tmp / "variants").mkdir()
        (tmp / "deps").mkdir()
        (tmp / "standins").mkdir()
        variants = []
        packed: list[tuple[dict, dict]] = []  # (wheel info, its variant entry) of each tarball written
        for info in infos:
            first = _same_wheel(info, packed)
            if first is not None:
                # the same wheel under another name: its entry points to the first's tarball, which the bundle
                # (and its size cap) carries once
                entry = dict(first[1], wheel=info["filename"], version=info["version"], shares=first[0]["name"])
                variants.append({"name": info["name"], **entry})
                print(f"bundle: variant {info['name']:<24}   0.00 MiB  (same wheel as {first[0]['name']}: shares "
                      f"its tarball {entry['tarball']})", flush=True)
                continue
            entry = pack_variant(info, tmp / "variants" / f"{info['name']}.tar.gz")
            variants.append({"name": info["name"], **entry})
            packed.append((info, entry))
            print(f"bundle: variant {info['name']:<24} {mib(entry['bytes']):6.2f} MiB  "
                  f"({entry['files']} files, {entry['excluded_files']} left out)", flush=True)
        dep_entries = []
        for p in dep_paths:
            shutil.copy2(p, tmp / "deps" / p.name)
            dep_entries.append({"file": p.name, "bytes": p.stat().st_size})
        for s in STANDINS:
            shutil.copy2(HERE / "standins" / s, tmp / "standins" / s)
        total = sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file())
        manifest = {
            "format": 1,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "python": "3.12",
            "variants": variants,
            "deps": dep_entries,
            "deps_bytes": sum(d["bytes"] for d in dep_entries),
            "standins": list(STANDINS),
        }
        text = json.dumps(manifest, indent=1)
        total += len(text) + 64  # the manifest itself, with the total written in
        manifest["total_bytes"] = total
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        if mib(total) > max_mib:
            parts = ", ".join(f"{v['name']} " + (f"= {v['shares']}" if "shares" in v else f"{mib(v['bytes']):.1f}")
                              for v in variants)
            raise BundleError(f"bundle would be {mib(total):.1f} MiB, over the {max_mib:g} MiB cap "
                              f"(deps {mib(manifest['deps_bytes']):.1f} MiB; variants: {parts}); "
                              f"bundle fewer wheels")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"bundle: {out} {mib(manifest['total_bytes']):.2f} MiB: {len(variants)} variant(s) "
          f"[{', '.join(v['name'] for v in variants)}], {len(dep_entries)} dependency wheels "
          f"({mib(manifest['deps_bytes']):.1f} MiB)", flush=True)
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", action="extend", nargs="+", default=[], required=True, metavar="WHEEL",
                    help="built vLLM wheel(s), in variant order (repeat or list several: --wheel dist/*.whl)")
    ap.add_argument("--name", action="extend", nargs="+", default=[], metavar="NAME",
                    help="variant name for each wheel, in order (default: the version's local part); a wheel "
                         "given twice under two names shares one tarball")
    ap.add_argument("--out", default=str(REPO / ".bundle"), help="bundle folder (default: .bundle)")
    ap.add_argument("--deps", default=str(DEFAULT_DEPS), help="NAME==VERSION list of dependency wheels")
    ap.add_argument("--cache", default=str(DEFAULT_CACHE), help="dependency wheel cache folder")
    ap.add_argument("--max-mib", type=float, default=MAX_MIB, help="size cap (default 60)")
    ap.add_argument("--offline", action="store_true", help="never download; fail if a wheel is missing")
    args = ap.parse_args(argv)
    try:
        build([Path(w) for w in args.wheel], args.name, Path(args.out), Path(args.deps),
              Path(args.cache), args.max_mib, args.offline)
    except BundleError as e:
        print(f"bundle.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
