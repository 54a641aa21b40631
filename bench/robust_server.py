"""The robustness benchmark's view of the server: its Prometheus state, GPU memory and log, the load the clients
put on it, and the drain, probe and warm-up around that load."""
from __future__ import annotations

import json
import os
import random
import re
import subprocess
import threading
import time

from bench.robust_requests import HttpClient, Outcome, Req, RequestMix, Tally

WARMUP_REQUESTS = 128
FATAL_LOG = re.compile(r"EngineDeadError|EngineCore encountered a fatal error|device-side assert|"
                       r"CUDA error: |Engine core proc \S+ died|engine core .*died unexpectedly", re.I)


# ================================================================================================ server state
def parse_metrics(text: str) -> dict[str, list[tuple[dict, float]]]:
    """Prometheus text exposition -> {name: [(labels, value), ...]}."""
    out: dict[str, list[tuple[dict, float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)", line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        out.setdefault(m.group(1), []).append((labels, value))
    return out


def metric(metrics: dict, name: str, how: str = "sum") -> float | None:
    rows = metrics.get(name)
    if not rows:
        return None
    values = [v for _, v in rows]
    return max(values) if how == "max" else sum(values)


def by_label(metrics: dict, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, v in metrics.get(name, []):
        out[labels.get(label, "")] = out.get(labels.get(label, ""), 0.0) + v
    return out


def server_state(client: HttpClient) -> dict | None:
    status, text = client.get("/metrics")
    if status != 200:
        return None
    m = parse_metrics(text)
    return {"kv_usage": metric(m, "vllm:kv_cache_usage_perc", "max"),
            "running": metric(m, "vllm:num_requests_running"), "waiting": metric(m, "vllm:num_requests_waiting"),
            "preemptions": metric(m, "vllm:num_preemptions_total"),
            "finished": by_label(m, "vllm:request_success_total", "finished_reason")}


def gpu_memory_used_mib() -> float | None:
    """Memory used on the GPU this process was given (first CUDA_VISIBLE_DEVICES entry), from nvidia-smi."""
    dev = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"
    try:
        out = subprocess.run(["nvidia-smi", "-i", dev, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
        return float(out.stdout.strip().splitlines()[0]) if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None


def fatal_in_log(path: str) -> str | None:
    try:
        with open(path, errors="replace") as f:
            for line in f:
                if FATAL_LOG.search(line):
                    return line.strip()[:300]
    except OSError:
        return None
    return None


# ================================================================================================ one configuration
class Load:
    """`workers` clients sending RequestMix requests until `t_end`, a sampler recording the offered KV demand,
    the server's state and whether it is still alive."""

    def __init__(self, client: HttpClient, mixes: list[RequestMix], tally: Tally, kv_tokens: int,
                 alive=lambda: True, max_requests_per_client: int = 100000):
        self.client, self.mixes, self.tally, self.kv_tokens = client, mixes, tally, kv_tokens
        self.alive, self.max_requests = alive, max_requests_per_client
        self.demand = [0] * len(mixes)
        self.stop = threading.Event()
        self.samples: list[dict] = []
        self.death: str | None = None
        self.threads: list[threading.Thread] = []

    def _client(self, i: int, t_end: float) -> None:
        mix = self.mixes[i]
        for _ in range(self.max_requests):
            if self.stop.is_set() or time.monotonic() >= t_end:
                return
            req = mix.next()
            self.demand[i] = req.demand_tokens
            out = self.client.send(req)
            self.demand[i] = 0
            self.tally.add(req, out)

    def _sampler(self, t_end: float, period_s: float) -> None:
        while not self.stop.wait(period_s) and (time.monotonic() < t_end or any(t.is_alive() for t in self.threads)):
            demand = sum(self.demand)
            st = server_state(self.client) or {}
            self.samples.append({"t": round(time.monotonic(), 2), "demand_tokens": demand,
                                 "demand_ratio": round(demand / self.kv_tokens, 3),
                                 "kv_usage": st.get("kv_usage"), "running": st.get("running"),
                                 "waiting": st.get("waiting")})
            if not self.alive():
                self.death = self.death or "the server process exited"
                self.stop.set()
                return

    def run(self, seconds: float, drain_timeout_s: float, period_s: float | None = None) -> dict:
        period_s = period_s or min(1.0, seconds / 20)
        t_end = time.monotonic() + seconds
        self.threads = [threading.Thread(target=self._client, args=(i, t_end), daemon=True)
                        for i in range(len(self.mixes))]
        sampler = threading.Thread(target=self._sampler, args=(t_end, period_s), daemon=True)
        for t in self.threads:
            t.start()
        sampler.start()
        while time.monotonic() < t_end and not self.stop.is_set():
            time.sleep(0.2)
        t_drain = time.monotonic()
        deadline = t_drain + drain_timeout_s
        for t in self.threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        unfinished = sum(t.is_alive() for t in self.threads)
        self.stop.set()
        sampler.join(timeout=10)
        ratios = [s["demand_ratio"] for s in self.samples if s["t"] <= t_drain]
        usage = [s["kv_usage"] for s in self.samples if s["kv_usage"] is not None]
        return {"clients": len(self.mixes), "load_s": round(t_drain - (t_end - seconds), 1),
                "client_drain_s": round(time.monotonic() - t_drain, 1), "unfinished_at_drain": unfinished,
                "demand_ratio_mean": round(sum(ratios) / len(ratios), 2) if ratios else None,
                "demand_ratio_peak": max(ratios) if ratios else None,
                "kv_usage_peak": max(usage) if usage else None, "samples": len(self.samples)}


def wait_idle(client: HttpClient, timeout_s: float) -> dict | None:
    """Poll /metrics until nothing runs or waits; the last state seen."""
    t0 = time.monotonic()
    st = None
    while time.monotonic() - t0 < timeout_s:
        st = server_state(client)
        if st and (st["running"] or 0) == 0 and (st["waiting"] or 0) == 0:
            return st
        time.sleep(0.5)
    return st


def probe(client: HttpClient, model: str) -> Outcome:
    body = {"model": model, "prompt": [1, 2, 3], "max_tokens": 1, "temperature": 0.0}
    return client.send(Req("probe", "/v1/completions", json.dumps(body).encode(), max_tokens=1))


def warmup(client: HttpClient, model: str, n: int = WARMUP_REQUESTS, prompt_len: int = 512) -> dict:
    """n short requests at once: prefill steps at the full chunk, the largest decode batch, greedy and random
    sampling in one batch (the shapes the load reaches, so the allocator has grown before memory is read)."""
    rng = random.Random(1)
    bodies = [json.dumps({"model": model, "prompt": [rng.randrange(1000, 200000) for _ in range(prompt_len)],
                          "max_tokens": 8, "temperature": 0.8 if i % 2 else 0.0, "ignore_eos": True}).encode()
              for i in range(n)]
    outs: list[Outcome] = [None] * n  # type: ignore[list-item]

    def one(i):
        outs[i] = client.send(Req("warmup", "/v1/completions", bodies[i], max_tokens=8))

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return {"requests": n, "ok": sum(1 for o in outs if o is not None and o.status == 200),
            "seconds": round(time.monotonic() - t0, 1)}


