"""Benchmarks keep scratch files under $BENCH_WORK or the system's temporary folder, never a hard-coded /tmp."""
import re
import tempfile
from pathlib import Path

from bench.workdir import scratch_dir

REPO = Path(__file__).resolve().parent.parent


def test_scratch_dir_prefers_bench_work(monkeypatch, tmp_path):
    monkeypatch.setenv("BENCH_WORK", str(tmp_path))
    assert scratch_dir("vllm-dcu-x") == str(tmp_path)


def test_scratch_dir_falls_back_to_the_temporary_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("BENCH_WORK", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert scratch_dir("vllm-dcu-x") == str(tmp_path / "vllm-dcu-x")


def test_no_tool_or_benchmark_hard_codes_tmp():
    offenders = []
    for folder in ("bench", "tools", "ci", "kernels", "dcu"):
        for path in (REPO / folder).rglob("*.py"):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"[\"']/tmp(/|[\"'])", line):
                    offenders.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
