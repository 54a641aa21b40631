"""Serving robustness benchmark (issue #20): `vllm serve` overloaded past its KV cache, mixed with malformed requests
and clients that hang up mid-stream. Not a timed benchmark: it counts what came back and checks that the server kept
its engine, gave its KV cache back and did not grow its GPU memory.

For each configuration (bf16 KV, int8_per_token_head KV; optionally with --scheduler-tpot-target-ms 30) it starts
`vllm serve` on 127.0.0.1 with dummy Qwen3.5-27B weights (--layers of them), the synthetic tokenizer, the official
start_vllm.sh flags (bench/serve_bench.py CONTEST_SERVER_FLAGS), the dcu64 KV budget (bench/profiles.py) and
--attention-backend DCU_TRITON_ATTN, then:
  1. reads the KV capacity in tokens from the server log and sizes the client: enough concurrent clients that the
     tokens their requests need (prompt + max_tokens) are --overload (default 2.2) times that capacity;
  2. warm-up burst (128 short requests: full prefill chunks and the largest decode batch), drain, GPU memory "before";
  3. --load-s seconds of load from those clients: token-id completions, chat, streams (55/15/10 %), streams the
     client closes after two events (10 %) and malformed requests (10 %: every case of bench/bad_requests.py in
     turn: broken JSON, unknown model, over-long prompt, bad sampling values, out-of-range ids in every field);
  4. drain (in-flight requests finish), one probe request (so the server publishes fresh stats), then from /metrics
     the KV cache usage (target 0), preemptions and finished requests by reason, and GPU memory "after";
  5. stops the server; an engine death (server gone, /health failing, or a fatal engine error in its log) ends the
     configuration early.
Counts: requests completed, 4xx by kind (each checked against the status and `param` the catalogue expects),
unexpected answers, 5xx, transport errors and timeouts, client disconnects; the verdict per configuration is
PASS when there were no engine deaths, no 5xx, nothing unexpected, no timeouts, KV usage 0 after the drain, GPU
memory growth <= --mem-tolerance-mib and the offered load reached 2x the KV capacity.

Results: <out>/<date>-<gpu>-serve-robustness.{json,md} (kernels/results_io.py: whole files or nothing, rewritten
after every configuration), the command on top; the summary table is printed last. Exit status 0 when every
configuration ran and passed, 1 otherwise, 2 for bad arguments.

On the H200 box (one GPU; ~7-8 minutes from a cold machine, ~5 once Triton's caches are warm):
  bash ci/gpu/run.sh python bench/serve_robustness.py --out $OUT
  bash ci/gpu/run.sh python bench/serve_robustness.py --out $OUT --configs bf16-t30 --load-s 60
--dry-run prints the plan and the server commands.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import http.client
import json
import math
import os
import random
import re
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench import bad_requests, profiles  # noqa: E402
from bench.serve_bench import (  # noqa: E402
    CONTEST_SERVER_FLAGS,
    SERVED_NAME,
    BenchError,
    Server,
    free_port,
    gpu_label,
    harness_env,
    harness_serve_args,
    harness_write_config,
    load_harness,
    parse_server_log,
    variant_patches,
)
from bench.synth_tokenizer import ENGLISH_WORDS, write_tokenizer  # noqa: E402
from kernels.results_io import write_result_pair  # noqa: E402

VOCAB = profiles.VOCAB
ATTN_FLAGS = ["--attention-backend", "DCU_TRITON_ATTN"]
DECODE_PATCH = "dcu-triton-decode-attention"


@dataclass(frozen=True)
class ConfigSpec:
    flags: tuple[str, ...]
    needs: tuple[str, ...]  # patch names (without number) the build must carry
    what: str


CONFIGS = {
    "bf16": ConfigSpec((), (DECODE_PATCH,), "bf16 KV"),
    "int8": ConfigSpec(("--kv-cache-dtype", "int8_per_token_head"), (DECODE_PATCH, "kv-cache-per-token-head"),
                       "int8_per_token_head KV"),
    "bf16-t30": ConfigSpec(("--scheduler-tpot-target-ms", "30"),
                           (DECODE_PATCH, "scheduler-decode-first-adaptive-budget"), "bf16 KV, scheduler target 30 ms"),
    "int8-t30": ConfigSpec(("--kv-cache-dtype", "int8_per_token_head", "--scheduler-tpot-target-ms", "30"),
                           (DECODE_PATCH, "kv-cache-per-token-head", "scheduler-decode-first-adaptive-budget"),
                           "int8_per_token_head KV, scheduler target 30 ms"),
}
# request mix (shares of all requests); malformed requests cycle through bench/bad_requests.py
MIX = (("completion", 0.55), ("chat", 0.15), ("stream", 0.10), ("disconnect", 0.10), ("malformed", 0.10))
NORMAL_KINDS = ("completion", "chat", "stream", "disconnect")
WARMUP_REQUESTS = 128
CONFIG_OVERHEAD_S = 110.0  # a warm configuration's start (~60 s), warm-up, drain, probe and stop
CAPTURE_SIZES = [1, 2, 4, 8, 16, 32, 64, 128]
FATAL_LOG = re.compile(r"EngineDeadError|EngineCore encountered a fatal error|device-side assert|"
                       r"CUDA error: |Engine core proc \S+ died|engine core .*died unexpectedly", re.I)
_WORDS = [w for w in ENGLISH_WORDS if w.isalpha()]


# ================================================================================================ request mix
@dataclass
class Req:
    kind: str
    path: str
    payload: bytes
    stream: bool = False
    disconnect_after: int = 0  # events read before the client closes the connection
    case: bad_requests.BadCase | None = None
    max_tokens: int = 0
    demand_tokens: int = 0  # prompt + max_tokens: what the request may hold in the KV cache


def parse_range(text: str, what: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", text or "")
    if not m or int(m.group(1)) < 1 or int(m.group(1)) > int(m.group(2)):
        raise BenchError(f"{what} must be LO-HI with 1 <= LO <= HI, got {text!r}")
    return int(m.group(1)), int(m.group(2))


class RequestMix:
    """The requests of one client, deterministic in `seed`; malformed ones cycle through the catalogue from
    `start` (so clients together send every kind early)."""

    def __init__(self, *, model: str, vocab: int, max_model_len: int, prompt_range: tuple[int, int],
                 output_range: tuple[int, int], tokenizer: bool, seed: int, start: int = 0, mix=MIX):
        self.model, self.vocab, self.tokenizer = model, vocab, tokenizer
        self.prompt_range, self.output_range = prompt_range, output_range
        if prompt_range[1] + output_range[1] >= max_model_len:
            raise BenchError(f"prompts up to {prompt_range[1]} plus outputs up to {output_range[1]} tokens do not "
                             f"fit --max-model-len {max_model_len}")
        self.rng = random.Random(seed)
        self.cases = bad_requests.catalogue(model, vocab, max_model_len, tokenizer=tokenizer)
        self.next_case = start % len(self.cases)
        kinds = [(k, w) for k, w in mix if tokenizer or k != "chat"]
        self.kinds = [k for k, _ in kinds]
        self.weights = [w for _, w in kinds]

    def _prompt_ids(self, n: int) -> list[int]:
        hi = min(self.vocab, 200000)
        return [self.rng.randrange(1000, hi) for _ in range(n)]

    def _text(self, n: int) -> str:
        return " ".join(self.rng.choice(_WORDS) for _ in range(n))

    def normal(self, kind: str) -> Req:
        plen = self.rng.randint(*self.prompt_range)
        out = self.rng.randint(*self.output_range)
        temp = self.rng.choice((0.0, 0.8))
        if kind == "chat":
            body = {"model": self.model, "messages": [{"role": "user", "content": self._text(plen)}],
                    "max_tokens": out, "temperature": temp, "ignore_eos": True}
            return Req(kind, "/v1/chat/completions", json.dumps(body).encode(), max_tokens=out,
                       demand_tokens=plen + out)
        body = {"model": self.model, "prompt": self._prompt_ids(plen), "max_tokens": out, "temperature": temp,
                "ignore_eos": True}
        if kind in ("stream", "disconnect"):
            body.update(stream=True, stream_options={"include_usage": True})
        return Req(kind, "/v1/completions", json.dumps(body).encode(), stream=kind != "completion",
                   disconnect_after=2 if kind == "disconnect" else 0, max_tokens=out, demand_tokens=plen + out)

    def malformed(self) -> Req:
        case = self.cases[self.next_case]
        self.next_case = (self.next_case + 1) % len(self.cases)
        return Req(case.kind, case.path, case.payload(), stream=case.stream, case=case)

    def next(self) -> Req:
        kind = self.rng.choices(self.kinds, self.weights)[0]
        return self.malformed() if kind == "malformed" else self.normal(kind)

    def mean_demand(self) -> float:
        return sum(self.prompt_range) / 2 + sum(self.output_range) / 2

    def kv_share(self) -> float:
        """Share of requests that hold KV cache (the normal ones)."""
        total = sum(self.weights)
        return sum(w for k, w in zip(self.kinds, self.weights) if k in NORMAL_KINDS) / total


def concurrency_for(kv_tokens: int, mix: RequestMix, overload: float, cap: int) -> int:
    """Clients needed so that the KV the in-flight normal requests may hold is `overload` x the capacity."""
    need = overload * kv_tokens / (mix.kv_share() * mix.mean_demand())
    return max(4, min(cap, math.ceil(need)))


# ================================================================================================ HTTP client
@dataclass
class Outcome:
    status: int | None
    body: object = None  # decoded JSON (or text); for a stream: its first event
    events: list = field(default_factory=list)
    error: str = ""  # transport error
    timeout: bool = False
    closed_by_client: bool = False
    seconds: float = 0.0


def _decode(raw: bytes):
    text = raw.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


class HttpClient:
    def __init__(self, host: str, port: int, timeout_s: float):
        self.host, self.port, self.timeout_s = host, port, timeout_s

    def send(self, req: Req) -> Outcome:
        t0 = time.monotonic()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            conn.request("POST", req.path, body=req.payload, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            if not req.stream or resp.status != 200:
                return Outcome(resp.status, _decode(resp.read()), seconds=time.monotonic() - t0)
            events: list = []
            while True:
                line = resp.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip().decode("utf-8", "replace")
                events.append(data if data == "[DONE]" else _decode(data.encode()))
                if req.disconnect_after and len(events) >= req.disconnect_after:
                    conn.close()  # the client goes away mid-stream
                    return Outcome(200, events[0], events, closed_by_client=True, seconds=time.monotonic() - t0)
                if data == "[DONE]":
                    break
            return Outcome(200, events[0] if events else None, events, seconds=time.monotonic() - t0)
        except TimeoutError as e:
            return Outcome(None, error=f"timeout: {e}", timeout=True, seconds=time.monotonic() - t0)
        except (OSError, http.client.HTTPException) as e:
            return Outcome(None, error=f"{type(e).__name__}: {e}", seconds=time.monotonic() - t0)
        finally:
            conn.close()

    def get(self, path: str, timeout_s: float = 5.0) -> tuple[int | None, str]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout_s)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException) as e:
            return None, f"{type(e).__name__}: {e}"
        finally:
            conn.close()


# ================================================================================================ tally
def _usage_tokens(body) -> int | None:
    if isinstance(body, dict) and isinstance(body.get("usage"), dict):
        return body["usage"].get("completion_tokens")
    return None


class Tally:
    """What came back, by kind; thread-safe. Unexpected answers and 5xx keep their first examples."""

    EXAMPLES = 8

    def __init__(self):
        self.lock = threading.Lock()
        self.sent: dict[str, int] = {}
        self.completed: dict[str, int] = {}
        self.rejected: dict[str, int] = {}  # 4xx (or a stream's 4xx event) as the catalogue expects, by kind
        self.unexpected: dict[str, int] = {}
        self.http_5xx: dict[str, int] = {}
        self.transport_errors = 0
        self.timeouts = 0
        self.disconnects = 0
        self.examples: dict[str, list[str]] = {"unexpected": [], "5xx": [], "transport": []}

    def _ex(self, key: str, text: str) -> None:
        if len(self.examples[key]) < self.EXAMPLES:
            self.examples[key].append(text[:400])

    def _bump(self, d: dict, kind: str) -> None:
        d[kind] = d.get(kind, 0) + 1

    def add(self, req: Req, out: Outcome) -> str:
        """Record one answer; returns its class: completed, rejected, disconnect, unexpected, 5xx, timeout,
        transport."""
        with self.lock:
            self._bump(self.sent, req.kind)
            cls = self._classify(req, out)
            if cls == "completed":
                self._bump(self.completed, req.kind)
            elif cls == "rejected":
                self._bump(self.rejected, req.kind)
            elif cls == "disconnect":
                self.disconnects += 1
            elif cls == "5xx":
                self._bump(self.http_5xx, req.kind)
                self._ex("5xx", f"{req.kind}: {out.status} {str(out.body)[:300]}")
            elif cls == "timeout":
                self.timeouts += 1
                self._ex("transport", f"{req.kind}: {out.error}")
            elif cls == "transport":
                self.transport_errors += 1
                self._ex("transport", f"{req.kind}: {out.error}")
            return cls

    def _classify(self, req: Req, out: Outcome) -> str:
        if out.status is None:
            return "timeout" if out.timeout else "transport"
        err = bad_requests.error_of(out.body)
        if out.status >= 500 or (err and isinstance(err.get("code"), int) and err["code"] >= 500):
            return "5xx"
        if req.case is not None:
            v = bad_requests.judge(req.case, out.status, out.body)
            if v.ok:
                return "rejected"
            return self._unexpected(req, f"{v.why}: {v.message[:200]}")
        if out.status != 200:
            return self._unexpected(req, f"status {out.status}: {str(out.body)[:200]}")
        if req.kind == "disconnect":
            if out.closed_by_client and not err:
                return "disconnect"
            return self._unexpected(req, f"stream ended before the client closed it: {out.events[:3]}")
        if req.stream:
            errors = [e for e in out.events if bad_requests.error_of(e)]
            if errors:
                return self._unexpected(req, f"error event {str(errors[0])[:200]}")
            usage = [e for e in out.events if isinstance(e, dict) and _usage_tokens(e) is not None]
            if not out.events or out.events[-1] != "[DONE]" or not usage:
                return self._unexpected(req, f"stream without usage or [DONE]: {str(out.events[-2:])[:200]}")
            got = _usage_tokens(usage[-1])
        else:
            got = _usage_tokens(out.body)
        if got != req.max_tokens:
            return self._unexpected(req, f"{got} completion tokens, expected {req.max_tokens} (ignore_eos)")
        return "completed"

    def _unexpected(self, req: Req, why: str) -> str:
        self._bump(self.unexpected, req.kind)
        self._ex("unexpected", f"{req.kind}: {why}")
        return "unexpected"

    def summary(self) -> dict:
        with self.lock:
            return {
                "sent": sum(self.sent.values()), "sent_by_kind": dict(sorted(self.sent.items())),
                "completed": sum(self.completed.values()), "completed_by_kind": dict(sorted(self.completed.items())),
                "rejected_4xx": sum(self.rejected.values()), "rejected_by_kind": dict(sorted(self.rejected.items())),
                "unexpected": sum(self.unexpected.values()),
                "unexpected_by_kind": dict(sorted(self.unexpected.items())),
                "http_5xx": sum(self.http_5xx.values()), "http_5xx_by_kind": dict(sorted(self.http_5xx.items())),
                "transport_errors": self.transport_errors, "timeouts": self.timeouts,
                "disconnects": self.disconnects, "examples": {k: list(v) for k, v in self.examples.items()},
            }


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


def verdict(rec: dict, a) -> tuple[bool, list[str]]:
    """PASS/FAIL of one configuration's record and the reasons it failed."""
    why = []
    if rec.get("engine_deaths"):
        why.append(f"engine died: {rec.get('death')}")
    if rec.get("error"):
        why.append(f"did not finish: {rec['error']}")
    if "tally" not in rec or "load" not in rec:
        return False, why or ["no load phase"]
    t = rec["tally"]
    if t["http_5xx"]:
        why.append(f"{t['http_5xx']} answers 5xx")
    if t["unexpected"]:
        why.append(f"{t['unexpected']} unexpected answers")
    if t["timeouts"] or t["transport_errors"]:
        why.append(f"{t['timeouts']} timeouts, {t['transport_errors']} transport errors")
    if not t["completed"]:
        why.append("no request completed")
    if rec["load"]["unfinished_at_drain"]:
        why.append(f"{rec['load']['unfinished_at_drain']} clients still waiting after the drain")
    kv = rec.get("kv_usage_after_drain")
    if kv is None or kv > 1e-6:
        why.append(f"KV cache usage after the drain {kv!r} (expected 0)")
    growth = rec.get("gpu_memory_growth_mib")
    if growth is not None and growth > a.mem_tolerance_mib:
        why.append(f"GPU memory grew {growth:.0f} MiB (tolerance {a.mem_tolerance_mib:.0f})")
    ratio = rec["load"].get("demand_ratio_mean")
    if ratio is None or ratio < 2.0:
        why.append(f"offered KV demand {ratio}x the capacity (needs >= 2x)")
    return not why, why


def run_config(name: str, a, harness, model_dir: str, log_dir: str, clock) -> dict:
    spec = CONFIGS[name]
    rec: dict = {"config": name, "what": spec.what, "flags": list(spec.flags)}
    port = free_port()
    cmd = server_cmd(a, model_dir, port, a.harness_flags, spec.flags)
    rec["server_command"] = shlex.join(cmd)
    log_path = os.path.join(log_dir, f"{name}.log")
    rec["server_log"] = os.path.relpath(log_path, a.out)
    srv = Server(cmd, harness_env(harness, a.variant, serve=True), log_path)
    client = HttpClient("127.0.0.1", port, timeout_s=a.load_s + a.drain_timeout_s + 60)
    t0 = time.monotonic()
    clock.log(f"[{name}] start vllm serve on port {port} ({spec.what}; log {log_path})")
    try:
        srv.start()
        left = a.deadline_s - clock.elapsed() - a.load_s - 30
        rec["start_s"] = round(srv.wait_healthy(port, max(30.0, min(a.start_timeout_s, left))), 1)
        info = parse_server_log(open(log_path, errors="replace").read())
        rec["server_info"] = info
        kv_tokens = int(info.get("kv_cache_tokens") or 0)
        if kv_tokens <= 0:
            raise RuntimeError("no 'GPU KV cache size: N tokens' line in the server log")
        rec["kv_capacity_tokens"] = kv_tokens
        rec["gpu_memory_idle_mib"] = gpu_memory_used_mib()
        rec["warmup"] = warmup(client, SERVED_NAME, a.warmup_requests)
        wait_idle(client, 30)
        rec["gpu_memory_before_mib"] = gpu_memory_used_mib()
        before = server_state(client) or {}
        mixes = [RequestMix(model=SERVED_NAME, vocab=a.vocab, max_model_len=a.max_model_len,
                            prompt_range=a.prompt_range, output_range=a.output_range, tokenizer=True,
                            seed=a.seed * 100003 + i, start=i) for i in range(a.max_concurrency)]
        n = concurrency_for(kv_tokens, mixes[0], a.overload, a.max_concurrency)
        rec["clients"] = n
        clock.log(f"[{name}] healthy after {rec['start_s']:.0f} s; KV {kv_tokens} tokens; warm-up "
                  f"{rec['warmup']['ok']}/{rec['warmup']['requests']} ok; {n} clients for {a.load_s:.0f} s")
        tally = Tally()
        load = Load(client, mixes[:n], tally, kv_tokens, alive=lambda: srv.proc.poll() is None)
        rec["load"] = load.run(a.load_s, a.drain_timeout_s)
        rec["load"]["sample_series"] = load.samples[:: max(1, len(load.samples) // 60)]
        idle = after = None
        if load.death is None:
            idle = wait_idle(client, max(5.0, a.drain_timeout_s - rec["load"]["client_drain_s"]))
            rec["probe_status"] = probe(client, SERVED_NAME).status
            for _ in range(10):  # the stats of the probe's last step reach /metrics with its output
                time.sleep(0.5)
                after = server_state(client)
                if after and after["kv_usage"] is not None and after["kv_usage"] <= 1e-6:
                    break
        rec["gpu_memory_after_mib"] = gpu_memory_used_mib()
        rec["tally"] = tally.summary()
        rec["idle_after_drain"] = idle
        rec["kv_usage_after_drain"] = after.get("kv_usage") if after else None
        if after and before:
            rec["preemptions"] = int(round((after["preemptions"] or 0) - (before.get("preemptions") or 0)))
            rec["finished_by_reason"] = {k: int(round(v - before.get("finished", {}).get(k, 0.0)))
                                         for k, v in after["finished"].items()}
        b, f = rec["gpu_memory_before_mib"], rec["gpu_memory_after_mib"]
        rec["gpu_memory_growth_mib"] = None if b is None or f is None else round(f - b, 1)
        health = client.get("/health")[0]
        death = load.death or (None if srv.proc.poll() is None else f"server exited ({srv.proc.returncode})")
        death = death or (None if health == 200 else f"/health answered {health}")
        rec["death"] = death
    except Exception as e:  # noqa: BLE001 - recorded; the next configuration still runs
        text = str(e).splitlines()[0][:300] if str(e) else ""
        rec["error"] = text if isinstance(e, (RuntimeError, OSError, BenchError)) else f"{type(e).__name__}: {text}"
        clock.log(f"[{name}] failed: {rec['error']}")
    finally:
        srv.stop()
        fatal = fatal_in_log(log_path)
        if fatal and not rec.get("death"):
            rec["death"] = f"log: {fatal}"
        rec["engine_deaths"] = int(bool(rec.get("death")))
        rec["seconds"] = round(time.monotonic() - t0, 1)
    rec["pass"], rec["why"] = verdict(rec, a)
    clock.log(f"[{name}] {'PASS' if rec['pass'] else 'FAIL'}" + ("" if rec["pass"] else f": {'; '.join(rec['why'])}"))
    return rec


def server_cmd(a, model_dir: str, port: int, harness_flags: list[str], config_flags=()) -> list[str]:
    return ([sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model_dir, "--host", "127.0.0.1",
             "--port", str(port)] + CONTEST_SERVER_FLAGS + a.profile_args
            + ["--max-model-len", str(a.max_model_len), "--load-format", "dummy"]
            + list(harness_flags) + ATTN_FLAGS + list(config_flags) + a.extra_flags)


# ================================================================================================ report
def fmt(x, nd=2) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def summary_table(configs: list[dict]) -> list[str]:
    rows = ["| config | completed | 4xx (as expected) | unexpected | 5xx | engine deaths | KV usage after drain | "
            "GPU mem before -> after (MiB) | preemptions | KV demand / capacity | verdict |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in configs:
        if r.get("error") and "tally" not in r:
            rows.append(f"| {r['config']} | - | - | - | - | {r.get('engine_deaths', 0)} | - | - | - | - | "
                        f"FAIL ({r['error'][:80]}) |")
            continue
        if r.get("skipped"):
            rows.append(f"| {r['config']} | - | - | - | - | - | - | - | - | - | skipped ({r['skipped'][:80]}) |")
            continue
        if "tally" not in r or "load" not in r:
            rows.append(f"| {r['config']} | - | - | - | - | {r.get('engine_deaths', 0)} | - | - | - | - | "
                        f"FAIL ({'; '.join(r.get('why') or ['no load phase'])[:80]}) |")
            continue
        t, ld = r["tally"], r["load"]
        mem = f"{fmt(r.get('gpu_memory_before_mib'), 0)} -> {fmt(r.get('gpu_memory_after_mib'), 0)}"
        rows.append(f"| {r['config']} | {t['completed']} | {t['rejected_4xx']} | {t['unexpected']} | {t['http_5xx']} | "
                    f"{r['engine_deaths']} | {fmt(r.get('kv_usage_after_drain'), 4)} | {mem} | "
                    f"{fmt(r.get('preemptions'))} | {fmt(ld.get('demand_ratio_mean'))}x (peak "
                    f"{fmt(ld.get('demand_ratio_peak'))}x) | {'PASS' if r['pass'] else 'FAIL'} |")
    return rows


def markdown(doc: dict) -> list[str]:
    a = doc["args"]
    lines = [f"# Serving robustness (issue #20): {doc['variant']}", "", f"Command: `{doc['command']}`", "",
             f"{doc['time']}, {doc['gpu']}; {a['layers']} layers of dummy Qwen3.5-27B, dcu64 KV budget "
             f"({doc['kv_cache_memory_bytes']} B), max-model-len {a['max_model_len']}, official start_vllm.sh flags "
             f"+ the harness's + {' '.join(ATTN_FLAGS)}; load {a['load_s']} s per configuration at "
             f"{a['overload']}x the KV capacity (prompts {a['prompt_tokens']} tokens, outputs {a['output_tokens']}); "
             f"mix {', '.join(f'{k} {int(w * 100)}%' for k, w in MIX)}; elapsed {doc.get('elapsed_s')} s.", "",
             "## Summary", ""] + summary_table(doc["configs"])
    ran = [r for r in doc["configs"] if "tally" in r]
    if ran:
        kinds = sorted({k for r in ran for k in r["tally"]["sent_by_kind"]})
        lines += ["", "## Requests by kind (sent / completed or refused as expected / unexpected / 5xx)", "",
                  "| kind | " + " | ".join(r["config"] for r in ran) + " |", "|---|" + "---|" * len(ran)]
        for k in kinds:
            cells = []
            for r in ran:
                t = r["tally"]
                good = t["completed_by_kind"].get(k, 0) + t["rejected_by_kind"].get(k, 0) + (
                    t["disconnects"] if k == "disconnect" else 0)
                cells.append(f"{t['sent_by_kind'].get(k, 0)} / {good} / {t['unexpected_by_kind'].get(k, 0)} / "
                             f"{t['http_5xx_by_kind'].get(k, 0)}")
            lines.append(f"| {k} | " + " | ".join(cells) + " |")
        lines += ["", "## Per configuration", ""]
        for r in ran:
            ld = r["load"]
            lines.append(f"- **{r['config']}** ({r['what']}): start {r.get('start_s')} s, KV capacity "
                         f"{r.get('kv_capacity_tokens')} tokens, {ld['clients']} clients, load {ld['load_s']} s, "
                         f"clients drained in {ld['client_drain_s']} s, "
                         f"KV usage peak {fmt(ld.get('kv_usage_peak'), 3)}, "
                         f"finished by reason {r.get('finished_by_reason')}, disconnects {r['tally']['disconnects']}, "
                         f"timeouts {r['tally']['timeouts']}, transport errors {r['tally']['transport_errors']}, "
                         f"GPU memory idle {fmt(r.get('gpu_memory_idle_mib'), 0)} MiB, growth "
                         f"{fmt(r.get('gpu_memory_growth_mib'), 0)} MiB; "
                         + ("PASS" if r["pass"] else "FAIL: " + "; ".join(r["why"])))
            for key in ("unexpected", "5xx", "transport"):
                for ex in r["tally"]["examples"][key]:
                    lines.append(f"  - {key}: `{ex}`")
    lines += ["", f"Verdict: {'PASS' if doc['pass'] else 'FAIL'} (engine deaths 0, no 5xx, nothing unexpected, "
                  f"KV usage 0 after the drain, GPU memory growth <= {a['mem_tolerance_mib']} MiB, offered KV demand "
                  f">= 2x capacity, in every configuration)"]
    return lines


# ================================================================================================ main
class Clock:
    def __init__(self):
        self.t0 = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def log(self, msg: str) -> None:
        e = int(self.elapsed())
        print(f"[robust +{e // 60:02d}:{e % 60:02d}] {msg}", flush=True)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="Serving robustness: overload + malformed requests + disconnects "
                                             "against vllm serve; counts, engine deaths, KV and GPU memory after.")
    ap.add_argument("--configs", default="bf16,int8", help="comma list of " + ", ".join(CONFIGS))
    ap.add_argument("--variant", default=None, help="harness variant (default: the bundle's default)")
    ap.add_argument("--layers", type=int, default=4, help="dummy model layers, a multiple of 4 in [4, 16]")
    ap.add_argument("--load-s", type=float, default=60.0, help="seconds of load per configuration")
    ap.add_argument("--drain-timeout-s", type=float, default=45.0)
    ap.add_argument("--max-model-len", type=int, default=16384)
    ap.add_argument("--prompt-tokens", default="2048-6144", help="LO-HI prompt tokens of normal requests")
    ap.add_argument("--output-tokens", default="32-160", help="LO-HI max_tokens of normal requests (ignore_eos)")
    ap.add_argument("--overload", type=float, default=2.2,
                    help="KV tokens the in-flight requests may need, as a multiple of the KV capacity (>= 2)")
    ap.add_argument("--max-concurrency", type=int, default=192, help="most client threads")
    ap.add_argument("--warmup-requests", type=int, default=WARMUP_REQUESTS,
                    help="concurrent short requests before GPU memory 'before' (default: max-num-seqs)")
    ap.add_argument("--mem-tolerance-mib", type=float, default=128.0,
                    help="GPU memory growth from after the warm-up to after the drain that still passes")
    ap.add_argument("--kv-gib", type=float, default=None, help="dcu64: KV GiB of the full 64-layer model")
    ap.add_argument("--extra-flags", default="", help="more `vllm serve` flags for every configuration")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--deadline-s", type=float, default=float(os.environ.get("LEFT_S") or 510),
                    help="seconds after start by which the run must be done: a configuration that would not "
                         "finish is skipped (recorded); default $LEFT_S or 510")
    ap.add_argument("--start-timeout-s", type=float, default=330.0)
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(REPO, "bench", "results"))
    ap.add_argument("--work", default=os.path.join(os.environ.get("BENCH_WORK", "/tmp/vllm-dcu-bench"), "robustness"))
    ap.add_argument("--gpu", default=None, help="GPU label for file names (default: from nvidia-smi)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the server commands, run nothing")
    return ap


def check_args(a) -> None:
    a.config_list = [c.strip() for c in a.configs.split(",") if c.strip()]
    bad = [c for c in a.config_list if c not in CONFIGS]
    if bad or not a.config_list:
        raise BenchError(f"unknown configuration {','.join(bad) or '(none)'}; supported: {', '.join(CONFIGS)}")
    if len(set(a.config_list)) != len(a.config_list):
        raise BenchError(f"--configs names a configuration twice: {a.configs}")
    if a.layers not in (4, 8, 12, 16):
        raise BenchError(f"--layers must be 4, 8, 12 or 16, got {a.layers}")
    if not 5 <= a.load_s <= 600:
        raise BenchError(f"--load-s must be in [5, 600], got {a.load_s:g}")
    if not 2.0 <= a.overload <= 10.0:
        raise BenchError(f"--overload must be in [2, 10] (the load must reach 2x the KV capacity), got {a.overload:g}")
    if not 4 <= a.max_concurrency <= 512:
        raise BenchError(f"--max-concurrency must be in [4, 512], got {a.max_concurrency}")
    if not 1 <= a.warmup_requests <= 512:
        raise BenchError(f"--warmup-requests must be in [1, 512], got {a.warmup_requests}")
    if a.drain_timeout_s < 5 or a.deadline_s < 60:
        raise BenchError("--drain-timeout-s must be >= 5 and --deadline-s >= 60")
    a.prompt_range = parse_range(a.prompt_tokens, "--prompt-tokens")
    a.output_range = parse_range(a.output_tokens, "--output-tokens")
    if a.prompt_range[1] + a.output_range[1] >= a.max_model_len:
        raise BenchError(f"--prompt-tokens up to {a.prompt_range[1]} plus --output-tokens up to {a.output_range[1]} "
                         f"do not fit --max-model-len {a.max_model_len}")
    try:
        a.profile_args = profiles.profile_server_args("dcu64", a.layers, a.kv_gib)
    except ValueError as e:
        raise BenchError(str(e)) from None
    try:
        a.extra_flags = shlex.split(a.extra_flags)
    except ValueError as e:
        raise BenchError(f"--extra-flags: {e}") from None
    a.vocab = VOCAB


def _patch_key(name: str) -> str:
    return re.sub(r"^\d+-", "", name).removesuffix(".patch")


def run(a, clock: Clock) -> int:
    harness = load_harness()
    names = list(harness.variants())
    if not names:
        raise BenchError("the harness lists no variants; bundle a wheel with python -m ci.gpu.bundle --wheel ...")
    a.variant = a.variant or (harness.default_variant() if hasattr(harness, "default_variant") else names[-1])
    if a.variant not in names:
        raise BenchError(f"unknown variant {a.variant}; available: {', '.join(names)}")
    patches = variant_patches(harness, a.variant)
    keys = None if patches is None else {_patch_key(p) for p in patches}
    a.harness_flags = harness_serve_args(harness, "decode-graph", CAPTURE_SIZES)
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    gpu = a.gpu or ("h200" if a.dry_run else gpu_label())
    stem = f"{date}-{gpu}-serve-robustness"
    model_dir = os.path.join(a.work, f"model-l{a.layers}")
    prefix = "bash ci/gpu/run.sh python" if os.environ.get("VLLM_DCU_VARIANT") else "python"
    command = f"{prefix} bench/serve_robustness.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    clock.log(f"plan: variant {a.variant}; configurations {', '.join(a.config_list)}; {a.layers} layers; load "
              f"{a.load_s:g} s each at {a.overload:g}x KV capacity; deadline {a.deadline_s:.0f} s")
    if a.dry_run:
        for name in a.config_list:
            print(f"server {name}: " + shlex.join(server_cmd(a, model_dir, 8001, a.harness_flags,
                                                               CONFIGS[name].flags)))
        return 0
    os.makedirs(a.out, exist_ok=True)
    log_dir = os.path.join(a.out, "raw", stem, "logs")  # under $OUT, so the logs come back from the GPU box
    os.makedirs(log_dir, exist_ok=True)
    harness_write_config(harness, model_dir, a.layers)
    write_tokenizer(model_dir)
    doc = {"command": command, "stem": stem, "date": date, "gpu": gpu, "variant": a.variant,
           "variant_patches": patches, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
           "args": {k: v for k, v in vars(a).items() if isinstance(v, (str, int, float, bool, list, type(None)))},
           "kv_cache_memory_bytes": profiles.dcu64_kv_bytes(a.layers, a.kv_gib), "mix": dict(MIX),
           "server_flags": CONTEST_SERVER_FLAGS + a.profile_args + a.harness_flags + ATTN_FLAGS + a.extra_flags,
           "configs": [], "pass": False}
    doc["args"]["prompt_tokens"], doc["args"]["output_tokens"] = a.prompt_tokens, a.output_tokens

    def save():
        doc["elapsed_s"] = round(clock.elapsed(), 1)
        doc["pass"] = bool(doc["configs"]) and all(r.get("pass") for r in doc["configs"])
        return write_result_pair(a.out, stem, doc, markdown(doc))

    spent: list[float] = []
    for name in a.config_list:
        spec = CONFIGS[name]
        missing = [n for n in spec.needs if keys is not None and n not in keys]
        if missing:
            doc["configs"].append({"config": name, "what": spec.what, "skipped": f"variant {a.variant} lacks "
                                   f"patch(es) {', '.join(missing)}", "pass": False, "why": ["skipped"]})
            clock.log(f"[{name}] skipped: the build lacks {', '.join(missing)}")
            save()
            continue
        # a fresh machine's first start pays the Triton JIT (2-4 min); a later one takes ~1 min, plus warm-up,
        # load, drain and stop: the estimate is the last configuration after the first, or that sum
        need = spent[-1] if len(spent) > 1 else CONFIG_OVERHEAD_S + a.load_s
        left = a.deadline_s - clock.elapsed()
        if spent and need > left:
            doc["configs"].append({"config": name, "what": spec.what, "skipped": f"deadline: ~{need:.0f} s "
                                   f"needed, {left:.0f} s left", "pass": False, "why": ["skipped"]})
            clock.log(f"[{name}] skipped: ~{need:.0f} s needed, {left:.0f} s left before the deadline")
            save()
            continue
        t0 = time.monotonic()
        doc["configs"].append(run_config(name, a, harness, model_dir, log_dir, clock))
        spent.append(time.monotonic() - t0)
        md = save()
    md = save()
    clock.log(f"wrote {os.path.join(a.out, stem)}.json and {md}")
    print("\n".join(summary_table(doc["configs"])), flush=True)
    return 0 if doc["pass"] else 1


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    clock = Clock()
    try:
        check_args(a)
        return run(a, clock)
    except BenchError as e:
        print(f"serve_robustness: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
