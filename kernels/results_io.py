"""Results files are written whole or not at all: a temporary name in the same folder, then a rename.

Benchmarks are stopped at device-call deadlines; a half-written JSON or report beside the good ones would be
read as a result. Standard library only (matplotlib only if a figure is passed in).
"""
import json
import os
from pathlib import Path

from .atomic_file import write_via_temp


def device_tag(device_name: str) -> str:
    """A device's name as results files spell it: "NVIDIA H100 80GB HBM3" -> "h100-80gb-hbm3"."""
    return device_name.lower().replace("nvidia ", "").replace(" ", "-")


def write_text(path, text):
    """Write ``text`` to ``path`` atomically (same folder temp file, then ``os.replace``)."""

    def write(tmp):
        with open(tmp, "w") as f:
            f.write(text)

    return write_via_temp(path, write)


def save_figure(fig, path, **savefig_kwargs):
    """``fig.savefig`` to ``path`` atomically; the format comes from ``path``'s extension."""
    fmt = os.path.splitext(str(path))[1].lstrip(".") or "png"
    return write_via_temp(path, lambda tmp: fig.savefig(tmp, format=fmt, **savefig_kwargs))


def write_result_pair(folder, stem, doc, markdown_lines):
    """``<folder>/<stem>.json`` (``doc``) and ``<folder>/<stem>.md`` (the lines), each atomically; the .md path."""
    folder = Path(folder)
    write_text(folder / f"{stem}.json", json.dumps(doc, indent=1) + "\n")
    return Path(write_text(folder / f"{stem}.md", "\n".join(markdown_lines) + "\n"))
