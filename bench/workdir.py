"""Where a benchmark keeps its scratch files (dummy model folders, prompts): $BENCH_WORK when set (ci/gpu/jobs.py
gives every job its own), else a named folder in the system's temporary folder (tempfile.gettempdir())."""
import os
import tempfile


def scratch_dir(name: str) -> str:
    """$BENCH_WORK, else <system temporary folder>/<name>."""
    return os.environ.get("BENCH_WORK") or os.path.join(tempfile.gettempdir(), name)
