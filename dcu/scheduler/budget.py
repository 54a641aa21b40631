"""vllm-dcu: decode-first batching with a TPOT-targeted prefill budget (the policy of patch 0004).

Off by default (``--scheduler-tpot-target-ms`` unset): ``make_tpot_budget`` returns None and the scheduler runs
the upstream code path unchanged. When on, each ``Scheduler.schedule()`` step

1. puts every running decode ahead of every request that is still prefilling (stable order otherwise), so a
   prefill chunk never takes budget a decode needs (Sarathi-Serve's stall-free batching);
2. caps the tokens that go to prefill work (partial prefills first, then new requests, as upstream orders them) at
   the largest amount that a fitted step-time model (``step_model``) predicts keeps the step under the target,
   never below a floor (so waiting requests always progress) and never above what ``max_num_batched_tokens``
   leaves; by default only while the KV cache is oversubscribed (``cap_when="kv-pressure"``);
3. learns the step-time model from measured step latency: the wall time between the scheduler handing out a
   batch and ``update_from_output`` receiving its result, less any overlap with the previous batch (with async
   scheduling the batch queue keeps two in flight, so the feedback arrives one step late; the model does not
   care which step a sample came from).

In Qwen3.5's hybrid "align" mode prefill chunks must be multiples of the attention block size (784 or 1552 tokens
for Qwen3.5-27B), so the budget is rounded down to block multiples and never drops below one block.
No vLLM import at module level (the KV-pressure gate imports vLLM's MambaSpec when it reads a real cache).
"""
from __future__ import annotations

import logging
import math
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from .step_model import FEATURE_SCALES, StepTimeModel, step_features

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)


def is_prefilling(request: Request) -> bool:
    """True while the request still has prompt (or recomputed) tokens to process, i.e. it is not decoding."""
    return request.is_prefill_chunk or request.num_computed_tokens < request.num_tokens - 1


def final_token_in_flight(request: Request) -> bool:
    """True when async scheduling has already scheduled the request's last output token, so schedule() skips it
    (upstream's test at the top of its running loop)."""
    return request.num_output_placeholders > 0 and (
        request.num_computed_tokens + 2 - request.num_output_placeholders
        >= request.num_prompt_tokens + request.max_tokens
    )


def _pending_tokens(request: Request) -> int:
    return max(
        0,
        request.num_tokens_with_spec + request.num_output_placeholders - request.num_computed_tokens,
    )


class TpotBudget:
    """Decode-first ordering and the per-step prefill cap for one Scheduler (see the module docstring).

    Hooks, all called by Scheduler only when this object exists:
      ``begin_step(token_budget)`` at the top of schedule(): reorders ``scheduler.running`` decode-first and
      returns the prefill cap (None = no cap, the upstream behaviour) that schedule() applies to its token
      budget when it reaches the first prefill request, or the waiting queue;
      ``end_step(scheduler_output)`` before ``_update_after_schedule``: records the batch's features;
      ``observe(scheduler_output)`` at the top of update_from_output: measures the step and refits the model.
    """

    # Relative headroom kept below the target for prediction noise: z * residual std, at most this share.
    MAX_MARGIN = 0.25
    MARGIN_Z = 2.0
    # Growth limit per step while the model is young or extrapolates: the cap may at most double.
    GROWTH = 2.0
    DEFAULT_FLOOR = 256
    MIN_SAMPLES = 3
    # No capped step leaves a prefill sliver shorter than this (one Gated DeltaNet chunk of 64 tokens): a batch
    # whose only prefill work is a few tokens can hit kernel variants that were never compiled or autotuned at
    # startup, and the first such batch stalled every decode for 14-16 s on the H200 (2026-11-30).
    MIN_SLIVER = 64
    # A measured step this far over the target (and over 1 s) is a stall outside the scheduler's control (a
    # kernel compiling, the first step's autotuning): logged, and kept out of the step-time model.
    STALL_FACTOR = 10.0
    # The KV-pressure gate counts each request's blocks up to prompt + max_tokens. Clients that set no max_tokens
    # get the server's default (up to max_model_len), which would make every request look like it grows to the
    # full context: so a request is assumed to stop by an output allowance (or where it already is), never past
    # max_tokens. The allowance is the OUTPUT_QUANTILE of the last OUTPUT_WINDOW finished requests' output
    # lengths once OUTPUT_MIN_SAMPLES have finished, OUTPUT_PRIOR tokens before (the contest's cap; chat answers
    # are mostly shorter).
    OUTPUT_WINDOW = 64
    OUTPUT_MIN_SAMPLES = 8
    OUTPUT_QUANTILE = 0.9
    OUTPUT_PRIOR = 1024

    def __init__(self, scheduler: Scheduler, target_ms: float, min_prefill_tokens: int = 0,
                 cap_when: str = "kv-pressure") -> None:
        self.scheduler = scheduler
        self.target_ms = float(target_ms)
        self.cap_when = cap_when
        self.kv_pressure_steps = 0  # steps that found the KV cache oversubscribed
        self._out_seen: dict[str, int] = {}  # running request -> output tokens, as of the latest step
        self._out_lens: deque[int] = deque(maxlen=self.OUTPUT_WINDOW)  # output lengths of finished requests
        self.max_tokens = scheduler.max_num_scheduled_tokens
        self.align_block = (
            scheduler.cache_config.block_size if scheduler.need_mamba_block_aligned_split else 0
        )
        self.quantum = self.align_block or 16
        floor = min_prefill_tokens or (self.align_block or self.DEFAULT_FLOOR)
        if self.align_block:
            floor = -(-floor // self.align_block) * self.align_block  # whole blocks, at least one
        self.floor = min(floor, self.max_tokens)
        self.model = StepTimeModel()
        self.clock = time.monotonic
        self.last_cap = self.floor
        self.step_cap: int | None = None  # the cap of the latest step (None: not capped)
        self.steps = 0
        self.capped_steps = 0
        self._t_start = 0.0
        self._t_prev_done = 0.0
        self._pending: dict[int, tuple[float, tuple[float, ...]]] = {}
        self._decodes_before: list[str] = []  # running decodes when this step's schedule() began
        self.decodes_left_out = 0  # decodes that a step with a prefill chunk did not schedule (should stay 0)
        self.slow_steps = 0  # steps measured far over the target (logged)
        logger.info(
            "vllm-dcu scheduler: decode-first batching, prefill budget targeting %.1f ms steps "
            "(floor %d tokens%s, cap %d), %s",
            self.target_ms, self.floor,
            f", align mode: multiples of {self.align_block}" if self.align_block else "",
            self.max_tokens,
            "in every step with a running decode" if cap_when == "always"
            else "while the KV cache is oversubscribed",
        )

    # -- schedule() side -------------------------------------------------------------------------------

    is_prefill = staticmethod(is_prefilling)

    def begin_step(self, token_budget: int) -> int | None:
        self._t_start = self.clock()
        self.steps += 1
        self.step_cap = None
        self._decodes_before = []
        running = self.scheduler.running
        if self.cap_when == "kv-pressure":
            self._learn_output_lengths(running)
        if token_budget <= 0 or not running:
            return None
        decodes: list[Request] = []
        prefills: list[Request] = []
        for req in running:
            (prefills if is_prefilling(req) else decodes).append(req)
        self._decodes_before = [r.request_id for r in decodes]
        if not decodes:
            return None  # no running decode, no TPOT to protect: the upstream budget applies
        if prefills:
            running[:] = decodes + prefills  # stable: admission order within each group
        waiting = self.scheduler.waiting or self.scheduler.skipped_waiting
        if not prefills and not waiting:
            return None  # nothing to cap
        if self.cap_when == "kv-pressure":
            if not self.kv_oversubscribed(running, waiting.peek_request() if waiting else None):
                return None  # upstream's chunk size: small chunks only slow prefill down when nothing is at stake
            self.kv_pressure_steps += 1
        cap = self._prefill_cap(token_budget, decodes, prefills)
        self.last_cap = self.step_cap = cap
        self.capped_steps += 1
        return cap

    def _learn_output_lengths(self, running: list[Request]) -> None:
        """Record the output length of each request that finished since the last step (its count when last seen
        running: at most a token or two short) and remember the running ones' counts for the next step."""
        finished = self.scheduler.finished_req_ids
        if finished and self._out_seen:
            for rid in finished:
                n = self._out_seen.get(rid)
                if n:
                    self._out_lens.append(n)
        self._out_seen = {r.request_id: r.num_output_tokens for r in running}

    def output_allowance(self) -> int:
        """The output length a request is assumed to stop by (capped by its max_tokens where used)."""
        if len(self._out_lens) < self.OUTPUT_MIN_SAMPLES:
            return self.OUTPUT_PRIOR
        xs = sorted(self._out_lens)
        return xs[int(self.OUTPUT_QUANTILE * (len(xs) - 1))]

    def kv_oversubscribed(self, running: list[Request], head: Request | None) -> bool:
        """Whether the running requests and ``head`` (the first waiting one) need more KV blocks to reach their
        prompt plus max_tokens (or the learned output allowance, whichever is less) than the pool has free: then
        upstream's full-size prefill chunks take blocks that running decodes will need, and preemption (a
        recomputed prompt) follows. An estimate from the block tables: attention-type groups need one block per
        block_size tokens; a state (Mamba) group needs what it holds already, one block for a request not yet
        admitted. Prefix-cache hits and sliding windows only make the true need smaller."""
        kv = self.scheduler.kv_cache_manager
        managers = getattr(getattr(kv, "coordinator", None), "single_type_managers", ())
        if not managers:
            return True  # no block tables to read: behave as "always"
        from vllm.v1.kv_cache_interface import MambaSpec  # block tables exist: vLLM is loaded

        allowance = self.output_allowance()
        need = 0
        for req in [*running, *([head] if head is not None else [])]:
            out = min(req.max_tokens or 0, max(allowance, req.num_output_tokens + 1))
            final = min(req.num_prompt_tokens + out, self.scheduler.max_model_len)
            for m in managers:
                have = len(m.req_to_blocks.get(req.request_id, ()))
                if isinstance(m.kv_cache_spec, MambaSpec):
                    need += 0 if have else 1
                else:
                    need += max(0, -(-final // m.block_size) - have)
        return need > kv.block_pool.get_num_free_blocks()

    def _prefill_cap(self, token_budget: int, decodes: list[Request], prefills: list[Request]) -> int:
        dec_tokens = kv_read = 0
        for r in decodes:
            n = _pending_tokens(r)
            dec_tokens += n
            kv_read += r.num_computed_tokens + n
        room = max(0, token_budget - dec_tokens)
        q = self.quantum
        if prefills:
            head = prefills[0]
        else:
            head = (self.scheduler.waiting or self.scheduler.skipped_waiting).peek_request()
        pos = head.num_computed_tokens
        n_req = len(decodes) + 1

        if self.model.num_samples < self.MIN_SAMPLES:
            cap = 0  # no model yet: the floor; the growth limit below then opens the cap step by step
        else:
            limit = self.target_ms - min(
                self.MARGIN_Z * self.model.resid_std, self.MAX_MARGIN * self.target_ms
            )
            # The prediction is quadratic in the prefill amount p: a + b*p + c*p^2 <= limit.
            c_tok, c_pair = self.model.coef[1], self.model.coef[4]
            a = self.model.predict(step_features(dec_tokens, n_req, kv_read, 0.0, has_prefill=True))
            b = c_tok / FEATURE_SCALES[1] + c_pair * pos / FEATURE_SCALES[4]
            c = c_pair / (2.0 * FEATURE_SCALES[4])
            slack = limit - a
            if slack <= 0.0:
                p = 0.0
            elif c > 0.0:
                p = 2.0 * slack / (b + math.sqrt(b * b + 4.0 * c * slack))  # stable root of c p^2 + b p = slack
            elif b > 0.0:
                p = slack / b
            else:
                p = float(room)
            cap = min(room, int(p)) // q * q
        cap = min(cap, int(self.GROWTH * self.last_cap))
        if self.align_block:
            cap -= cap % self.align_block
        cap = max(cap, self.floor)
        return self._no_slivers(cap, head, room, len(prefills) > 1 or bool(self.scheduler.waiting))

    def _no_slivers(self, cap: int, head: Request, room: int, more_prefills: bool) -> int:
        """Adjust the cap so that no step's prefill work is a sliver of a few tokens (MIN_SLIVER).

        A sliver batch happens when the head request is down to a short tail and nothing else gets budget. So:
        never leave the head such a tail (finish its prompt instead: at most MIN_SLIVER tokens over the cap),
        and when it has one anyway (upstream's align mode always runs the tail after the prompt's last whole
        block as a chunk of its own, to cache the state at that block), leave the next prefill room to join it
        (a whole block in align mode).
        """
        rest = head.num_tokens - head.num_computed_tokens
        if 0 < rest - cap < self.MIN_SLIVER and rest <= room and not self.align_block:
            return rest
        if 0 < rest < self.MIN_SLIVER and more_prefills:
            need = rest + (self.align_block or self.MIN_SLIVER)
            if need <= room:
                return max(cap, need)
        return cap

    def end_step(self, scheduler_output: SchedulerOutput) -> None:
        """Record the batch's features (num_computed_tokens is still the pre-step value here)."""
        tokens = scheduler_output.total_num_scheduled_tokens
        if tokens == 0:
            return
        kv_read = 0
        pairs = 0.0
        requests = self.scheduler.requests
        for req_id, n in scheduler_output.num_scheduled_tokens.items():
            req = requests[req_id]
            pos = req.num_computed_tokens
            if pos < req.num_tokens - 1:
                pairs += n * (pos + n / 2.0)
            else:
                kv_read += pos + n
        x = step_features(tokens, len(scheduler_output.num_scheduled_tokens), kv_read, pairs)
        if pairs and self._decodes_before:
            self._check_decodes_first(scheduler_output)
        if len(self._pending) > 16:  # results that never came back (aborted engine step): forget them
            self._pending.clear()
        self._pending[id(scheduler_output)] = (self._t_start, x)

    def _check_decodes_first(self, scheduler_output: SchedulerOutput) -> None:
        """Warn when a step carried a prefill chunk but left out a decode that was running when it began
        (async scheduling legitimately skips a request whose final token is already in flight)."""
        scheduled = scheduler_output.num_scheduled_tokens
        preempted = scheduler_output.preempted_req_ids or ()
        missing = []
        for rid in self._decodes_before:
            req = self.scheduler.requests.get(rid)
            if rid in scheduled or rid in preempted or req is None or req.is_finished():
                continue
            if not final_token_in_flight(req):
                missing.append(rid)
        if missing:
            self.decodes_left_out += len(missing)
            logger.warning(
                "vllm-dcu scheduler: a step with %d prefill token(s) left out %d running decode(s) (%s); "
                "running %d, waiting %d",
                scheduler_output.total_num_scheduled_tokens - sum(
                    n for r, n in scheduled.items() if r in self._decodes_before),
                len(missing), ", ".join(missing[:4]), len(self.scheduler.running), len(self.scheduler.waiting),
            )

    # -- update_from_output() side ---------------------------------------------------------------------

    def observe(self, scheduler_output: SchedulerOutput) -> None:
        rec = self._pending.pop(id(scheduler_output), None)
        if rec is None:
            return
        t_start, x = rec
        now = self.clock()
        # Time this batch owned the device: from its hand-out, or from the previous result if it was queued
        # behind that one (async scheduling / batch queue).
        dt_ms = (now - max(t_start, self._t_prev_done)) * 1e3
        self._t_prev_done = now
        if dt_ms > max(self.STALL_FACTOR * self.target_ms, 1000.0):
            # Far over any step the model can explain: a stall outside the scheduler's control (a kernel
            # compiling, the host swapping, another process on the device). Logged with the batch, so that
            # the cause can be found from the server log.
            self.slow_steps += 1
            logger.warning(
                "vllm-dcu scheduler: a step took %.0f ms (model: %.0f ms; target %.0f ms): %d tokens, "
                "%d requests, decode KV read %d tokens, prefill attention pairs %.3g",
                dt_ms, self.model.predict(x), self.target_ms, round(x[1] * FEATURE_SCALES[1]),
                round(x[2] * FEATURE_SCALES[2]), round(x[3] * FEATURE_SCALES[3]), x[4] * FEATURE_SCALES[4],
            )
            return  # a stall says nothing about the device's step time: do not learn it
        if dt_ms > 0:
            self.model.observe(x, dt_ms, outlier_ms=0.5 * self.target_ms)

    def stats(self) -> dict[str, Any]:
        return {
            "target_ms": self.target_ms,
            "floor": self.floor,
            "align_block": self.align_block,
            "last_cap": self.last_cap,
            "steps": self.steps,
            "capped_steps": self.capped_steps,
            "cap_when": self.cap_when,
            "kv_pressure_steps": self.kv_pressure_steps,
            "output_allowance": self.output_allowance(),
            "decodes_left_out": self.decodes_left_out,
            "slow_steps": self.slow_steps,
            "samples": self.model.num_samples,
            "coef": [float(c) for c in self.model.coef],
            "resid_std_ms": self.model.resid_std,
        }


def make_tpot_budget(scheduler: Scheduler) -> TpotBudget | None:
    config = scheduler.scheduler_config
    target = getattr(config, "scheduler_tpot_target_ms", None)
    if target is None:
        return None
    return TpotBudget(scheduler, target, config.scheduler_min_prefill_tokens,
                      getattr(config, "scheduler_tpot_cap_when", "kv-pressure"))
