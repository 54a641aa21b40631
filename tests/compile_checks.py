"""A kernel package's compile_check (kernels/<kernel>/compile_check.py) run from a test: in a process of its own and
without TRITON_INTERPRET (compile_check needs Triton's compiler, the tests run under the interpreter); its --json rows
come back."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def compile_check_rows(kernel: str, *args: str) -> list[dict]:
    """``python -m kernels.<kernel>.compile_check --json *args``'s rows; fails the test with its stderr's tail."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", f"kernels.{kernel}.compile_check", "--json", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)
