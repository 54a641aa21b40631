"""Benchmark driver (python -m bench.serve_bench and its bench/serve_*.py modules): argument validation, plan,
memory profiles, and the whole start/bench/stop/report loop against a fake `vllm` (tests/data/fake_vllm) through a
fake harness."""
import json
import os
import subprocess
import sys

import pytest

from bench import profiles, serve_metrics, serve_plan
from bench.bench_client import MARK
from bench.serve_bench import config_from_argv
from bench.serve_config import BenchError
from bench.serve_plan import step_chunk, validate_variants

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE_HARNESS = os.path.join(REPO, "tests", "data", "fake_harness.py")


def drive(*args, tmp_path, env_extra=None):
    env = dict(os.environ, VLLM_DCU_BENCH_HARNESS=FAKE_HARNESS, OUT=str(tmp_path / "out"))
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "bench.serve_bench", "--work", str(tmp_path / "work"),
                           "--gpu", "test", *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=600)


@pytest.mark.parametrize("args, message", [
    (["--tiers", "4-8K,2K"], "unknown tier 2K; supported: 4-8K,8-16K,16-32K"),
    (["--variants", "baseline,nope"], "unknown variant nope; available: baseline, full, slow, broken"),
    (["--baseline", "nope"], "unknown baseline nope; available: baseline, full, slow, broken"),
    (["--protocols", "contest,burst"], "unknown protocol burst; supported: contest, load"),
    (["--profile", "mi300"], "unknown memory profile mi300; supported: h200, dcu64"),
    (["--layers", "10"], "--layers must be a multiple of 4 in [4, 64], got 10"),
    (["--step", "3/2"], "--step must be K/N with 1 <= K <= N, got '3/2'"),
    (["--step", "1/5"], "--step 1/5: only 3 non-baseline build(s) to split"),
    (["--requests", "0"], "--requests and --load-requests must be in [1, 64]"),
    (["--mode", "fast"], "unknown --mode fast; supported: graph, decode-graph, eager"),
    (["--kv-gib", "7"], "--kv-gib applies to --profile dcu64 only"),
    (["--load-rate", "4-8K=x"], "--load-rate must be 'auto', a number or tier=rate pairs"),
    (["--variant-flags", "full"], "--variant-flags needs NAME=FLAGS, got 'full'"),
    (["--baseline-last", "--protocols", "load"], "--baseline-last with the load protocol needs a --load-rate"),
    (["--variants", "full", "--variant-flags", "slow=--enforce-eager"],
     "--variant-flags names slow, not in this run's plan (baseline, full)"),
    (["--variant-env", "full"], "--variant-env needs NAME=KEY=VALUE, got 'full'"),
    (["--variant-env", "full=FOO"], "--variant-env needs NAME=KEY=VALUE, got 'full=FOO'"),
    (["--variant-env", "=FOO=1"], "--variant-env needs NAME=KEY=VALUE, got '=FOO=1'"),
    (["--variant-env", "full==1"], "--variant-env needs NAME=KEY=VALUE, got 'full==1'"),
    (["--variant-env", "full=1FOO=1"], "--variant-env 'full=1FOO=1': '1FOO' is not an environment variable name"),
    (["--variant-env", "full=FOO-BAR=1"], "--variant-env 'full=FOO-BAR=1': 'FOO-BAR' is not an environment"),
    (["--variants", "full", "--variant-env", "slow=FOO=1"],
     "--variant-env names slow, not in this run's plan (baseline, full)"),
])
def test_bad_arguments_fail_with_one_clear_line(tmp_path, args, message):
    p = drive(*args, "--dry-run", tmp_path=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"serve_bench: error: {message}")


def test_missing_harness_is_reported(tmp_path):
    p = drive("--dry-run", tmp_path=tmp_path, env_extra={"VLLM_DCU_BENCH_HARNESS": str(tmp_path / "none.py")})
    assert p.returncode == 2 and "GPU harness not found" in p.stderr


def test_steps_split_the_builds_once_each_and_every_step_brackets_them_with_the_baseline():
    builds = [f"p{i}" for i in range(7)]
    chunks = [step_chunk(builds, k, 3) for k in (1, 2, 3)]
    assert [len(c) for c in chunks] == [3, 2, 2]
    assert sum(chunks, []) == builds
    base, others = validate_variants([], ["b", *builds], None)
    assert base == "b" and others == builds
    with pytest.raises(BenchError):
        step_chunk(builds, 1, 8)


def test_baseline_last_runs_the_baseline_once_after_the_other_builds():
    a = config_from_argv(["--baseline-last", "--protocols", "load", "--tiers", "16-32K", "--load-rate", "0.6"])
    assert [p["variant"] for p in serve_plan.make_plan(a, "b", ["x", "y"])] == ["x", "y", "b"]
    a = config_from_argv(["--protocols", "load", "--tiers", "16-32K", "--load-rate", "0.6"])
    assert [p["variant"] for p in serve_plan.make_plan(a, "b", ["x", "y"])] == ["b", "x", "y", "b"]


def test_the_configuration_is_frozen_and_records_the_arguments_the_report_reads():
    import dataclasses

    a = config_from_argv(["--tiers", "4-8K,8-16K", "--capture-sizes", "1,2"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.layers = 8
    rec = a.record()
    assert (rec["layers"], rec["mode"], rec["output_len"], rec["requests"]) == (16, "graph", 250, 10)
    assert rec["tiers"] == ["4-8K", "8-16K"] and rec["capture_sizes"] == [1, 2]
    import json
    json.dumps(rec)


def test_dry_run_prints_contest_server_and_bench_flags(tmp_path):
    p = drive("--dry-run", "--tiers", "8-16K", "--protocols", "contest,load", "--load-rate", "2.5",
              tmp_path=tmp_path)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    server = next(line for line in out.splitlines() if line.startswith("server baseline: "))
    for flag in ("--max-num-seqs 128", "--max-num-batched-tokens 4096", "--gpu-memory-utilization 0.95",
                 "--dtype bfloat16", "--reasoning-parser qwen3", "--tool-call-parser qwen3_coder",
                 "--enable-auto-tool-choice", "--load-format dummy", "--language-model-only"):
        assert flag in server
    assert "--default-chat-template-kwargs '{\"enable_thinking\": false}'" in server
    contest = next(line for line in out.splitlines() if line.startswith("bench contest 8-16K"))
    for flag in ("--backend openai-chat", "--endpoint /v1/chat/completions", "--max-concurrency 1",
                 "--request-rate 1 ", "--num-warmups 2", "--temperature 0", "--ignore-eos",
                 "--custom-output-len 250", "--percentile-metrics ttft,tpot,itl,e2el",
                 "--metric-percentiles 50,95,99", "--num-prompts 10", "8-16K_throughput.jsonl"):
        assert flag in contest
    load = next(line for line in out.splitlines() if line.startswith("bench load 8-16K"))
    assert "--max-concurrency 16" in load and "--request-rate 2.5" in load and "--num-prompts 32" in load
    assert "plan: baseline -> full -> slow -> broken -> baseline(again)" in out


def test_variant_flags_go_after_the_harness_flags_of_that_build_only(tmp_path):
    p = drive("--dry-run", "--variants", "full,slow", "--variant-flags", "full=--attention-backend DCU_TRITON_ATTN",
              "--variant-flags", "*=--disable-log-stats", "--variant-flags", "+=--kv-cache-dtype fp8",
              tmp_path=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = {line.split(":")[0]: line for line in p.stdout.splitlines() if line.startswith("server ")}
    assert lines["server full"].endswith("--attention-backend TRITON_ATTN --attention-backend DCU_TRITON_ATTN "
                                         "--disable-log-stats --kv-cache-dtype fp8 "
                                         "--attention-backend DCU_TRITON_ATTN")
    assert lines["server slow"].endswith("--attention-backend TRITON_ATTN --disable-log-stats --kv-cache-dtype fp8")
    assert lines["server baseline"].endswith("--attention-backend TRITON_ATTN --disable-log-stats")


def test_variant_env_parses_name_key_value_and_keeps_it_in_the_frozen_config():
    from bench.serve_config import parse_variant_env

    assert parse_variant_env(["full=A=1", "full=B=x=y z", "*=C=", " slow =A=2", "full=A=3"]) == {
        "full": {"A": "3", "B": "x=y z"}, "*": {"C": ""}, "slow": {"A": "2"}}
    assert parse_variant_env([]) == {}
    a = config_from_argv(["--variant-env", "full=VLLM_LOGGING_LEVEL=DEBUG", "--variant-env", "+=_X1=a"])
    assert a.env_by_variant == {"full": {"VLLM_LOGGING_LEVEL": "DEBUG"}, "+": {"_X1": "a"}}
    assert a.record()["env_by_variant"] == a.env_by_variant
    assert config_from_argv([]).env_by_variant == {}


def _fake_harness():
    from bench.serve_harness import _load_by_path

    return _load_by_path("vllm_dcu_fake_harness_under_test", FAKE_HARNESS)


def test_variant_env_reaches_that_builds_server_env_only_over_the_harness_env():
    from bench.serve_run import server_env

    harness = _fake_harness()
    cfg = config_from_argv(["--variants", "full,slow", "--variant-env", "full=FOO=1", "--variant-env", "*=ALL=a",
                            "--variant-env", "+=OTHERS=o", "--variant-env", "full=ALL=b",
                            "--variant-env", "slow=FAKE_VLLM_SPEED=0.25"])
    plan = serve_plan.resolve_plan(cfg, harness)
    envs = {v: server_env(harness, plan, v) for v in ("baseline", "full", "slow")}
    assert all(e["FAKE_INPROCESS"] == "0" and e["PYTHONPATH"].endswith("fake_vllm") for e in envs.values())
    assert {k: envs["full"].get(k) for k in ("FOO", "ALL", "OTHERS")} == {"FOO": "1", "ALL": "b", "OTHERS": "o"}
    assert {k: envs["slow"].get(k) for k in ("FOO", "ALL", "OTHERS")} == {"FOO": None, "ALL": "a", "OTHERS": "o"}
    assert {k: envs["baseline"].get(k) for k in ("FOO", "ALL", "OTHERS")} == {"FOO": None, "ALL": "a",
                                                                               "OTHERS": None}
    assert envs["slow"]["FAKE_VLLM_SPEED"] == "0.25" and envs["full"]["FAKE_VLLM_SPEED"] == "1.25"  # over the harness's
    assert plan.env_for("full") == {"ALL": "b", "OTHERS": "o", "FOO": "1"}


def test_the_server_process_of_a_build_is_started_with_its_variant_env(tmp_path, monkeypatch):
    from bench import serve_run
    from bench.serve_metrics import Results
    from bench.serve_procs import Clock

    started = []

    class RecordingServer:  # instead of a `vllm serve` process
        def __init__(self, cmd, env, log_path):
            started.append((cmd, env))

        def start(self):
            raise RuntimeError("not started in this test")

        def stop(self):
            pass

    monkeypatch.setattr(serve_run, "Server", RecordingServer)
    harness = _fake_harness()
    cfg = config_from_argv(["--variants", "full", "--variant-env", "full=FOO=1", "--dry-run", "--gpu", "test",
                            "--work", str(tmp_path), "--out", str(tmp_path / "out")])
    plan = serve_plan.resolve_plan(cfg, harness)
    step = serve_run.make_step(cfg)
    os.makedirs(step.log_dir)
    header = serve_run.header(cfg, plan, step, harness, [], {})
    assert header["variant_env"] == {"full": {"FOO": "1"}}
    results = Results(str(tmp_path / "r.json"), header)
    runner = serve_run.StepRunner(cfg, plan, step, harness, [], {}, results, Clock())
    for i, item in enumerate(plan.items):
        runner.run_server(i, item["variant"], item["repeat"])
    assert [env.get("FOO") for _, env in started] == [None, "1", None]  # baseline, full, baseline again
    assert all(env["FAKE_INPROCESS"] == "0" for _, env in started)
    assert [r["error"] for r in results.doc["runs"]] == ["not started in this test"] * 3


def test_variant_env_may_not_turn_the_box_safety_settings_off():
    import types

    harness = types.SimpleNamespace(variants=lambda: ["baseline", "full"], variant_dir=lambda n: "/nonexistent",
                                    BOX_SAFETY_ENV={"NCCL_NVLS_ENABLE": "0"})
    cfg = config_from_argv(["--variant-env", "*=NCCL_NVLS_ENABLE=1"])
    with pytest.raises(BenchError, match="--variant-env may not set NCCL_NVLS_ENABLE: the harness keeps "
                                         "NCCL_NVLS_ENABLE=0"):
        serve_plan.resolve_plan(cfg, harness)
    assert serve_plan.resolve_plan(config_from_argv(["--variant-env", "full=OK=1"]), harness).env_for("full") == {
        "OK": "1"}


def test_dry_run_shows_each_builds_extra_env_before_its_server_command(tmp_path):
    p = drive("--dry-run", "--variants", "full,slow", "--variant-env", "full=FOO=1 2", "--variant-env", "+=BAR=b",
              tmp_path=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = {line.split(":")[0]: line for line in p.stdout.splitlines() if line.startswith("server ")}
    assert lines["server full"].startswith("server full: BAR=b 'FOO=1 2' ")
    assert lines["server slow"].startswith("server slow: BAR=b ") and "FOO" not in lines["server slow"]
    assert "BAR" not in lines["server baseline"] and "FOO" not in lines["server baseline"]


def test_builds_with_patch_0003_get_the_dcu_attention_backend_on_cuda(tmp_path):
    p = drive("--dry-run", "--variants", "full,slow", tmp_path=tmp_path)
    lines = {line.split(":")[0]: line for line in p.stdout.splitlines() if line.startswith("server ")}
    assert lines["server full"].endswith("--attention-backend TRITON_ATTN --attention-backend DCU_TRITON_ATTN")
    assert lines["server slow"].endswith("--attention-backend TRITON_ATTN")  # no dcu_patchset.json
    p = drive("--dry-run", "--variants", "full", "--no-patch-flags", tmp_path=tmp_path)
    full = next(line for line in p.stdout.splitlines() if line.startswith("server full: "))
    assert "DCU_TRITON_ATTN" not in full


def test_eager_mode_and_capture_sizes_reach_the_harness_flags(tmp_path):
    p = drive("--dry-run", "--mode", "eager", "--capture-sizes", "1,2,4,16", tmp_path=tmp_path)
    assert p.returncode == 0, p.stderr
    server = next(line for line in p.stdout.splitlines() if line.startswith("server baseline: "))
    assert server.endswith("""--compilation-config '{"cudagraph_capture_sizes": [1, 2, 4, 16]}' --enforce-eager""")
    p = drive("--dry-run", "--capture-sizes", "1,x", tmp_path=tmp_path)
    assert p.returncode == 2 and "--capture-sizes must be a comma list of integers" in p.stderr


def test_decode_graph_mode_skips_compile_and_captures_full_decode_graphs(tmp_path):
    p = drive("--dry-run", "--mode", "decode-graph", "--capture-sizes", "1,2", tmp_path=tmp_path)
    assert p.returncode == 0, p.stderr
    server = next(line for line in p.stdout.splitlines() if line.startswith("server baseline: "))
    assert server.endswith("""--compilation-config '{"cudagraph_capture_sizes": [1, 2], "mode": 0, """
                           """"cudagraph_mode": "FULL_DECODE_ONLY"}'""")
    assert "--enforce-eager" not in server


def test_dcu64_profile_enforces_the_scaled_kv_budget(tmp_path):
    p = drive("--dry-run", "--profile", "dcu64", "--layers", "16", tmp_path=tmp_path)
    assert p.returncode == 0, p.stderr
    assert f"--kv-cache-memory-bytes {profiles.dcu64_kv_bytes(16)}" in p.stdout
    p = drive("--dry-run", "--profile", "dcu64", "--layers", "32", "--kv-gib", "6", tmp_path=tmp_path)
    assert f"--kv-cache-memory-bytes {6 * 2**30 // 2}" in p.stdout


def test_dcu64_arithmetic_gives_the_documented_budget():
    """The numbers of bench/profiles.py's docstring, worked out by hand there, and the budget the 2026-11-30 load
    runs were made with (kv_cache_memory_bytes 1904678988 at 16 layers, bench/results/)."""
    # Qwen3.5-27B: ~26.9e9 language-model parameters, ~54 GB in bf16
    assert profiles.lm_params(64) == pytest.approx(26.896e9, rel=1e-3)
    b = profiles.dcu64_breakdown()
    assert b["usable_gib"] == pytest.approx(60.8)
    assert b["lm_weights_gib"] == pytest.approx(50.10, abs=0.005)
    assert b["vision_weights_gib"] == pytest.approx(0.86, abs=0.005)
    assert b["kv_gib_64_layers"] == pytest.approx(7.10, abs=0.01)
    assert profiles.dcu64_kv_bytes(16) == 1904678988  # 1.77 GiB
    assert profiles.dcu64_kv_bytes(16) * 4 == pytest.approx(profiles.dcu64_kv_bytes(64), abs=4)
    with pytest.raises(ValueError, match="nothing left"):
        profiles.dcu64_kv_bytes(16, kv_gib_64_layers=-1.0)


def test_full_loop_with_fake_vllm_writes_json_report_and_plot(tmp_path):
    p = drive("--variants", "full,broken,slow", "--tiers", "4-8K", "--requests", "3", "--what", "loop",
              tmp_path=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    out = tmp_path / "out"
    files = sorted(os.listdir(out))
    js = [f for f in files if f.endswith("-test-loop.json")]
    assert len(js) == 1 and js[0].replace(".json", ".md") in files and js[0].replace(".json", ".png") in files
    doc = json.load(open(out / js[0]))
    ran = [(r["variant"], r["repeat"]) for r in doc["runs"] if r.get("bench")]
    assert ran == [("baseline", 0), ("full", 0), ("slow", 0), ("baseline", 1)]
    broken = [r for r in doc["runs"] if r["variant"] == "broken"]
    assert len(broken) == 1 and "fake start failure" in broken[0]["error"]
    assert doc["runs"][0]["server"]["kv_cache_gib"] == 1.77 and doc["runs"][0]["server"]["kv_cache_tokens"] == 116424
    assert doc["prompts"]["4-8K"]["count"] == 64 and len(doc["prompts"]["4-8K"]["sha256"]) == 64
    assert os.path.exists(out / doc["runs"][0]["raw_file"])
    # the fake server's counters grow by a fixed step per scrape: one scrape before and one after each run
    assert doc["runs"][0]["server_counters"] == {"preemptions": 3, "prompt_tokens": 1000}
    assert "[bench +" in p.stdout and "full healthy after" in p.stdout  # progress lines
    md = p.stdout[p.stdout.index("# Serving benchmark"):]  # the report is printed last
    full = next(line for line in md.splitlines() if line.startswith("| full | 1 |"))
    assert full.split("|")[4].strip() == "1.250"
    slow = next(line for line in md.split("### Score terms")[1].splitlines() if line.startswith("| slow |"))
    assert slow.split("|")[3].strip() == "0.00"
    assert "| broken | 0 | failed: server exited with status 3 while starting: RuntimeError: fake start failure" in md


def test_deadline_skips_servers_that_would_not_finish(tmp_path):
    # every fake server takes 8 s to start: after the first one, the next would end past the deadline
    p = drive("--variants", "full,slow", "--tiers", "4-8K", "--requests", "2", "--what", "deadline",
              "--deadline-s", "20", tmp_path=tmp_path, env_extra={"FAKE_VLLM_START_S": "8"})
    assert p.returncode == 0, p.stdout + p.stderr
    js = next(f for f in os.listdir(tmp_path / "out") if f.endswith("-test-deadline.json"))
    doc = json.load(open(tmp_path / "out" / js))
    assert doc["runs"][0]["variant"] == "baseline" and doc["runs"][0].get("bench")
    assert doc["skipped"] and all(s["why"].startswith("deadline") for s in doc["skipped"])
    assert "skipped" in open(tmp_path / "out" / js.replace(".json", ".md")).read()


def test_server_flags_parse_with_vllms_own_serve_parser(monkeypatch):
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.platforms import current_platform
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    monkeypatch.setattr(current_platform, "device_type", "cpu")  # the parser's DeviceConfig default needs one
    a = config_from_argv(["--profile", "dcu64", "--layers", "16"])
    cmd = serve_plan.server_cmd(a, "/models/q35", 8123, ["--language-model-only", "--attention-backend",
                                                           "TRITON_ATTN"], ["--attention-backend", "FLASHINFER"])
    assert cmd[1:4] == ["-m", "vllm.entrypoints.cli.main", "serve"]
    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(cmd[4:])
    assert (ns.model_tag, ns.host, ns.port) == ("/models/q35", "127.0.0.1", 8123)
    assert (ns.max_num_seqs, ns.max_num_batched_tokens, ns.gpu_memory_utilization) == (128, 4096, 0.95)
    assert ns.kv_cache_memory_bytes == profiles.dcu64_kv_bytes(16)
    assert ns.default_chat_template_kwargs == {"enable_thinking": False}
    assert (ns.reasoning_parser, ns.tool_call_parser, ns.enable_auto_tool_choice) == ("qwen3", "qwen3_coder", True)
    assert (ns.dtype, ns.load_format, ns.max_model_len, ns.served_model_name) == (
        "bfloat16", "dummy", 32768, ["Qwen3.5-27B"])
    assert "FLASHINFER" in str(ns.attention_backend)  # a build's --variant-flags override the harness's


def test_bench_flags_parse_with_vllm_bench_serves_own_parser():
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    a = config_from_argv(["--protocols", "contest,load"])
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    c = parser.parse_args(serve_plan.bench_cmd(a, "contest", "4-8K", 8123, "/p/4-8K.jsonl", "/r", "x.json",
                                                None, {"variant": "v1"}))
    assert (c.backend, c.endpoint, c.dataset_name, c.dataset_path) == (
        "openai-chat", "/v1/chat/completions", "custom", "/p/4-8K.jsonl")
    assert (c.max_concurrency, c.request_rate, c.num_warmups, c.temperature) == (1, 1.0, 2, 0.0)
    assert (c.custom_output_len, c.ignore_eos, c.num_prompts, c.extra_body) == (250, True, 10, {"temperature": 0.0})
    assert (c.percentile_metrics, c.metric_percentiles) == ("ttft,tpot,itl,e2el", "50,95,99")
    assert c.disable_shuffle and c.no_oversample and c.save_result and c.save_detailed
    assert (c.result_dir, c.result_filename, c.metadata) == ("/r", "x.json", ["variant=v1"])
    ld = parser.parse_args(serve_plan.bench_cmd(a, "load", "4-8K", 8123, "/p/4-8K.jsonl", "/r", "y.json",
                                                 3.25, {}))
    assert (ld.max_concurrency, ld.request_rate, ld.num_prompts) == (16, 3.25, 32)


def test_server_log_parsing_reads_vllm_0_18_1_messages_and_the_memory_overhead():
    from bench.serve_metrics import memory_overhead_gib, parse_server_log

    log = """INFO 11-30 04:00:00 [utils.py:277] vLLM server version 0.18.1+dcu.2.ab12cd34, serving model /m
INFO [gpu_model_runner.py:4567] Model loading took 16.08 GiB memory and 12.5 seconds
INFO [monitor.py:20] torch.compile took 35.21 s in total
INFO [gpu_worker.py:457] Available KV cache memory: 110.51 GiB
INFO [kv_cache_utils.py:1316] GPU KV cache size: 1,552,320 tokens
INFO [kv_cache_utils.py:1322] Maximum concurrency for 32,768 tokens per request: 47.37x
INFO [gpu_model_runner.py:5747] Graph capturing finished in 12 secs, took 0.55 GiB
INFO [core.py:282] init engine (profile, create kv cache, warmup model) took 80.12 seconds
"""
    info = parse_server_log(log)
    assert info == {"vllm_version": "0.18.1+dcu.2.ab12cd34", "weights_gib": 16.08, "compile_s": 35.21,
                    "kv_cache_gib": 110.51, "kv_cache_tokens": 1552320, "max_concurrency_x": 47.37,
                    "graph_capture_s": 12, "graph_capture_gib": 0.55, "engine_init_s": 80.12}
    assert memory_overhead_gib(info, 140.0) == round(0.95 * 140.0 - 16.08 - 110.51, 2)
    assert memory_overhead_gib({"kv_cache_gib": 1.0}, 140.0) is None


def test_bench_client_reports_each_call_and_survives_a_bad_one(tmp_path):
    import sys as _sys

    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "tests", "data", "fake_vllm"))
    bad = ["--port", "1", "--bogus-flag"]
    p = subprocess.run([_sys.executable, "bench/bench_client.py"], input=json.dumps(bad) + "\n" + json.dumps(bad)
                       + "\n", capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    marks = [json.loads(line[len(MARK):]) for line in p.stdout.splitlines() if line.startswith(MARK)]
    assert marks[0] == {"rc": 0, "ready": True}
    assert len(marks) == 3 and all(m["rc"] == 1 for m in marks[1:])
    assert marks[1]["error"].startswith("vllm bench serve: error: ")  # argparse's own line


def test_report_records_the_exact_command_and_prints_the_tables_last(tmp_path):
    p = drive("--variants", "full", "--tiers", "4-8K", "--requests", "2", "--what", "cmd", "--no-repeat-baseline",
              tmp_path=tmp_path, env_extra={"VLLM_DCU_VARIANT": "full"})
    assert p.returncode == 0, p.stdout + p.stderr
    md = next(f for f in os.listdir(tmp_path / "out") if f.endswith("-test-cmd.md"))
    first = open(tmp_path / "out" / md).read().splitlines()[2]
    assert first == (f"Command: `bash ci/gpu/run.sh python -m bench.serve_bench --work {tmp_path / 'work'} --gpu test "
                     "--variants full --tiers 4-8K --requests 2 --what cmd --no-repeat-baseline`")
    assert p.stdout.rstrip().endswith("|")  # a table row is the last thing printed
    assert "## Setup" not in p.stdout


def test_first_build_counts_at_half_in_the_deadline_estimate():
    # the first build pays the cold JIT: it must not make a warm second build look unaffordable
    assert serve_plan.server_estimate([]) is None
    assert serve_plan.server_estimate([380.0]) == 190.0
    assert serve_plan.server_estimate([380.0, 120.0]) == 120.0
    assert serve_plan.server_estimate([380.0, 120.0, 150.0, 100.0]) == 150.0


def test_auto_load_rate_is_capped_by_kv_capacity_under_dcu64():
    conc1 = {"mean_ttft_ms": 1400.0, "mean_e2el_ms": 2900.0}  # a 16-32K concurrency-1 run, 16 layers
    rate, how = serve_plan.auto_load_rate(conc1, "16-32K", 16, "h200")
    assert rate == pytest.approx(0.6 / 1.4) and "concurrency-1" in how
    rate, how = serve_plan.auto_load_rate(conc1, "16-32K", 16, "dcu64")
    assert rate == pytest.approx(0.1) and how == "dcu64 KV-capacity cap"
    assert serve_plan.auto_load_rate(None, "16-32K", 64, "dcu64")[0] == pytest.approx(0.025)
    rate, how = serve_plan.auto_load_rate(None, "4-8K", 16, "h200")
    assert rate == 4.0 and how.startswith("fixed table")


def test_server_counters_are_summed_over_label_sets_and_reported_as_increases():
    text = ("# HELP vllm:num_preemptions_total x\n# TYPE vllm:num_preemptions_total counter\n"
            'vllm:num_preemptions_total{engine="0",model_name="m"} 4.0\n'
            'vllm:num_preemptions_total{engine="1",model_name="m"} 2.0\n'
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1.5e+04\n'
            'vllm:prompt_tokens_created{engine="0",model_name="m"} 1.7e+09\n'
            "vllm:generation_tokens_total 250\n")
    got = serve_metrics.parse_counters(text)
    assert got == {"preemptions": 6.0, "prefix_cache_hits": 15000.0, "generation_tokens": 250.0}
    after = dict(got, preemptions=9.0)
    assert serve_metrics.counter_increase(got, after) == {"preemptions": 3, "prefix_cache_hits": 0,
                                                         "generation_tokens": 0}
    assert serve_metrics.counter_increase(None, after) is None


_BAD_CONFIG = "e2e_offline: error: bad configuration {spec!r}; expected NAME=VARIANT:BACKEND:KV_DTYPE[:KEY=VALUE,...]"
_BAD_BLOCK = "e2e_offline: error: E2E_BLOCK_SIZE must be a multiple of 16 tokens, got {block!r}"
_BLOCK_SPEC = "x=full:DCU_TRITON_ATTN:int8_per_token_head:E2E_BLOCK_SIZE={}"


@pytest.mark.parametrize("spec, message", [
    *((spec, _BAD_CONFIG.format(spec=spec)) for spec in
      ("x=full:DCU_TRITON_ATTN", "x=full:DCU_TRITON_ATTN:auto:1BAD=3", "x=full:DCU_TRITON_ATTN:auto:NOVALUE")),
    *((_BLOCK_SPEC.format(block), _BAD_BLOCK.format(block=block)) for block in ("2050", "abc", "0")),
])
def test_e2e_offline_rejects_a_bad_configuration_with_one_line(spec, message, tmp_path):
    p = subprocess.run([sys.executable, "bench/e2e_offline.py", spec, "--out", str(tmp_path)], capture_output=True,
                       text=True, cwd=REPO, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [message]
    assert os.listdir(tmp_path) == []


def _e2e_offline():
    """bench/e2e_offline.py as a module (it is run as a script on the GPU box)."""
    import importlib.util

    path = os.path.join(REPO, "bench", "e2e_offline.py")
    spec = importlib.util.spec_from_file_location("e2e_offline_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_e2e_offline_counts_triton_compiles_per_phase():
    mod = _e2e_offline()
    stderr = "\n".join([
        "triton-compile pid=1 t=1.0 s=2.10 kernel=vllm.a._prefill_kernel constexprs={}",
        "e2e-phase engine-up", "some log line",
        "e2e-phase first-request-4096",
        "triton-compile pid=1 t=2.0 s=0.50 kernel=fla.ops.chunk_fwd_h constexprs={'BT': 64}",
        "e2e-phase timed-4096",
    ])
    assert mod.compiles_by_phase(stderr) == {"start": ["vllm.a._prefill_kernel"], "engine-up": [],
                                             "first-request-4096": ["fla.ops.chunk_fwd_h"], "timed-4096": []}


def test_e2e_offline_counts_autotune_lookups_per_phase_and_keeps_the_diag_lines():
    mod = _e2e_offline()
    stderr = "\n".join([
        "triton-autotune pid=1 t=1.0 kernel=fla.ops.cumsum.k disk=miss key=(1, 48, 64, 'torch.float32')",
        "INFO engine started",
        "e2e-phase first-request-4096",
        "triton-compile pid=1 t=2.0 s=0.50 kernel=fla.ops.chunk_fwd_h constexprs={} spec=T: i32",
        "triton-autotune pid=1 t=2.5 kernel=fla.ops.chunk_o.k disk=hit key=(48, 128)",
        "INFO 12-05 14:15:03 [kv_cache_utils.py:1318] GPU KV cache size: 372,816 tokens",
        "INFO 12-05 14:15:04 [decisions.py:192]   gemv 576x576:bfloat16  1 row ours 0.73x (tuned file)",
        "INFO 12-05 14:15:04 [dispatch.py:301] dcu-gemv: table complete (auto): 5 shapes; measuring grew ...",
        "INFO 12-05 14:15:04 [core.py:284] init engine (profile, create kv cache, warmup model) took 2.17 seconds",
    ])
    assert mod.compiles_by_phase(stderr, "triton-autotune") == {"start": ["fla.ops.cumsum.k"],
                                                                "first-request-4096": ["fla.ops.chunk_o.k"]}
    assert mod.compiles_by_phase(stderr) == {"start": [], "first-request-4096": ["fla.ops.chunk_fwd_h"]}
    kept = mod.diag_lines(stderr).splitlines()
    assert len(kept) == 7 and "INFO engine started" not in kept and kept[1] == "e2e-phase first-request-4096"
    # the engine's decision table, the GEMV summary and the KV size (what explains a start's KV blocks), no other INFO
    assert [line.split("] ", 1)[1][:14] for line in kept[4:]] == ["GPU KV cache s", "  gemv 576x576", "dcu-gemv: tabl"]


def test_e2e_offline_names_the_configurations_that_compiled_after_start():
    mod = _e2e_offline()
    results = [dict(name="warm", variant="base", compiled_after_start=[], autotuned_after_start=[]),
               dict(name="cold", variant="full", compiled_after_start=["fla.k2", "fla.k1"],
                    autotuned_after_start=["fla.k1"])]
    assert mod.late_work(results) == ["cold: Triton work after start: fla.k1, fla.k2"]
    assert mod.late_work(results[:1]) == []
    # --require-warm-start holds every configuration but the baseline (0.18.1 compiles at its first request by design:
    # the H100's tuned-start run exited 1 naming only base's kernels)
    assert mod.late_work(results[::-1], exempt_baseline=True) == []
    assert mod.late_work(results, exempt_baseline=True) == ["cold: Triton work after start: fla.k1, fla.k2"]
    assert mod.late_work(results[1:], exempt_baseline=True) == ["cold: Triton work after start: fla.k1, fla.k2"]
    # ... and its repeat (the H200's tuned-start run exited 1 naming base-2's kernels), not another setup that compiled
    base = dict(variant="base", backend="TRITON_ATTN", kv="auto", env={})
    runs = [dict(base, name="base", compiled_after_start=["fla.k1"]), dict(base, name="tuned", variant="full"),
            dict(base, name="base-2", compiled_after_start=["fla.k1"]),
            dict(base, name="base-int8", kv="int8_per_token_head", compiled_after_start=["fla.k1"])]
    assert mod.late_work(runs, exempt_baseline=True) == ["base-int8: Triton work after start: fla.k1"]



def test_results_files_spell_a_device_as_the_committed_results_do():
    """e2e_offline, kv_drift and the real model's engine route name their files with one helper."""
    from kernels.results_io import device_tag

    assert device_tag("NVIDIA H100 80GB HBM3") == "h100-80gb-hbm3"
    assert device_tag("NVIDIA H200") == "h200"
