"""What the serving benchmark reads back: the server's log and Prometheus counters, `vllm bench serve`'s result
file, and the step's JSON record that collects them."""
from __future__ import annotations

import json
import os
import re
import urllib.request


def memory_overhead_gib(info: dict, total_gib: float | None, utilization: float = 0.95) -> float | None:
    """What the server kept outside weights and KV cache (activation peak + non-torch memory), in GiB:
    utilization x card - weights - KV. Measured here, it checks the dcu64 estimate (bench/profiles.py)."""
    if total_gib is None or "weights_gib" not in info or "kv_cache_gib" not in info:
        return None
    return round(utilization * total_gib - info["weights_gib"] - info["kv_cache_gib"], 2)


_LOG_PATTERNS = {
    "weights_gib": r"Model loading took ([\d.]+) GiB",
    "kv_cache_gib": r"Available KV cache memory: ([\d.]+) GiB",
    "kv_cache_tokens": r"GPU KV cache size: ([\d,]+) tokens",
    "max_concurrency_x": r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x",
    "engine_init_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
    "compile_s": r"torch\.compile took ([\d.]+) s in total",
    "graph_capture_s": r"Graph capturing finished in ([\d.]+) secs",
    "graph_capture_gib": r"Graph capturing finished in [\d.]+ secs, took ([\d.]+) GiB",
    "vllm_version": r"vLLM (?:API )?server version ([^\s,]+)",
}


def parse_server_log(text: str) -> dict:
    out = {}
    for key, pat in _LOG_PATTERNS.items():
        m = re.findall(pat, text)
        if m:
            v = m[-1].replace(",", "")
            try:
                out[key] = float(v) if key != "vllm_version" else v
            except ValueError:
                out[key] = v
    return out


# Server-side Prometheus counters recorded around each benchmark (their increase over the run, warm-ups included):
# what the client's latencies cannot show, e.g. requests preempted (and recomputed) when the KV cache runs out.
SERVER_COUNTERS = {"vllm:num_preemptions_total": "preemptions", "vllm:prompt_tokens_total": "prompt_tokens",
                   "vllm:generation_tokens_total": "generation_tokens",
                   "vllm:prefix_cache_queries_total": "prefix_cache_queries",
                   "vllm:prefix_cache_hits_total": "prefix_cache_hits"}


def parse_counters(text: str) -> dict[str, float]:
    """{short name: value summed over label sets} of SERVER_COUNTERS in a Prometheus text exposition."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m and m.group(1) in SERVER_COUNTERS:
            try:
                out[SERVER_COUNTERS[m.group(1)]] = out.get(SERVER_COUNTERS[m.group(1)], 0.0) + float(m.group(3))
            except ValueError:
                continue
    return out


def scrape_counters(port: int) -> dict[str, float] | None:
    """The server's SERVER_COUNTERS now, or None when /metrics cannot be read (informational only)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return parse_counters(r.read().decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None


def counter_increase(before: dict | None, after: dict | None) -> dict | None:
    if before is None or after is None:
        return None
    return {k: int(round(after[k] - before.get(k, 0.0))) for k in after}


BENCH_KEYS = ["completed", "failed", "duration", "total_input_tokens", "total_output_tokens",
              "request_throughput", "output_throughput", "total_token_throughput", "request_rate",
              "max_concurrency", "max_concurrent_requests"]


def summarize_bench(raw: dict) -> tuple[dict, dict]:
    """(metrics, per_request) from a `vllm bench serve --save-detailed` result."""
    m = {k: raw.get(k) for k in BENCH_KEYS}
    for k, v in raw.items():
        if re.fullmatch(r"(mean|median|std|p[\d.]+)_(ttft|tpot|itl|e2el)_ms", k):
            m[k] = v
    per = {}
    ttfts, itls, outs = raw.get("ttfts") or [], raw.get("itls") or [], raw.get("output_lens") or []
    errors = raw.get("errors") or [""] * len(ttfts)
    if ttfts:
        per["ttft_ms"] = [round(t * 1000, 3) for t, e in zip(ttfts, errors) if not e]
        tpots = []
        for t_itl, n, e in zip(itls, outs, errors):
            if not e and n and n > 1:
                tpots.append(round(sum(t_itl) * 1000 / (n - 1), 4))
        per["tpot_ms"] = tpots
        per["input_len"] = raw.get("input_lens") or []
        per["output_len"] = outs
    return m, per


class Results:
    """The step's JSON, rewritten after every run so a killed command still leaves it."""

    def __init__(self, path: str, header: dict):
        self.path = path
        self.doc = dict(header, runs=[], skipped=[])

    def add(self, run: dict) -> None:
        self.doc["runs"].append(run)
        self.save()

    def skip(self, what: str, why: str) -> None:
        self.doc["skipped"].append({"what": what, "why": why})
        self.save()

    def save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.doc, f, indent=1)
        os.replace(tmp, self.path)
