"""What a serving-benchmark step runs: which builds in which order, with which flags, and the commands."""
from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field

from bench.serve_config import (
    CONTEST_BENCH_FLAGS,
    CONTEST_SERVER_FLAGS,
    LOAD_CONCURRENCY,
    LOAD_RATE_CAP_DCU64,
    LOAD_RATE_TABLE,
    LOAD_UTILIZATION,
    MAX_MODEL_LEN,
    BenchConfig,
    BenchError,
)

# Patches that the DCU (ROCm) turns on by default but CUDA only by a flag: a build that carries one gets the
# flag on the H200 too, so the benchmark measures what the DCU would run. Keyed by the patch name without its
# number; patch authors add their entry here.
PATCH_SERVE_FLAGS = {
    "dcu-triton-decode-attention": ["--attention-backend", "DCU_TRITON_ATTN"],
}


def validate_variants(requested: list[str], available: list[str], baseline: str | None) -> tuple[str, list[str]]:
    """(baseline, other builds in order); raises BenchError naming what is available."""
    if not available:
        raise BenchError("the harness lists no variants; bundle wheels with python -m ci.gpu.bundle --wheel ...")
    unknown = [v for v in requested if v not in available]
    if unknown:
        raise BenchError(f"unknown variant {','.join(unknown)}; available: {', '.join(available)}")
    base = baseline or available[0]
    if base not in available:
        raise BenchError(f"unknown baseline {base}; available: {', '.join(available)}")
    others = [v for v in (requested or available) if v != base]
    seen: set[str] = set()
    others = [v for v in others if not (v in seen or seen.add(v))]
    return base, others


def step_chunk(items: list[str], k: int, n: int) -> list[str]:
    """The k-th of n contiguous, near-equal chunks of items (k from 1)."""
    if n > max(1, len(items)):
        raise BenchError(f"--step {k}/{n}: only {len(items)} non-baseline build(s) to split")
    q, r = divmod(len(items), n)
    start = (k - 1) * q + min(k - 1, r)
    return items[start:start + q + (1 if k - 1 < r else 0)]


def make_plan(cfg: BenchConfig, baseline: str, others: list[str]) -> list[dict]:
    """Server runs in order: [{"variant", "repeat"}]; baseline first (and last), or only last (--baseline-last)."""
    chunk = step_chunk(others, *cfg.step) if others else []
    if cfg.baseline_last:
        return [{"variant": v, "repeat": 0} for v in chunk] + [{"variant": baseline, "repeat": 0}]
    plan = [{"variant": baseline, "repeat": 0}]
    plan += [{"variant": v, "repeat": 0} for v in chunk]
    if cfg.repeat_baseline:
        plan.append({"variant": baseline, "repeat": 1})
    return plan


def variant_patches(harness, name: str) -> list[str] | None:
    """Patch file names the variant was built with (its vllm/dcu_patchset.json), None if unknown."""
    try:
        path = os.path.join(str(harness.variant_dir(name)), "vllm", "dcu_patchset.json")
        with open(path) as f:
            return [p["name"] for p in json.load(f).get("patches", [])]
    except (AttributeError, OSError, ValueError, KeyError, TypeError):
        return None


def patch_flags(patches: list[str] | None) -> list[str]:
    flags: list[str] = []
    for name in patches or []:
        key = re.sub(r"^\d+-", "", name).removesuffix(".patch")
        flags += PATCH_SERVE_FLAGS.get(key, [])
    return flags


@dataclass(frozen=True)
class Plan:
    """The step's builds in run order, resolved against the harness."""
    baseline: str
    items: list[dict]  # [{"variant", "repeat"}], as make_plan returns it and the JSON records it
    patches: dict[str, list[str] | None]  # each build's patch files (None: unknown)
    auto_flags: dict[str, list[str]]  # each build's PATCH_SERVE_FLAGS
    flags_by_variant: dict[str, list[str]]  # --variant-flags
    env_by_variant: dict[str, dict[str, str]] = field(default_factory=dict)  # --variant-env

    @property
    def variants(self) -> list[str]:
        """Each build once, in run order."""
        return list(dict.fromkeys(p["variant"] for p in self.items))

    def _scoped(self, by_variant: dict, variant: str) -> list:
        """The entries of a --variant-flags / --variant-env mapping that apply to a build, in order: '*' (every
        build), '+' (every build but the baseline), then its own."""
        names = ["*"] + (["+"] if variant != self.baseline else []) + [variant]
        return [by_variant[n] for n in names if n in by_variant]

    def flags_for(self, variant: str) -> list[str]:
        """Extra serve flags of a build: its patches' (PATCH_SERVE_FLAGS), then its --variant-flags (_scoped)."""
        return self.auto_flags.get(variant, []) + [f for fl in self._scoped(self.flags_by_variant, variant) for f in fl]

    def env_for(self, variant: str) -> dict[str, str]:
        """Extra environment of a build's server (--variant-env, _scoped); a later one wins for the same variable."""
        env: dict[str, str] = {}
        for scoped in self._scoped(self.env_by_variant, variant):
            env.update(scoped)
        return env


def resolve_plan(cfg: BenchConfig, harness) -> Plan:
    baseline, others = validate_variants(list(cfg.variants), list(harness.variants()), cfg.baseline)
    items = make_plan(cfg, baseline, others)
    names = list(dict.fromkeys(p["variant"] for p in items))
    patches = {v: variant_patches(harness, v) for v in names}
    for option, by_variant in (("--variant-flags", cfg.flags_by_variant), ("--variant-env", cfg.env_by_variant)):
        stray = [n for n in by_variant if n not in ("*", "+") and n not in names]
        if stray:
            raise BenchError(f"{option} names {','.join(stray)}, not in this run's plan ({', '.join(names)})")
    safety = getattr(harness, "BOX_SAFETY_ENV", {})  # NVLink multicast stays off on the box, in every process
    clash = sorted({k for env in cfg.env_by_variant.values() for k in env if k in safety})
    if clash:
        raise BenchError(f"--variant-env may not set {','.join(clash)}: the harness keeps "
                         + ", ".join(f"{k}={safety[k]}" for k in clash) + " (the box's safety settings)")
    auto = {v: patch_flags(ps) for v, ps in patches.items()} if cfg.patch_flags else {}
    return Plan(baseline, items, patches, auto, cfg.flags_by_variant, cfg.env_by_variant)


def server_cmd(cfg: BenchConfig, model_dir: str, port: int, harness_flags: list[str], variant_flags=()) -> list[str]:
    return ([sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model_dir,
             "--host", "127.0.0.1", "--port", str(port)]
            + CONTEST_SERVER_FLAGS + cfg.profile_args
            + ["--max-model-len", str(MAX_MODEL_LEN), "--load-format", "dummy"]
            + list(harness_flags) + list(variant_flags))


def bench_cmd(cfg: BenchConfig, protocol: str, tier: str, port: int, dataset: str, result_dir: str, result_file: str,
              rate: float | None, meta: dict) -> list[str]:
    """Arguments of one `vllm bench serve` call (run by bench/bench_client.py)."""
    cmd = ["--host", "127.0.0.1", "--port", str(port)] + list(CONTEST_BENCH_FLAGS)
    cmd += ["--dataset-path", dataset, "--custom-output-len", str(cfg.output_len), "--ignore-eos",
            "--seed", str(cfg.seed), "--disable-tqdm",
            "--result-dir", result_dir, "--result-filename", result_file]
    if protocol == "contest":
        cmd += ["--num-prompts", str(cfg.requests)]
    else:
        i = cmd.index("--max-concurrency")
        cmd[i + 1] = str(LOAD_CONCURRENCY)
        i = cmd.index("--request-rate")
        cmd[i + 1] = f"{rate:.4g}"
        cmd += ["--num-prompts", str(cfg.load_requests)]
    cmd += ["--metadata"] + [f"{k}={v}" for k, v in meta.items()]
    return cmd


def auto_load_rate(contest_bench: dict | None, tier: str, layers: int, profile: str = "h200") -> tuple[float, str]:
    """(rate, how it was chosen): 0.6 x the baseline's capacity estimated from its concurrency-1 run of the tier.

    Capacity is bounded by prefill (one request's TTFT of GPU time each) and by the
    concurrency cap (16 requests in flight, each for about its concurrency-1 E2E latency);
    without such a run, LOAD_RATE_TABLE. Under the dcu64 profile the rate is also capped by
    LOAD_RATE_CAP_DCU64 (the KV cache, not compute, limits it).
    """
    if contest_bench and contest_bench.get("mean_ttft_ms") and contest_bench.get("mean_e2el_ms"):
        by_prefill = 1000.0 / contest_bench["mean_ttft_ms"]
        by_cap = LOAD_CONCURRENCY * 1000.0 / contest_bench["mean_e2el_ms"]
        rate = LOAD_UTILIZATION * min(by_prefill, by_cap)
        how = "0.6 of the baseline's capacity from its concurrency-1 run"
    else:
        rate, how = LOAD_RATE_TABLE[tier] * 16 / layers, "fixed table, no concurrency-1 run of the baseline"
    if profile == "dcu64" and LOAD_RATE_CAP_DCU64[tier] * 16 / layers < rate:
        rate, how = LOAD_RATE_CAP_DCU64[tier] * 16 / layers, "dcu64 KV-capacity cap"
    return rate, how


def server_estimate(spent: list[float]) -> float | None:
    """Seconds the next build (start + every tier) is expected to take, from the builds run so far (in order).

    The first build of a fresh machine pays the Triton JIT and compile caches for everyone after it (its start
    and first warm-ups took 2-3x a warm build's time on the H200), so alone it counts at half; once a later
    build has run, the largest of the later ones is the estimate.
    """
    if not spent:
        return None
    return max(spent[1:]) if len(spent) > 1 else 0.5 * spent[0]


def default_what(cfg: BenchConfig) -> str:
    parts = ["serve", "-".join(cfg.protocols), cfg.profile, f"l{cfg.layers}"]
    if cfg.mode != "graph":
        parts.append(cfg.mode)
    k, n = cfg.step
    if n > 1:
        parts.append(f"step{k}of{n}")
    return "-".join(parts)
