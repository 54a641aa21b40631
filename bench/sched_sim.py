"""Scheduler simulator: vLLM's real (patched) V1 scheduler on a simulated clock with a synthetic device.

The scheduler is driven the way EngineCore drives it (schedule -> execute -> update_from_output; with async
scheduling a two-deep batch queue), and each step's time comes from a step-time model of the device instead of a
model run. The CPU tests of patch 0004 (tests/test_scheduler_dcu.py) are built on it, and the command line runs
serving scenarios: the upstream scheduler against --scheduler-tpot-target-ms targets, over request rates, on the
KV cache a 64 GB DCU leaves, with a device calibrated to step times measured on the H200. A simulation, not a
measurement: it says what the scheduling policy does; the GPU serving benchmark (bench/serve_bench.py) says
what it is worth.

    python bench/sched_sim.py --scenario dcu64-16-32K --rates 0.25,0.6 --targets off,30,60,120 --seeds 3

Uses the tests' patched tree build/test-tree (built or refreshed on first use, ~20 s; VLLM_DCU_TREE=DIR to choose).
Writes <date>-cpu-sched-sim-<scenario>.{json,md} into --out (bench/results/).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import random
import sys
from collections import deque
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "scheduler"


def _ensure_tree() -> None:
    """Put a patched vLLM tree first on sys.path unless `import vllm` already finds one with patch 0004 (as under
    pytest): VLLM_DCU_TREE, else the tests' build/test-tree, rebuilt by the build tool when the patches changed."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        try:
            if importlib.util.find_spec("vllm.v1.core.sched.dcu_tpot_budget") is not None:
                return
        except ModuleNotFoundError:
            pass
    tree = os.environ.get("VLLM_DCU_TREE")
    if not tree:
        sys.path.insert(0, str(REPO / "tools"))
        import vllm_dcu_build

        sys.path.remove(str(REPO / "tools"))
        try:
            tree = str(vllm_dcu_build.prepared_tree(REPO / "build" / "test-tree"))
        except vllm_dcu_build.BuildError as e:
            raise SystemExit(f"sched_sim: error: {str(e).splitlines()[0]}") from None
    if not (Path(tree) / "vllm" / "v1" / "core" / "sched" / "dcu_tpot_budget.py").is_file():
        raise SystemExit(f"sched_sim: error: {tree} has no patch 0004 (vllm/v1/core/sched/dcu_tpot_budget.py)")
    sys.path.insert(0, str(tree))


_ensure_tree()
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched import async_scheduler as async_mod  # noqa: E402
from vllm.v1.core.sched import scheduler as sched_mod  # noqa: E402
from vllm.v1.core.sched.dcu_tpot_budget import final_token_in_flight, is_prefilling  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

init_none_hash(sha256)


# ------------------------------------------------------------------------------------------ scheduler setup

def make_scheduler(*, hybrid: bool = False, async_sched: bool = False, target: float | None = None,
                   min_prefill: int = 0, max_num_seqs: int = 32, max_batched: int = 2048, num_blocks: int = 4000,
                   block_size: int | None = None, policy: str = "fcfs", max_model_len: int = 65536, cls=None,
                   prefix_caching: bool | None = None, gdn_groups: int = 1, cap_when: str = "kv-pressure"):
    """A real (patched) Scheduler or AsyncScheduler over a KV cache of num_blocks blocks.

    hybrid: Qwen3.5-27B's text config (an attention group plus gdn_groups Gated DeltaNet groups sharing the block
    pool, as vLLM groups a hybrid model's layers); prefix caching on (the default for hybrid) puts it in "align"
    mode, off in "none" mode (one state block per request and group), which is how `vllm serve` runs it here."""
    if prefix_caching is None:
        prefix_caching = hybrid
    model = DATA / ("qwen35-27b-text" if hybrid else "llama-tiny")
    model_config = ModelConfig(model=str(model), dtype="bfloat16", seed=0, skip_tokenizer_init=True,
                               max_model_len=max_model_len)
    cache_kwargs = dict(mamba_ssm_cache_dtype="float32") if hybrid else {}
    cache_config = CacheConfig(block_size=16, enable_prefix_caching=prefix_caching, cache_dtype="auto",
                               **cache_kwargs)
    sched_config = SchedulerConfig(max_model_len=max_model_len, is_encoder_decoder=False, max_num_seqs=max_num_seqs,
                                   max_num_batched_tokens=max_batched, enable_chunked_prefill=True,
                                   async_scheduling=async_sched, policy=policy, scheduler_tpot_target_ms=target,
                                   scheduler_min_prefill_tokens=min_prefill, scheduler_tpot_cap_when=cap_when)
    vllm_config = VllmConfig(model_config=model_config, cache_config=cache_config, scheduler_config=sched_config,
                             device_config=DeviceConfig(device="cpu"))
    if hybrid:
        assert cache_config.mamba_cache_mode == ("align" if prefix_caching else "none")
        if block_size is not None:  # e.g. 1552, the fp8-KV block size of Qwen3.5-27B
            cache_config.block_size = cache_config.mamba_block_size = block_size
    elif block_size is not None:
        cache_config.block_size = block_size
    block = cache_config.block_size
    cache_config.num_gpu_blocks = num_blocks
    attn = FullAttentionSpec(block_size=block, num_kv_heads=1, head_size=1, dtype=torch.float32)
    groups = [KVCacheGroupSpec(["model.layers.3.self_attn.attn"], attn)]
    if hybrid:
        for g in range(gdn_groups):
            groups.append(KVCacheGroupSpec([f"model.layers.{g}.linear_attn"], MambaSpec(
                block_size=block, shapes=((3, 8), (2, 4, 4)), dtypes=(torch.float16, torch.float32),
                page_size_padded=attn.page_size_bytes, mamba_type="gdn_attention",
                mamba_cache_mode=cache_config.mamba_cache_mode)))
    kv_cache_config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    if cls is None:
        cls = async_mod.AsyncScheduler if async_sched else sched_mod.Scheduler
    return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
               structured_output_manager=StructuredOutputManager(vllm_config), block_size=block, log_stats=True)


STOP_TOKEN = 2  # what the simulated model emits as a request's last token when its max_tokens is only a ceiling


def make_request(rid: str, prompt_len: int, max_tokens: int, block: int, arrival: float = 0.0,
                 priority: int = 0, stops: bool = False) -> Request:
    """stops: the request ends at STOP_TOKEN (like a real model at EOS) and max_tokens is only a ceiling."""
    rng = random.Random(rid)
    prompt = [rng.randrange(1, 1000) for _ in range(prompt_len)]
    sp = (SamplingParams(max_tokens=max_tokens, stop_token_ids=[STOP_TOKEN]) if stops
          else SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return Request(request_id=rid, prompt_token_ids=prompt, sampling_params=sp, pooling_params=None,
                   arrival_time=arrival, priority=priority, block_hasher=get_request_block_hasher(block, sha256))


def workload(n: int, prompt_range: tuple[int, int], out_range: tuple[int, int], mean_gap_s: float,
             seed: int = 0) -> list[tuple[float, str, int, int]]:
    """(arrival_s, id, prompt_len, output_len), Poisson arrivals."""
    rng = random.Random(seed)
    t, items = 0.0, []
    for i in range(n):
        items.append((t, f"r{i:03d}", rng.randint(*prompt_range), rng.randint(*out_range)))
        t += rng.expovariate(1.0 / mean_gap_s) if mean_gap_s > 0 else 0.0
    return items


# ---------------------------------------------------------------------------------- synthetic device model

class SyntheticDevice:
    """Step time (ms) = base + per token + per request + decode KV read + prefill attention, with noise.
    Deliberately not of the controller's exact form: the prefill attention term is superlinear in the chunk."""

    def __init__(self, base=8.0, per_token=0.05, per_req=0.05, per_kv=1e-5, per_pair=2e-8, noise=0.3, seed=1,
                 mixed_ms=0.0, superlinear=1.0 / 8192):
        self.base, self.per_token, self.per_req, self.mixed_ms = base, per_token, per_req, mixed_ms
        self.superlinear = superlinear
        self.per_kv, self.per_pair, self.noise = per_kv, per_pair, noise
        self.rng = random.Random(seed)

    def decode_ms(self, n_dec: int, kv: int) -> float:
        return self.base + self.per_token * n_dec + self.per_req * n_dec + self.per_kv * kv

    def step_ms(self, batch: list[tuple[int, int, bool]]) -> float:
        """batch: (pos_before, n_tokens, is_prefill) per scheduled request."""
        t = self.base + self.per_token * sum(n for _, n, _ in batch) + self.per_req * len(batch)
        if any(pre for _, _, pre in batch):
            t += self.mixed_ms  # no full CUDA graph for a batch with prefill: a fixed launch cost
        for pos, n, pre in batch:
            if pre:
                t += self.per_pair * n * (pos + n / 2.0) * (1.0 + n * self.superlinear)
            else:
                t += self.per_kv * (pos + n)
        return t * (1.0 + self.rng.gauss(0.0, self.noise / 100.0)) + abs(self.rng.gauss(0.0, self.noise))


# ----------------------------------------------------------------------------------------------- the driver

class Sim:
    """Drives a scheduler like EngineCore.step (sync) or step_with_batch_queue (async, two batches in flight)."""

    def __init__(self, sched, device: SyntheticDevice | None = None, async_sched: bool = False,
                 max_tokens_unset: bool = False):
        """max_tokens_unset: requests carry the OpenAI server's default max_tokens (max_model_len - prompt) and
        stop at their workload length with a stop token, as clients that set no max_tokens see it."""
        self.sched = sched
        self.max_tokens_unset = max_tokens_unset
        self.out_len: dict[str, int] = {}
        self.emitted: dict[str, int] = {}
        self.device = device or SyntheticDevice()
        self.async_sched = async_sched
        self.now = 0.0
        self.gpu_free = 0.0
        self.budget = getattr(sched, "tpot_budget", None)  # absent on the unpatched scheduler
        if self.budget is not None:
            self.budget.clock = lambda: self.now
        self.steps: list[dict] = []
        self.token_times: dict[str, list[float]] = {}
        self.finished: dict[str, float] = {}
        self.arrival: dict[str, float] = {}

    def _launch(self):
        sched = self.sched
        # running decodes that need a token this step (async scheduling skips one whose last token is in flight)
        decoding_before = [r.request_id for r in sched.running
                           if not is_prefilling(r) and not final_token_in_flight(r)]
        so = sched.schedule()
        batch, tokens = [], {}
        for rid, n in so.num_scheduled_tokens.items():
            req = sched.requests[rid]
            pos = req.num_computed_tokens - n  # _update_after_schedule already advanced it
            pre = n > 1 or req.is_prefill_chunk
            batch.append((pos, n, pre))
            if req.is_prefill_chunk:
                tokens[rid] = []
            else:
                self.emitted[rid] = self.emitted.get(rid, 0) + 1
                last = self.max_tokens_unset and self.emitted[rid] >= self.out_len[rid]
                tokens[rid] = [STOP_TOKEN if last else 7]
        dur = self.device.step_ms(batch) / 1e3 if batch else 0.0
        start = max(self.now, self.gpu_free)
        done = start + dur
        self.gpu_free = done
        cap = self.budget.step_cap if self.budget is not None else None
        self.steps.append({
            "sched": dict(so.num_scheduled_tokens), "order": list(so.num_scheduled_tokens),
            "preempted": sorted(so.preempted_req_ids), "decoding_before": decoding_before,
            "running_after": [(r.request_id, is_prefilling(r)) for r in sched.running],
            "total": so.total_num_scheduled_tokens, "ms": dur * 1e3,
            "prefill_tokens": sum(n for (_, n, pre) in batch if pre),
            "n_decodes": sum(1 for (_, _, pre) in batch if not pre), "cap": cap,
            "waiting": len(sched.waiting),
        })
        return so, tokens, done

    def _complete(self, so, tokens, done):
        self.now = max(self.now, done)
        ids = list(so.num_scheduled_tokens)
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=[tokens[r] for r in ids], logprobs=None,
                                prompt_logprobs_dict={}, pooler_output=[])
        outs = self.sched.update_from_output(so, mro)
        for eco in outs.values():
            for o in eco.outputs:
                if o.new_token_ids:
                    self.token_times.setdefault(o.request_id, []).extend([self.now] * len(o.new_token_ids))
                if o.finish_reason is not None:
                    self.finished[o.request_id] = self.now

    def run(self, items, max_steps: int = 20000):
        sched = self.sched
        block = sched.block_size
        pending = deque(sorted(items))
        queue: deque = deque()
        for _ in range(max_steps):
            while pending and pending[0][0] <= self.now:
                t, rid, plen, out = pending.popleft()
                self.arrival[rid] = t
                self.out_len[rid] = out
                if self.max_tokens_unset:
                    sched.add_request(make_request(rid, plen, sched.max_model_len - plen, block, arrival=t,
                                                   stops=True))
                else:
                    sched.add_request(make_request(rid, plen, out, block, arrival=t))
            if not sched.has_requests() and not queue:
                if not pending:
                    return self
                self.now = pending[0][0]
                continue
            if not self.async_sched:
                self._complete(*self._launch())
                continue
            if sched.has_requests():
                entry = self._launch()
                queue.append(entry)
                if entry[0].total_num_scheduled_tokens > 0 and len(queue) < 2 and queue[0][2] > self.now:
                    continue
            if queue:
                self._complete(*queue.popleft())
        raise AssertionError(f"workload did not finish in {max_steps} steps")

    # -- metrics
    def itls(self) -> list[float]:
        out = []
        for ts in self.token_times.values():
            out += [b - a for a, b in zip(ts, ts[1:])]
        return out

    def tpot(self) -> dict[str, float]:
        return {r: (ts[-1] - ts[0]) / (len(ts) - 1) for r, ts in self.token_times.items() if len(ts) > 1}


def trace_of(sim: Sim) -> list[tuple]:
    return [(s["order"], s["sched"], s["preempted"]) for s in sim.steps]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# ------------------------------------------------------------------------------------------ command line

# Step times of the 16-layer Qwen3.5-27B-shaped model on the H200, fitted by patch 0004's step-time model on the
# real engine (bench/results/2026-11-30-h200-gpu-sched-tpot-test.md: 4.68 ms + 40.6 ms per 1024 tokens + 9.2 ms
# per 64 requests + 65.9 ms per 2^26 prefill query-key pairs; residual 2.5 ms over 380 steps).
# mixed_ms: the fixed cost of a step that carries prefill work in the harness's decode-graph mode (eager prefill, no
# CUDA graph): 24 ms reproduces the two served runs of the budget at target 30 ms (2026-11-30, 16-32K, dcu64:
# 0.25 req/s TPOT P99 42.6 simulated vs 43.8 ms measured, TTFT P99 6.9 vs 6.5 s; 0.6 req/s TPOT P99 42.9 vs 46.9 ms,
# TTFT P99 26.8 vs 28.4 s, 0 preemptions in both); without it the simulator missed the cost of small chunks.
H200_L16 = dict(base=4.7, per_token=40.6 / 1024, per_req=9.2 / 64, per_kv=0.0, per_pair=65.9 / (1 << 26),
                superlinear=0.0, mixed_ms=24.0)

# name: (make_scheduler kwargs, prompt length range, output tokens)
SCENARIOS = {
    # `vllm serve` on the KV cache a 64 GB DCU leaves, scaled to 16 layers (bench/profiles.py dcu64: 1.77 GiB
    # = 148 blocks of 784 tokens shared by the attention group and three Gated DeltaNet groups; prefix caching
    # off, as serve ran it), contest scheduler flags, async scheduling.
    "dcu64-16-32K": (dict(hybrid=True, prefix_caching=False, gdn_groups=3, num_blocks=148, block_size=784,
                          max_batched=4096, max_num_seqs=128, async_sched=True, max_model_len=32768),
                     (16384, 32768 - 1024), 250),
    "dcu64-8-16K": (dict(hybrid=True, prefix_caching=False, gdn_groups=3, num_blocks=148, block_size=784,
                         max_batched=4096, max_num_seqs=128, async_sched=True, max_model_len=32768),
                    (8192, 16384), 250),
}


def poisson_items(scenario: str, rate: float, n: int, seed: int) -> list[tuple[float, str, int, int]]:
    _, prompt_range, out_len = SCENARIOS[scenario]
    rng = random.Random(seed)
    t, items = 0.0, []
    for i in range(n):
        items.append((t, f"r{i:03d}", rng.randint(*prompt_range), out_len))
        t += rng.expovariate(rate)
    return items


def replay_items(path: str) -> list[tuple[float, str, int, int]]:
    """Arrival offsets, prompt and output lengths of a `vllm bench serve --save-detailed` result (its raw JSON)."""
    with open(path) as f:
        raw = json.load(f)
    starts, ins, outs = raw.get("start_times"), raw.get("input_lens"), raw.get("output_lens")
    if not (starts and ins and outs and len(starts) == len(ins) == len(outs)):
        raise ValueError(f"{path}: not a --save-detailed result with start_times, input_lens and output_lens")
    t0 = min(starts)
    return sorted((s - t0, f"r{i:03d}", n_in, n_out) for i, (s, n_in, n_out) in enumerate(zip(starts, ins, outs)))


def run_one(scenario: str, items: list, target: float | None, seed: int, cap_when: str = "kv-pressure") -> dict:
    skw = SCENARIOS[scenario][0]
    sched = make_scheduler(target=target, cap_when=cap_when, **skw)
    sim = Sim(sched, SyntheticDevice(noise=0.3, seed=seed, **H200_L16), async_sched=skw["async_sched"])
    sim.run(items, max_steps=2_000_000)
    tpot = sim.tpot()
    ttft = [sim.token_times[r][0] - sim.arrival[r] for r in sim.token_times]
    out_tokens = sum(len(ts) for ts in sim.token_times.values())
    budget = getattr(sched, "tpot_budget", None)
    return {"seed": seed, "completed": len(sim.finished), "makespan_s": sim.now,
            "out_tok_s": out_tokens / sim.now if sim.now else 0.0,
            "ttft_s": ttft, "tpot_ms": [v * 1e3 for v in tpot.values()], "itl_ms": [v * 1e3 for v in sim.itls()],
            "preemptions": sum(len(s["preempted"]) for s in sim.steps), "steps": len(sim.steps),
            "budget": budget.stats() if budget is not None else None}


def summarize(runs: list[dict]) -> dict:
    def p(key, q, scale=1.0):
        xs = [x for r in runs for x in r[key]]
        return pct(xs, q) * scale if xs else float("nan")
    return {"runs": len(runs), "out_tok_s": sum(r["out_tok_s"] for r in runs) / len(runs),
            "ttft_p50_ms": p("ttft_s", 0.5, 1e3), "ttft_p99_ms": p("ttft_s", 0.99, 1e3),
            "tpot_p50_ms": p("tpot_ms", 0.5), "tpot_p99_ms": p("tpot_ms", 0.99), "itl_p99_ms": p("itl_ms", 0.99),
            "preemptions": sum(r["preemptions"] for r in runs), "completed": sum(r["completed"] for r in runs)}


def render(doc: dict) -> list[str]:
    L = [f"# Scheduler simulation: {doc['scenario']}", "", f"Command: `{doc['command']}`", "",
         "A simulation, not a measurement: vLLM 0.18.1's scheduler with patch 0004 (the real code, "
         "`bench/sched_sim.py`) on a simulated clock, step times from a synthetic device calibrated to the H200 "
         f"fit {doc['device']}. Poisson loads: {doc['requests']} requests per run, {doc['seeds']} seed(s) "
         "pooled; replays: the arrivals and lengths of a GPU run. TPOT is per request (mean inter-token latency), "
         "as `vllm bench serve` reports it; `x off` is the ratio to the upstream scheduler on the same load.", ""]
    for load in doc["loads"]:
        L += [f"## {load}", "",
              "| scheduler | out tok/s | x off | TTFT P50 ms | TTFT P99 ms | x off | TPOT P50 ms | TPOT P99 ms | "
              "x off | ITL P99 ms | preemptions | completed |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        rows = [r for r in doc["results"] if r["load"] == load]
        base = next(r["summary"] for r in rows if r["target_ms"] is None)
        for r in rows:
            s = r["summary"]
            name = ("upstream (off)" if r["target_ms"] is None
                    else f"target {r['target_ms']:g} ms, cap {r.get('cap_when', 'always')}")

            def ratio(k):
                return f"{s[k] / base[k]:.2f}" if base[k] else "-"
            L.append(f"| {name} | {s['out_tok_s']:.1f} | {ratio('out_tok_s')} | {s['ttft_p50_ms']:.0f} | "
                     f"{s['ttft_p99_ms']:.0f} | {ratio('ttft_p99_ms')} | {s['tpot_p50_ms']:.1f} | "
                     f"{s['tpot_p99_ms']:.1f} | {ratio('tpot_p99_ms')} | {s['itl_p99_ms']:.0f} | "
                     f"{s['preemptions']} | {s['completed']} |")
        L.append("")
    return L


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="dcu64-16-32K", help="one of " + ", ".join(SCENARIOS))
    ap.add_argument("--rates", default="0.25,0.6", help="Poisson request rates (req/s), comma list")
    ap.add_argument("--targets", default="off,30,60,120", help="'off' and/or --scheduler-tpot-target-ms values")
    ap.add_argument("--cap-when", default="kv-pressure",
                    help="--scheduler-tpot-cap-when values to run each target with, comma list: kv-pressure, always")
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--replay", action="append", default=[], metavar="RAW_JSON",
                    help="instead of Poisson arrivals, replay the arrivals and lengths of a `vllm bench serve "
                         "--save-detailed` result (repeatable: one table each; checks the simulator against a GPU run)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--what", default=None, help="file-name label (default: the scenario)")
    a = ap.parse_args(argv)
    try:
        if a.scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {a.scenario}; supported: {', '.join(SCENARIOS)}")
        replays = {p: replay_items(p) for p in a.replay}
        rates = [float(x) for x in a.rates.split(",") if x]
        targets = [None if x == "off" else float(x) for x in a.targets.split(",") if x]
        if any(not (r > 0 and math.isfinite(r)) for r in rates) or not (rates or replays):
            raise ValueError("--rates must be positive numbers ('' with --replay: replays only)")
        if None not in targets:
            targets.insert(0, None)  # the upstream scheduler is every table's reference
        if any(t is not None and not t > 0 for t in targets):
            raise ValueError("--targets must be 'off' or numbers > 0")
        cap_whens = [x for x in a.cap_when.split(",") if x]
        if not cap_whens or any(x not in ("kv-pressure", "always") for x in cap_whens):
            raise ValueError("--cap-when must list kv-pressure and/or always")
        if a.requests < 1 or a.seeds < 1:
            raise ValueError("--requests and --seeds must be >= 1")
    except (ValueError, OSError) as e:
        print(f"sched_sim: error: {e}", file=sys.stderr)
        return 2
    import logging
    logging.getLogger("vllm").setLevel(logging.ERROR)
    # workloads: one per rate (a.seeds Poisson draws each) or one per replayed GPU run (its own arrivals)
    loads = ([(f"{r:g} req/s", r, [poisson_items(a.scenario, r, a.requests, seed) for seed in range(a.seeds)])
              for r in rates]
             + [(f"replay of {os.path.relpath(p, REPO) if os.path.isabs(p) else p}", None, [items])
                for p, items in replays.items()])
    results = []
    for label, rate, item_sets in loads:
        for target, when in [(None, None)] + [(t, w) for t in targets if t is not None for w in cap_whens]:
            runs = [run_one(a.scenario, items, target, seed, when or "kv-pressure")
                    for seed, items in enumerate(item_sets)]
            s = summarize(runs)
            results.append({"load": label, "rate": rate, "target_ms": target, "cap_when": when, "summary": s,
                            "runs": [{k: v for k, v in r.items() if k not in ("ttft_s", "tpot_ms", "itl_ms")}
                                     for r in runs]})
            print(f"{label} target {target} ({when}): TPOT P99 {s['tpot_p99_ms']:.1f} ms, TTFT P99 "
                  f"{s['ttft_p99_ms']:.0f} ms, {s['out_tok_s']:.1f} tok/s, {s['preemptions']} preemptions",
                  flush=True)
    cmd = "python bench/sched_sim.py " + " ".join(argv if argv is not None else sys.argv[1:])
    doc = {"scenario": a.scenario, "command": cmd.strip(), "date": _dt.date.today().isoformat(),
           "device": H200_L16, "requests": a.requests, "seeds": a.seeds, "loads": [x[0] for x in loads],
           "scheduler": SCENARIOS[a.scenario][0], "results": results}
    from kernels.results_io import write_result_pair
    md = write_result_pair(a.out, f"{doc['date']}-cpu-sched-sim-{a.what or a.scenario}", doc, render(doc))
    print("\n".join(render(doc)[4:]))
    print(f"wrote {md} and its .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
