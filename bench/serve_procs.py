"""The serving benchmark's processes: `vllm serve` in its own process group, the `vllm bench serve` client that
stays up between runs, and the clock and GPU facts they report with."""
from __future__ import annotations

import json
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

from bench.bench_client import MARK
from bench.serve_config import BenchError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Clock:
    """Seconds since the command started, and progress lines stamped with them: `[<tag> +mm:ss] ...`."""

    def __init__(self, tag: str = "bench"):
        self.t0 = time.monotonic()
        self.tag = tag

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def log(self, msg: str) -> None:
        e = int(self.elapsed())
        print(f"[{self.tag} +{e // 60:02d}:{e % 60:02d}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_total_gib() -> float | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        return float(out) / 1024.0
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None


def gpu_label() -> str:
    try:
        name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "gpu"
    m = re.search(r"\b([A-Z]+\d+[A-Z]*)\b", name.replace("NVIDIA", ""))
    return (m.group(1) if m else name.split()[-1]).lower()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Server:
    def __init__(self, cmd: list[str], env: dict, log_path: str):
        self.cmd, self.env, self.log_path = cmd, env, log_path
        self.proc = None

    def start(self) -> None:
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=REPO)

    def wait_healthy(self, port: int, timeout_s: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with status {self.proc.returncode} while starting: "
                                   f"{last_error(self.log_path)}\n{tail(self.log_path)}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except OSError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"server not healthy after {timeout_s:.0f} s: {last_error(self.log_path)}\n"
                           f"{tail(self.log_path)}")

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                _kill_group(self.proc.pid)
                self.proc.wait(timeout=20)
        # The API server can exit before its engine-core child has let go of the GPU: wait for the whole
        # process group (ours, from start_new_session) to be gone before the next server asks for memory.
        t0 = time.monotonic()
        while _group_alive(self.proc.pid) and time.monotonic() - t0 < 30:
            time.sleep(0.5)
        if _group_alive(self.proc.pid):
            _kill_group(self.proc.pid)
            time.sleep(2.0)
        self.log.close()


def last_error(path: str) -> str:
    """The log's last line that names an error, else its last non-empty line."""
    try:
        with open(path, errors="replace") as f:
            lines = [x.strip() for x in f if x.strip()]
    except OSError:
        return "(no log)"
    for x in reversed(lines):
        if re.search(r"Error|error:|Exception|Traceback", x):
            return x[:300]
    return lines[-1][:300] if lines else "(empty log)"


def tail(path: str, lines: int = 25) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


class BenchClient:
    """bench/bench_client.py in the client's environment; runs one `vllm bench serve` per call.

    spawn() returns at once, so vLLM's import overlaps the first server's start; the first run()
    waits for it to be ready.
    """

    def __init__(self, env: dict, log_path: str):
        self.env, self.log_path = env, log_path
        self.proc = None
        self.ready = False
        self.ready_wait_s = 0.0  # of the last run(): time spent waiting for vLLM's import
        self.marks: queue.Queue = queue.Queue()
        self.log = open(log_path, "a")

    def spawn(self) -> None:
        self.proc = subprocess.Popen([sys.executable, os.path.join(REPO, "bench", "bench_client.py")],
                                     env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, cwd=REPO, start_new_session=True)
        self.ready = False
        self.marks = queue.Queue()
        threading.Thread(target=self._pump, args=(self.proc, self.marks), daemon=True).start()

    def _pump(self, proc, marks) -> None:
        for line in proc.stdout:
            self.log.write(line)
            self.log.flush()
            if line.startswith(MARK):
                marks.put(json.loads(line[len(MARK):]))
        marks.put({"rc": 1, "error": f"bench client exited ({last_error(self.log_path)})", "eof": True})

    def _wait(self, timeout_s: float) -> dict:
        try:
            return self.marks.get(timeout=max(1.0, timeout_s))
        except queue.Empty:
            raise TimeoutError from None

    def run(self, argv: list[str], timeout_s: float, label: str) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.spawn()
        self.ready_wait_s = 0.0
        if not self.ready:
            t0 = time.monotonic()
            try:
                st = self._wait(timeout_s)
            except TimeoutError:
                self.close()
                raise BenchError(f"bench client not ready after {timeout_s:.0f} s; see {self.log_path}") from None
            if not st.get("ready"):
                raise BenchError(f"bench client failed to start: {st.get('error') or last_error(self.log_path)}")
            self.ready = True
            self.ready_wait_s = time.monotonic() - t0
        self.log.write(f"\n===== {label}: vllm bench serve {shlex.join(argv)}\n")
        self.log.flush()
        self.proc.stdin.write(json.dumps(argv) + "\n")
        self.proc.stdin.flush()
        try:
            return self._wait(timeout_s)
        except TimeoutError:
            self.close()  # a stuck client is replaced for the next call
            raise

    def close(self) -> None:
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=15)
        self.proc = None
        self.ready = False
