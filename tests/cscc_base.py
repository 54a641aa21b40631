"""A cscc-shaped base for the build tests: the pinned upstream 0.18.1 wheel with what is known of Hygon's fork
applied (tests/test_build_cscc.py).

What is known (docs: the peer-contest reference notes): the fork's Python is upstream's except
`vllm/platforms/rocm.py`, where the module-level `import vllm._rocm_C` is commented out (its extension is not
built), and the container's installed wheel, which reports `0.18.1+das.dtk2604`, routes gfx936 to the skinny-GEMM
path (`on_gfx9() or on_gfx936()` in `rocm_unquantized_gemm_impl`). `make_cscc_wheel` writes such a wheel: the two
files edited, the version and dist-info renamed to `0.18.1+das.dtk2604`, every other member (the compiled
extensions among them) copied as stored, RECORD rebuilt.
"""
from __future__ import annotations

import csv
import io
import re
import zipfile
from pathlib import Path

from tools.dcubuild.wheel import copy_stored_member, open_wheel, record_hash, record_text, wheel_dist_info, write_member

DAS = "0.18.1+das.dtk2604"
ROCM = "vllm/platforms/rocm.py"
UTILS = "vllm/model_executor/layers/utils.py"
ROCM_C_IMPORT = """try:
    import vllm._rocm_C  # noqa: F401
except ImportError as e:
    logger.warning("Failed to import from vllm._rocm_C with %r", e)
"""


def _replace_once(text: str, old: str, new: str, where: str) -> str:
    assert text.count(old) == 1, f"{where}: expected one {old!r} in the upstream file"
    return text.replace(old, new)


def cscc_rocm(text: str) -> str:
    """rocm.py as the fork has it: no module-level _rocm_C import; an on_gfx936() beside the other arch checks."""
    text = _replace_once(text, ROCM_C_IMPORT, "".join("# " + l if l.strip() else l
                                                      for l in ROCM_C_IMPORT.splitlines(True)), ROCM)
    text = _replace_once(text, '_ON_GFX950 = "gfx950" in _GCN_ARCH\n',
                         '_ON_GFX950 = "gfx950" in _GCN_ARCH\n_ON_GFX936 = "gfx936" in _GCN_ARCH\n', ROCM)
    return _replace_once(text, "def on_gfx950() -> bool:\n    return _ON_GFX950\n",
                         "def on_gfx950() -> bool:\n    return _ON_GFX950\n\n\n"
                         "def on_gfx936() -> bool:\n    return _ON_GFX936\n", ROCM)


def cscc_utils(text: str) -> str:
    """layers/utils.py as the installed wheel has it: gfx936 takes the skinny GEMMs (wvSplitK, LLMM1)."""
    text = _replace_once(text, "    from vllm.platforms.rocm import on_gfx9, on_gfx950\n",
                         "    from vllm.platforms.rocm import on_gfx9, on_gfx936, on_gfx950\n", UTILS)
    return _replace_once(text, "        and on_gfx9()\n        and x.dtype in",
                         "        and (on_gfx9() or on_gfx936())\n        and x.dtype in", UTILS)


def make_cscc_wheel(upstream: Path, out_dir: Path, version: str = DAS) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    with open_wheel(upstream) as src, open(upstream, "rb") as fp:
        old_info, _ = wheel_dist_info(src)
        new_info = f"vllm-{version}.dist-info"
        tags = upstream.name[:-4].split("-")[-3:]
        dst_path = out_dir / f"vllm-{version}-{'-'.join(tags)}.whl"
        edits = {ROCM: cscc_rocm(src.read(ROCM).decode()).encode(),
                 UTILS: cscc_utils(src.read(UTILS).decode()).encode()}
        rows = [r for r in csv.reader(io.StringIO(src.read(f"{old_info}/RECORD").decode())) if r]
        records = []
        tmp = dst_path.with_suffix(".partial")
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                name = info.filename
                if name.startswith(old_info + "/") or name in edits:
                    continue
                copy_stored_member(fp, info, dst)
            for name, data in edits.items():
                write_member(dst, name, data)
            for info in src.infolist():
                if info.filename.startswith(old_info + "/") and not info.filename.endswith("/RECORD"):
                    data = src.read(info)
                    if info.filename.endswith("/METADATA"):
                        data = re.sub(rb"^Version: .*$", f"Version: {version}".encode(), data, count=1, flags=re.M)
                    leaf = info.filename.split("/", 1)[1]
                    write_member(dst, f"{new_info}/{leaf}", data)
                    records.append((f"{new_info}/{leaf}", record_hash(data), str(len(data))))
            for name, digest, size in rows:
                if name.startswith(old_info + "/"):
                    continue
                records.append((name, record_hash(edits[name]), str(len(edits[name]))) if name in edits
                               else (name, digest, size))
            write_member(dst, f"{new_info}/RECORD", record_text(records, f"{new_info}/RECORD"))
        tmp.replace(dst_path)
    return dst_path
