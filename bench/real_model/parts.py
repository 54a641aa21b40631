"""The model's GGUF (98 MB) and the text in parts small enough for device calls, and joined again on the device.

A device call carries at most 64 MiB together with the tracked tree (~31 MiB), and the bundle (.bundle) takes most of
the rest, so the GGUF travels alone in four earlier calls on the same warm machine (its temporary folder survives
between calls), each part ~25 MiB:

    here:     python -m bench.real_model parts split [--out .gpu/real-model] [--parts 4]
              -> .gpu/real-model/1/{gguf.part, manifest.json, austen.txt.gz}, .gpu/real-model/2/{gguf.part, ...}, ...
    call N:   carry [".gpu/real-model/N"]:  python3 -m bench.real_model parts join .gpu/real-model/N
              (the last part joins the GGUF, checks its sha256 and puts it and austen.txt into the cache:
              $VLLM_DCU_CACHE/real-model, default ~/.cache/vllm-dcu/real-model)

``join`` keeps parts in ``--store`` (default <tmp>/vllm-dcu-real-model-parts) until all are there; it prints one
line saying how many parts it holds. Standard library only (the device runs it before the bundle is installed).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from . import fetch

PART = "gguf.part"
MANIFEST = "manifest.json"
TEXT = "austen.txt.gz"


def split(out: Path, parts: int) -> list[Path]:
    gguf = fetch.gguf_path()
    text = fetch.text_path().read_bytes()
    size = gguf.stat().st_size
    per = -(-size // parts)
    manifest = dict(name=fetch.GGUF_NAME, sha256=fetch.GGUF_SHA256, size=size, parts=parts)
    if out.exists():
        shutil.rmtree(out)
    dirs = []
    with open(gguf, "rb") as f:
        for i in range(1, parts + 1):
            d = out / str(i)
            d.mkdir(parents=True)
            (d / PART).write_bytes(f.read(per))
            (d / MANIFEST).write_text(json.dumps(dict(manifest, index=i)) + "\n")
            if i == 1:
                (d / TEXT).write_bytes(gzip.compress(text, 9))
            dirs.append(d)
    return dirs


def join(part_dir: Path, store: Path) -> str:
    try:
        manifest = json.loads((part_dir / MANIFEST).read_text())
        if manifest["sha256"] != fetch.GGUF_SHA256:
            raise fetch.FetchError(f"{part_dir} holds parts of another file (sha256 {manifest['sha256'][:12]}...)")
        index, parts = int(manifest["index"]), int(manifest["parts"])
    except (OSError, ValueError, KeyError) as exc:
        raise fetch.FetchError(f"{part_dir} is not a part folder made by 'parts split': {exc}") from None
    store.mkdir(parents=True, exist_ok=True)
    tmp = store / f".{index}.tmp"
    shutil.copyfile(part_dir / PART, tmp)
    os.replace(tmp, store / f"{index}.part")
    if (part_dir / TEXT).is_file():
        text = gzip.decompress((part_dir / TEXT).read_bytes())
        fetch.write_atomic(fetch.cache_dir() / fetch.TEXT_NAME, text)
    have = sorted(int(p.stem) for p in store.glob("*.part"))
    if have != list(range(1, parts + 1)):
        return f"parts: holding {len(have)}/{parts} parts of {manifest['name']} in {store}"
    dest = fetch.cache_dir() / fetch.GGUF_NAME
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    with os.fdopen(fd, "wb") as out:
        for i in have:
            with open(store / f"{i}.part", "rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
    if fetch.sha256_file(Path(tmp_name)) != fetch.GGUF_SHA256:
        Path(tmp_name).unlink()
        raise fetch.FetchError(f"the joined parts do not match {fetch.GGUF_NAME}'s sha256; split again")
    os.replace(tmp_name, dest)
    text_ok = (fetch.cache_dir() / fetch.TEXT_NAME).is_file()
    return f"parts: joined {parts} parts into {dest} (sha256 ok); text {'present' if text_ok else 'MISSING'}"


def main(argv) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.real_model parts")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split")
    s.add_argument("--out", default=".gpu/real-model")
    s.add_argument("--parts", type=int, default=4)
    j = sub.add_parser("join")
    j.add_argument("part_dir")
    j.add_argument("--store", default=str(Path(tempfile.gettempdir()) / "vllm-dcu-real-model-parts"))
    args = ap.parse_args(argv)
    if args.cmd == "split":
        if not 1 <= args.parts <= 16:
            ap.error("--parts must be in 1..16")
        for d in split(Path(args.out), args.parts):
            mib = sum(f.stat().st_size for f in d.iterdir()) / 2**20
            print(f"parts: {d} ({mib:.1f} MiB)")
        return 0
    print(join(Path(args.part_dir), Path(args.store)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
