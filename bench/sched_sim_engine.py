"""The scheduler simulator's engine: vLLM's real (patched) V1 scheduler on a simulated clock with a synthetic
device.

The scheduler is driven the way EngineCore drives it (schedule -> execute -> update_from_output; with async
scheduling a two-deep batch queue), and each step's time comes from a step-time model of the device instead of a
model run. The CPU tests of patch 0004 (tests/test_scheduler_dcu.py) are built on it; bench/sched_sim.py is its
command line. Needs a vLLM tree with patch 0004 on the import path (the tests' tree, or what
bench/sched_sim.py puts there).
"""
from __future__ import annotations

import random
from collections import deque
from pathlib import Path

import torch
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.dcu.scheduler.budget import final_token_in_flight, is_prefilling
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched import async_scheduler as async_mod
from vllm.v1.core.sched import scheduler as sched_mod
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from bench.sched_sim_scenarios import H200_L16, SCENARIOS

if "scheduler_tpot_target_ms" not in SchedulerConfig.__dataclass_fields__:
    raise ImportError(f"the vLLM tree at {Path(sched_mod.__file__).parents[4]} has no patch 0004 (scheduler options)")

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "scheduler"
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


