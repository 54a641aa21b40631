"""A `vllm serve` process on 127.0.0.1 for the GPU smoke tests, and a small stdlib HTTP client for it."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerDied(AssertionError):
    pass


class Server:
    """Start `argv` (a `vllm serve` command) with `env`, wait for /health, stop the whole group on exit."""

    def __init__(self, argv: list[str], env: dict, log_path: Path, port: int, start_timeout_s: float = 300):
        self.argv, self.env, self.log_path, self.port = argv, env, Path(log_path), port
        self.start_timeout_s = start_timeout_s
        self.base = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.start_seconds: float | None = None

    def __enter__(self) -> "Server":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        t0 = time.monotonic()
        # own process group: the API server, its engine core and any TP workers stop together
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        while True:
            if self.proc.poll() is not None:
                raise ServerDied(f"vllm serve exited with {self.proc.returncode} before it was healthy; "
                                 f"log tail:\n{self.log_tail()}")
            if time.monotonic() - t0 > self.start_timeout_s:
                self.stop()
                raise ServerDied(f"vllm serve not healthy after {self.start_timeout_s:.0f} s; log tail:\n"
                                 f"{self.log_tail()}")
            try:
                if self.get("/health", timeout=5)[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(1.0)
        self.start_seconds = round(time.monotonic() - t0, 1)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self._close_log()
            return
        try:
            os.killpg(self.proc.pid, signal.SIGINT)
            self.proc.wait(timeout=60)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)
        self._close_log()

    def _close_log(self) -> None:
        log = getattr(self, "_log", None)
        if log is not None and not log.closed:
            log.close()

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # ------------------------------------------------------------------------------------------- HTTP
    def get(self, path: str, timeout: float = 30) -> tuple[int, dict | str]:
        return self._call(urllib.request.Request(self.base + path), timeout)

    def post(self, path: str, body: dict, timeout: float = 300) -> tuple[int, dict | str]:
        req = urllib.request.Request(self.base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        return self._call(req, timeout)

    def post_stream(self, path: str, body: dict, timeout: float = 300) -> tuple[int, list]:
        """POST with stream=true; returns (status, [decoded JSON events], with "[DONE]" kept as a string)."""
        req = urllib.request.Request(self.base + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        events: list = []
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                for raw in resp:
                    line = raw.decode().strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:"):].strip()
                    events.append(data if data == "[DONE]" else json.loads(data))
                return resp.status, events
        except urllib.error.HTTPError as e:
            return e.code, [e.read().decode(errors="replace")]

    @staticmethod
    def _call(req, timeout: float) -> tuple[int, dict | str]:
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, _decode(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, _decode(e.read())


def _decode(raw: bytes) -> dict | str:
    text = raw.decode(errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        return text
