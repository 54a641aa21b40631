"""The robustness benchmark's clients: the request mix (normal requests and every malformed case of
bench/bad_requests.py), an HTTP client that can hang up mid-stream, and the tally of what came back."""
from __future__ import annotations

import http.client
import json
import math
import random
import re
import threading
import time
from dataclasses import dataclass, field

from bench import bad_requests
from bench.serve_config import BenchError
from bench.synth_tokenizer import ENGLISH_WORDS

# request mix (shares of all requests); malformed requests cycle through bench/bad_requests.py
MIX = (("completion", 0.55), ("chat", 0.15), ("stream", 0.10), ("disconnect", 0.10), ("malformed", 0.10))
NORMAL_KINDS = ("completion", "chat", "stream", "disconnect")
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


