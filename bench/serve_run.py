"""One step of the serving benchmark: for each build of the plan, start `vllm serve`, run every protocol and
tier through the bench client, stop it, record; then write the report. bench/serve_bench.py is the command line."""
from __future__ import annotations

import datetime as _dt
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass

from bench import profiles, prompts
from bench.serve_config import (
    CONTEST_BENCH_FLAGS,
    CONTEST_SERVER_FLAGS,
    DEVIATIONS,
    LOAD_CONCURRENCY,
    MAX_MODEL_LEN,
    BenchConfig,
)
from bench.serve_harness import harness_env, harness_serve_args, harness_write_config, load_harness
from bench.serve_metrics import (
    Results,
    counter_increase,
    memory_overhead_gib,
    parse_server_log,
    scrape_counters,
    summarize_bench,
)
from bench.serve_plan import Plan, auto_load_rate, bench_cmd, default_what, resolve_plan, server_cmd, server_estimate
from bench.serve_procs import BenchClient, Clock, Server, free_port, gpu_label, gpu_total_gib
from bench.synth_tokenizer import write_tokenizer


@dataclass(frozen=True)
class Step:
    """Where one step's files go and what it is called."""
    stem: str
    date: str
    gpu: str
    total_gib: float | None
    model_dir: str
    prompt_dir: str
    raw_dir: str
    log_dir: str  # under $OUT, so the logs come back from the GPU box
    command: str


def make_step(cfg: BenchConfig) -> Step:
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    gpu = cfg.gpu or ("h200" if cfg.dry_run else gpu_label())
    stem = f"{date}-{gpu}-{cfg.what or default_what(cfg)}"
    raw_dir = os.path.join(cfg.out, "raw", stem)
    # run.sh's `python` target sets VLLM_DCU_VARIANT; record the command the way it was started
    prefix = "bash ci/gpu/run.sh python" if os.environ.get("VLLM_DCU_VARIANT") else "python"
    command = f"{prefix} -m bench.serve_bench " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    return Step(stem=stem, date=date, gpu=gpu, total_gib=None if cfg.dry_run else gpu_total_gib(),
                model_dir=os.path.join(cfg.work, f"model-l{cfg.layers}"), prompt_dir=os.path.join(cfg.work, "prompts"),
                raw_dir=raw_dir, log_dir=os.path.join(raw_dir, "logs"), command=command)


def server_env(harness, plan: Plan, name: str) -> dict:
    """Environment of build `name`'s `vllm serve`: the harness's for that variant, then its --variant-env."""
    env = harness_env(harness, name, serve=True)
    env.update(plan.env_for(name))
    return env


def env_words(env: dict[str, str]) -> list[str]:
    """KEY=VALUE words of an environment, as a shell would take them before a command."""
    return [f"{k}={v}" for k, v in env.items()]


def print_dry_run(cfg: BenchConfig, plan: Plan, step: Step, harness_flags: list[str]) -> None:
    for v in plan.variants:
        print(f"server {v}: " + shlex.join(env_words(plan.env_for(v)) + server_cmd(
            cfg, step.model_dir, 8001, harness_flags, plan.flags_for(v))))
    for proto in cfg.protocols:
        for tier in cfg.tiers:
            rate = (cfg.load_rates or {}).get(tier) or auto_load_rate(None, tier, cfg.layers, cfg.profile)[0]
            print(f"bench {proto} {tier}: vllm bench serve " + shlex.join(bench_cmd(
                cfg, proto, tier, 8001, os.path.join(step.prompt_dir, f"{tier}_throughput.jsonl"),
                step.raw_dir, "RESULT.json", rate if proto == "load" else None, {"variant": "VARIANT"})))


def header(cfg: BenchConfig, plan: Plan, step: Step, harness, harness_flags: list[str], prompt_info: dict) -> dict:
    """The step's record before any run: what was asked, how the servers and clients are started, and how this
    differs from the contest's own scripts."""
    doc = {
        "schema": 1, "command": step.command, "date": step.date, "gpu": step.gpu, "gpu_total_gib": step.total_gib,
        "stem": step.stem, "args": cfg.record(), "baseline": plan.baseline, "plan": plan.items, "prompts": prompt_info,
        "server_flags": CONTEST_SERVER_FLAGS + cfg.profile_args + ["--max-model-len", str(MAX_MODEL_LEN),
                                                                   "--load-format", "dummy"] + harness_flags,
        "variant_patches": plan.patches,
        "variant_flags": {v: plan.flags_for(v) for v in plan.variants if plan.flags_for(v)},
        "variant_env": {v: plan.env_for(v) for v in plan.variants if plan.env_for(v)},
        "bench_flags": CONTEST_BENCH_FLAGS + ["--custom-output-len", str(cfg.output_len), "--ignore-eos"],
        "load": {"concurrency": LOAD_CONCURRENCY, "rates": cfg.load_rates or "auto"},
        "deviations": [d.format(output_len=cfg.output_len, harness_flags=" ".join(harness_flags) or "(none)",
                                layers=cfg.layers) for d in DEVIATIONS] + mode_deviations(cfg),
        "profile_detail": ({"kv_cache_memory_bytes": profiles.dcu64_kv_bytes(cfg.layers, cfg.kv_gib),
                            **profiles.dcu64_breakdown()} if cfg.profile == "dcu64"
                           else {"gpu_memory_utilization": 0.95}),
    }
    for fn in ("variant_info", "describe"):
        if hasattr(harness, fn):
            try:
                doc["variants"] = {v: getattr(harness, fn)(v) for v in plan.variants}
            except Exception as e:  # informational only
                doc["variants_error"] = str(e)
            break
    return doc


def mode_deviations(cfg: BenchConfig) -> list[str]:
    out = []
    if cfg.capture_sizes:
        out.append(f"CUDA-graph capture sizes {','.join(map(str, cfg.capture_sizes))} (vLLM's default, as in the "
                   "contest, captures up to 256; larger batches run piecewise either way)")
    if cfg.mode == "eager":
        out.append("--mode eager: no torch.compile and no CUDA graphs (the contest runs with both)")
    if cfg.mode == "decode-graph":
        out.append("--mode decode-graph: no torch.compile (prefill runs eager), full CUDA graphs for decode batches "
                   "(the contest compiles and captures piecewise graphs for prefill too)")
    return out


class StepRunner:
    """The loop over the plan's servers; the JSON record is rewritten after every run."""

    def __init__(self, cfg: BenchConfig, plan: Plan, step: Step, harness, harness_flags: list[str],
                 prompt_info: dict, results: Results, clock: Clock):
        self.cfg, self.plan, self.step, self.harness = cfg, plan, step, harness
        self.harness_flags, self.prompt_info, self.results, self.clock = harness_flags, prompt_info, results, clock
        self.load_rates = dict(cfg.load_rates or {})
        self.spent_by_server: list[float] = []
        self.last_bench_s = 0.0
        self.client: BenchClient | None = None

    def run(self) -> None:
        # One client process for every build: the baseline's `vllm bench serve`, imported once.
        self.client = BenchClient(harness_env(self.harness, self.plan.baseline, serve=False),
                                  os.path.join(self.step.log_dir, "bench-client.log"))
        self.client.spawn()
        try:
            for i, item in enumerate(self.plan.items):
                self.run_server(i, item["variant"], item["repeat"])
        finally:
            self.client.close()

    def run_server(self, i: int, name: str, rep: int) -> None:
        cfg, clock, results = self.cfg, self.clock, self.results
        label = f"{name}{' (again)' if rep else ''}"
        remaining = cfg.deadline_s - clock.elapsed()
        est_server_s = server_estimate(self.spent_by_server)
        if est_server_s is not None and est_server_s > remaining:
            clock.log(f"skip {label}: needs ~{est_server_s:.0f} s, {remaining:.0f} s left before the deadline")
            results.skip(label, f"deadline: ~{est_server_s:.0f} s needed, {remaining:.0f} s left")
            return
        t_server = time.monotonic()
        port = free_port()
        log_path = os.path.join(self.step.log_dir, f"{i:02d}-{name}-{rep}.log")
        srv = Server(server_cmd(cfg, self.step.model_dir, port, self.harness_flags, self.plan.flags_for(name)),
                     server_env(self.harness, self.plan, name), log_path)
        clock.log(f"[{i + 1}/{len(self.plan.items)}] start {label} on port {port} (log {log_path})")
        base_run = {"step": self.step.stem, "variant": name, "repeat": rep, "order": i, "profile": cfg.profile,
                    "layers": cfg.layers, "mode": cfg.mode}
        try:
            srv.start()
            start_s = srv.wait_healthy(port, min(cfg.start_timeout_s, max(30.0, remaining)))
            clock.log(f"{label} healthy after {start_s:.0f} s")
            server_info = {"start_s": round(start_s, 1)}
            for proto in cfg.protocols:
                for tier in cfg.tiers:
                    self.run_bench(i, name, rep, label, proto, tier, port, base_run, server_info)
        except RuntimeError as e:
            clock.log(f"{label} failed: {str(e).splitlines()[0]}")
            results.add(dict(base_run, protocol=None, tier=None, error=str(e)))
        finally:
            srv.stop()
            self.record_server(i, label, log_path)
        self.spent_by_server.append(time.monotonic() - t_server)

    def rate_for(self, proto: str, tier: str) -> float | None:
        """The load protocol's request rate of a tier: given, or sized from the baseline's contest run once."""
        if proto != "load":
            return None
        if tier not in self.load_rates:
            contest = next((r["bench"] for r in self.results.doc["runs"] if r["variant"] == self.plan.baseline
                            and r["protocol"] == "contest" and r["tier"] == tier and r.get("bench")), None)
            rate, how = auto_load_rate(contest, tier, self.cfg.layers, self.cfg.profile)
            self.load_rates[tier] = round(rate, 3)
            self.results.doc["load"]["rates_used"] = self.load_rates
            self.results.doc["load"].setdefault("rates_how", {})[tier] = how
        return self.load_rates.get(tier)

    def run_bench(self, i: int, name: str, rep: int, label: str, proto: str, tier: str, port: int, base_run: dict,
                  server_info: dict) -> None:
        cfg, clock, step = self.cfg, self.clock, self.step
        rate = self.rate_for(proto, tier)
        fname = f"{i:02d}-{name}-{rep}-{proto}-{tier}.json"
        cmd = bench_cmd(cfg, proto, tier, port, self.prompt_info[tier]["path"], step.raw_dir, fname, rate,
                        {"variant": name, "repeat": rep, "protocol": proto, "tier": tier, "profile": cfg.profile,
                         "layers": cfg.layers})
        run_rec = dict(base_run, protocol=proto, tier=tier, load_rate=rate,
                       raw_file=os.path.relpath(os.path.join(step.raw_dir, fname), cfg.out))
        left = cfg.deadline_s - clock.elapsed()
        if left < max(5.0, self.last_bench_s):
            self.results.skip(f"{label} {proto} {tier}", "deadline")
            clock.log(f"skip {label} {proto} {tier}: deadline")
            return
        clock.log(f"{label} {proto} {tier}: {cfg.requests if proto == 'contest' else cfg.load_requests} "
                  f"requests{'' if rate is None else f' at {rate:.3g} req/s, concurrency 16'}")
        t0 = time.monotonic()
        counters0 = scrape_counters(port)
        try:
            status = self.client.run(cmd, left, f"{label} {proto} {tier}")
            if status.get("rc") != 0:
                raise RuntimeError(f"vllm bench serve failed: {status.get('error')}")
            with open(os.path.join(step.raw_dir, fname)) as f:
                raw = json.load(f)
            run_rec["bench"], run_rec["per_request"] = summarize_bench(raw)
            counters = counter_increase(counters0, scrape_counters(port))
            if counters is not None:
                run_rec["server_counters"] = counters
            b = run_rec["bench"]
            clock.log(f"  {b['output_throughput']:.1f} out tok/s, TTFT P99 {b.get('p99_ttft_ms', 0):.1f} ms, "
                      f"TPOT P99 {b.get('p99_tpot_ms', 0):.2f} ms, {b['completed']} ok / {b['failed']} failed "
                      f"({time.monotonic() - t0:.0f} s)")
        except TimeoutError:
            run_rec["error"] = f"timeout after {left:.0f} s"
            clock.log(f"  {run_rec['error']}")
        except (RuntimeError, OSError, ValueError) as e:
            run_rec["error"] = str(e)
            clock.log(f"  failed: {e}")
        self.last_bench_s = time.monotonic() - t0 - self.client.ready_wait_s
        run_rec["server"] = server_info
        self.results.add(run_rec)

    def record_server(self, i: int, label: str, log_path: str) -> None:
        """What the stopped server's log says (memory, KV cache, start phases), into each of its runs."""
        info = {}
        if os.path.exists(log_path):
            with open(log_path, errors="replace") as f:
                info = parse_server_log(f.read())
        overhead = memory_overhead_gib(info, self.step.total_gib) if self.cfg.profile == "h200" else None
        if overhead is not None:
            info["overhead_gib"] = overhead
        for r in self.results.doc["runs"]:
            if r["order"] == i and "server" in r:
                r["server"].update(info)
        self.results.save()
        kv = (f"; KV cache {info['kv_cache_gib']} GiB, {int(info.get('kv_cache_tokens', 0))} tokens"
              if "kv_cache_gib" in info else "")
        self.clock.log(f"stopped {label}{kv}")


def run(cfg: BenchConfig, clock: Clock) -> int:
    harness = load_harness()
    plan = resolve_plan(cfg, harness)
    harness_flags = harness_serve_args(harness, cfg.mode, list(cfg.capture_sizes) if cfg.capture_sizes else None)
    step = make_step(cfg)
    os.makedirs(cfg.out, exist_ok=True)
    clock.log(f"plan: {' -> '.join(p['variant'] + ('(again)' if p['repeat'] else '') for p in plan.items)}; "
              f"tiers {','.join(cfg.tiers)}; protocols {','.join(cfg.protocols)}; profile {cfg.profile}; "
              f"layers {cfg.layers}; mode {cfg.mode}")
    if cfg.dry_run:
        print_dry_run(cfg, plan, step, harness_flags)
        return 0

    os.makedirs(step.raw_dir, exist_ok=True)
    os.makedirs(step.log_dir, exist_ok=True)
    clock.log(f"model dir {step.model_dir}: dummy config ({cfg.layers} layers) + synthetic tokenizer")
    harness_write_config(harness, step.model_dir, cfg.layers)
    write_tokenizer(step.model_dir)
    prompt_info = prompts.write_tier_files(step.prompt_dir, list(cfg.tiers), prompts.DEFAULT_COUNT, cfg.seed)
    clock.log("prompts: " + ", ".join(f"{t} sha256 {d['sha256'][:12]}" for t, d in prompt_info.items()))
    results = Results(os.path.join(cfg.out, step.stem + ".json"),
                      header(cfg, plan, step, harness, harness_flags, prompt_info))
    StepRunner(cfg, plan, step, harness, harness_flags, prompt_info, results, clock).run()
    results.doc["elapsed_s"] = round(clock.elapsed(), 1)
    results.save()

    from bench import report
    md_path, png_path = report.write_report([results.path], os.path.join(cfg.out, step.stem))
    clock.log(f"wrote {results.path}, {md_path}" + (f", {png_path}" if png_path else ""))
    with open(md_path) as f:  # the tables last (the setup notes stay in the file)
        print(f.read().split("\n## Setup", 1)[0].rstrip() + "\n", flush=True)
    return 0 if any(r.get("bench") for r in results.doc["runs"]) else 1
