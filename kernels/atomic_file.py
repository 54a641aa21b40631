"""Files written whole or not at all: a temporary name in the same folder, then a rename (``os.replace``).

Shipped with the kernels (the tuned file is written by the engine and the tuning command); the benchmarks' results
files use it too (kernels/results_io.py). Standard library only.
"""
import os
import tempfile


def write_via_temp(path, write):
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it to ``path``; no temp file stays, and
    ``path`` is untouched when ``write`` or the rename fails."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path
