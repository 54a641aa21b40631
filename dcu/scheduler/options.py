"""Presets and startup checks of the vllm-dcu scheduler options (patch 0004).

``apply_scheduler_preset`` fills EngineArgs from ``--scheduler-preset`` (called where EngineArgs resolves its
defaults); ``check_scheduler_options`` validates a SchedulerConfig (called at the end of its __post_init__).
Pure Python: no vLLM import.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SchedulerPreset:
    max_num_seqs: int
    max_num_batched_tokens: int
    tpot_target_ms: float


# Per prompt tier (Qwen3.5-27B, bf16 weights, one H200-class card): targets of about 5x the decode step time at
# the tier's concurrency (a 64-layer decode step is ~20 ms on an H200). The rule is measured with 16 layers on an
# H200 (30 ms = 5x its 5.75 ms step: 1.54x tok/s and 0.37x TPOT P99 at 16-32K and 0.6 req/s on a 64 GB card's KV
# budget, neutral at lighter loads and shorter tiers; docs/scheduler.md); the 64-layer values scale it. On other
# hardware: 5x the TPOT measured at concurrency 1.
SCHEDULER_PRESETS: dict[str, SchedulerPreset] = {
    "4k-8k": SchedulerPreset(max_num_seqs=128, max_num_batched_tokens=8192, tpot_target_ms=100.0),
    "8k-16k": SchedulerPreset(max_num_seqs=96, max_num_batched_tokens=8192, tpot_target_ms=120.0),
    "16k-32k": SchedulerPreset(max_num_seqs=48, max_num_batched_tokens=8192, tpot_target_ms=150.0),
}


def apply_scheduler_preset(args: Any) -> None:
    """Fill max_num_seqs, max_num_batched_tokens and scheduler_tpot_target_ms of EngineArgs from
    ``args.scheduler_preset``; values the user gave explicitly win."""
    name = getattr(args, "scheduler_preset", None)
    if name is None:
        return
    if name not in SCHEDULER_PRESETS:
        raise ValueError(
            f"unknown scheduler_preset {name!r}; supported: {', '.join(SCHEDULER_PRESETS)}"
        )
    preset = SCHEDULER_PRESETS[name]
    if args.max_num_seqs is None:
        args.max_num_seqs = preset.max_num_seqs
    if args.max_num_batched_tokens is None:
        args.max_num_batched_tokens = preset.max_num_batched_tokens
    if args.scheduler_tpot_target_ms is None:
        args.scheduler_tpot_target_ms = preset.tpot_target_ms
    logger.info(
        "scheduler preset %s: max_num_seqs=%d max_num_batched_tokens=%d scheduler_tpot_target_ms=%.1f "
        "(about 5x an H200's decode step; explicit flags override them)",
        name, args.max_num_seqs, args.max_num_batched_tokens, args.scheduler_tpot_target_ms,
    )


# When the cap applies: only while the KV cache is oversubscribed (default), or in every step with a decode.
CAP_WHEN = ("kv-pressure", "always")


def check_scheduler_options(config: Any) -> None:
    """Startup validation of the vllm-dcu scheduler options on a SchedulerConfig."""
    target = config.scheduler_tpot_target_ms
    floor = config.scheduler_min_prefill_tokens
    when = getattr(config, "scheduler_tpot_cap_when", "kv-pressure")
    if when not in CAP_WHEN:
        raise ValueError(f"unknown scheduler_tpot_cap_when {when!r}; supported: {', '.join(CAP_WHEN)}")
    if target is None:
        if floor:
            raise ValueError(
                "scheduler_min_prefill_tokens only applies with scheduler_tpot_target_ms; "
                "set --scheduler-tpot-target-ms or drop --scheduler-min-prefill-tokens"
            )
        return
    if not (isinstance(target, (int, float)) and math.isfinite(target) and target > 0):
        raise ValueError(f"scheduler_tpot_target_ms must be a finite number > 0 (got {target!r})")
    if floor < 0:
        raise ValueError(f"scheduler_min_prefill_tokens must be >= 0 (got {floor})")
    if floor > config.max_num_batched_tokens:
        raise ValueError(
            f"scheduler_min_prefill_tokens ({floor}) must not exceed "
            f"max_num_batched_tokens ({config.max_num_batched_tokens})"
        )
    if not config.enable_chunked_prefill:
        raise ValueError(
            "scheduler_tpot_target_ms needs chunked prefill (supported: enable_chunked_prefill=True); "
            "without it a prompt longer than the prefill budget could never be scheduled"
        )
