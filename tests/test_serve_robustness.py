"""The serving robustness benchmark (python -m bench.serve_robustness), its malformed-request catalogue
(bench/bad_requests.py) and the GPU test of issue #20 (tests/gpu/test_serve_token_ids.py), on the CPU.

- The catalogue against vLLM's real OpenAI app (patched tree, official flags, engine replaced:
  tests/vllm_app_cpu.py): every case gets the answer it expects, with and without a tokenizer.
- The GPU test's request loop against the same app, and its `vllm serve` commands through vLLM's own parser.
- Request generation, the tally, /metrics parsing and the verdict as units.
- The whole driver (start, size, warm-up, load, drain, probe, verdict, result files) through a fake harness whose
  `vllm serve` behaves, dies on a stop id (0.18.1 without patch 0008), leaks KV on disconnects, lacks patch 0003,
  or crashes at start (tests/data/fake_robust).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from bench import bad_requests, profiles, serve_harness
from bench import robust_requests as rq
from bench import robust_server as rs
from bench import serve_robustness as sr
from bench.serve_config import BenchError

REPO = Path(__file__).resolve().parent.parent
FAKE_HARNESS = REPO / "tests" / "data" / "fake_robust" / "harness.py"
V = profiles.VOCAB


def _load_gpu_test():
    spec = importlib.util.spec_from_file_location("gpu_test_serve_token_ids",
                                                  REPO / "tests" / "gpu" / "test_serve_token_ids.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ============================================================================ the catalogue against vLLM's app
class AppServer:
    """tests/gpu/_server.py's Server interface (post, post_stream, alive, log_tail) over a TestClient."""

    def __init__(self, client):
        self.client = client

    def post(self, path, body, timeout=0):
        r = self.client.post(path, json=body)
        try:
            return r.status_code, r.json()
        except ValueError:
            return r.status_code, r.text

    def post_stream(self, path, body, timeout=0):
        r = self.client.post(path, json=body)
        if r.status_code != 200:
            return r.status_code, [r.text]
        events = []
        for line in r.text.splitlines():
            if line.startswith("data:"):
                data = line[5:].strip()
                events.append(data if data == "[DONE]" else json.loads(data))
        return r.status_code, events

    def alive(self):
        return True

    def log_tail(self):
        return ""


@pytest.fixture(scope="module", params=["skip-tokenizer-init", "tokenizer"])
def app(request, vllm_tree, tmp_path_factory):
    from vllm_app_cpu import QWEN_VOCAB, openai_app, write_model

    tok = request.param == "tokenizer"
    model = write_model(tmp_path_factory.mktemp("robust"), QWEN_VOCAB, QWEN_VOCAB if tok else None)
    with openai_app(model, tokenizer=tok) as (client, engine):
        yield types.SimpleNamespace(client=client, engine=engine, tokenizer=tok)


def test_every_catalogue_case_gets_the_answer_it_expects_from_vllms_app(app):
    from vllm_app_cpu import SERVED

    cases = bad_requests.catalogue(SERVED, V, 4096, tokenizer=app.tokenizer)
    assert len({c.kind for c in cases}) == len(cases)
    assert any(c.stream for c in cases) and any(c.raw for c in cases)
    assert app.tokenizer == any(c.needs_tokenizer for c in cases)
    n = len(app.engine.added)
    wrong = []
    for case in cases:
        r = app.client.post(case.path, content=case.payload(), headers={"Content-Type": "application/json"})
        body = r.json() if not case.stream else None
        if case.stream:
            events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
            body = json.loads(events[0]) if events and events[0] != "[DONE]" else None
        v = bad_requests.judge(case, r.status_code, body)
        if not v.ok:
            wrong.append(f"{case.kind}: {v.why} ({str(body)[:200]})")
    assert not wrong, "\n".join(wrong)
    # nothing malformed reached the engine (a batch's first, valid prompt may have; it is aborted)
    assert all(0 <= min(r.prompt_token_ids) and max(r.prompt_token_ids) < V for r in app.engine.added[n:])


def test_the_benchmarks_client_and_tally_against_vllms_app_over_a_socket(vllm_tree, tmp_path):
    """The load loop as on the GPU box (HttpClient, streams, clients that hang up, every malformed case) against
    vLLM's serving layer on a real socket: nothing unexpected, every kind answered as the tally expects."""
    from vllm_app_cpu import QWEN_VOCAB, SERVED, openai_server, write_model

    model = write_model(tmp_path / "m", QWEN_VOCAB, QWEN_VOCAB)
    with openai_server(model, tokenizer=True) as (port, engine):
        client = rq.HttpClient("127.0.0.1", port, timeout_s=60)
        assert rs.warmup(client, SERVED, 4, prompt_len=16)["ok"] == 4
        mixes = [rq.RequestMix(model=SERVED, vocab=V, max_model_len=4096, prompt_range=(8, 40),
                               output_range=(4, 12), tokenizer=True, seed=i, start=i * 7) for i in range(4)]
        tally = rq.Tally()
        out = rs.Load(client, mixes, tally, kv_tokens=100).run(6.0, 20.0)
        assert rs.probe(client, SERVED).status == 200
    s = tally.summary()
    assert s["unexpected"] == 0 and s["http_5xx"] == 0 and s["timeouts"] == 0 and s["transport_errors"] == 0, s
    assert out["unfinished_at_drain"] == 0 and out["demand_ratio_mean"] > 0
    for kind in ("completion", "chat", "stream"):
        assert s["completed_by_kind"].get(kind, 0) > 0, s
    assert s["disconnects"] > 0 and s["rejected_4xx"] > 0
    assert all(0 <= min(r.prompt_token_ids) and max(r.prompt_token_ids) < V for r in engine.added)


def test_the_gpu_tests_request_loop_passes_against_vllms_app(app):
    from vllm_app_cpu import SERVED

    gpu = _load_gpu_test()
    srv = AppServer(app.client)
    cases = [c for c in bad_requests.catalogue(SERVED, V, 4096, tokenizer=app.tokenizer) if c.token_id]
    assert gpu._refuse_all(srv, cases) == []
    good = {"model": SERVED, "prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0.0, "return_token_ids": True}
    assert gpu._tokens(*srv.post("/v1/completions", good)) == [1, 2, 3, 4]
    if app.tokenizer:  # the tokenizer test's greedy request is a chat one
        chat = {"model": SERVED, "max_tokens": 3, "temperature": 0.0, "ignore_eos": True, "return_token_ids": True,
                "messages": [{"role": "user", "content": "What is the answer to the quiz?"}]}
        assert gpu._tokens(*srv.post("/v1/chat/completions", chat)) == [1, 2, 3]
    # and it notices a case answered otherwise than expected
    lax = [bad_requests.BadCase("lax", "/v1/completions", good, 400, "prompt_token_ids")]
    assert "status 200, expected 400" in gpu._refuse_all(srv, lax)[0]


def test_the_gpu_tests_serve_commands_parse_with_vllms_own_parser(monkeypatch, tmp_path, vllm_tree):
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.platforms import current_platform
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    monkeypatch.setattr(current_platform, "device_type", "cpu", raising=False)
    spec = importlib.util.spec_from_file_location("real_harness", REPO / "ci" / "gpu" / "harness.py")
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    gpu = _load_gpu_test()
    smoke = dict(max_model_len=4096, max_num_seqs=16, max_num_batched_tokens=2048, gpu_memory_utilization=0.45,
                 compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 8, 16]})  # tests/gpu/conftest.py
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text("{}")
    argv = gpu.serve_argv_without_tokenizer(harness, str(plain), 8123, smoke)
    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[4:])
    assert ns.skip_tokenizer_init and ns.enable_prefix_caching is False and ns.port == 8123
    tok_dir = gpu.write_model_with_tokenizer(tmp_path / "tok")
    argv = gpu.serve_argv_with_tokenizer(harness, tok_dir, 8124, smoke)
    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[4:])
    assert not ns.skip_tokenizer_init and ns.served_model_name == ["Qwen3.5-27B"]
    assert (ns.reasoning_parser, ns.tool_call_parser, ns.enable_auto_tool_choice) == ("qwen3", "qwen3_coder", True)
    assert ns.default_chat_template_kwargs == {"enable_thinking": False}
    assert json.loads((Path(tok_dir) / "config.json").read_text())["text_config"]["vocab_size"] == V


def test_the_benchmarks_server_command_parses_with_vllms_own_parser(monkeypatch, vllm_tree):
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.platforms import current_platform
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    monkeypatch.setattr(current_platform, "device_type", "cpu", raising=False)
    spec = importlib.util.spec_from_file_location("real_harness", REPO / "ci" / "gpu" / "harness.py")
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    a = sr.build_parser().parse_args(["--layers", "8"])
    sr.check_args(a)
    flags = serve_harness.harness_serve_args(harness, "decode-graph", sr.CAPTURE_SIZES)
    for name, spec_ in sr.CONFIGS.items():
        cmd = sr.server_cmd(a, "/models/q35", 8125, flags, spec_.flags)
        ns = make_arg_parser(FlexibleArgumentParser()).parse_args(cmd[4:])
        assert "DCU_TRITON_ATTN" in str(ns.attention_backend), name
        assert (ns.max_num_seqs, ns.max_num_batched_tokens, ns.max_model_len) == (128, 4096, 16384)
        assert ns.kv_cache_memory_bytes == profiles.dcu64_kv_bytes(8)
        assert (ns.reasoning_parser, ns.tool_call_parser) == ("qwen3", "qwen3_coder")
        assert (ns.kv_cache_dtype == "int8_per_token_head") == name.startswith("int8")
        assert (ns.scheduler_tpot_target_ms == 30.0) == name.endswith("t30")


# ============================================================================ units
def _mix(**kw):
    base = dict(model="m", vocab=V, max_model_len=8192, prompt_range=(100, 300), output_range=(8, 32),
                tokenizer=True, seed=3)
    base.update(kw)
    return rq.RequestMix(**base)


def test_request_mix_is_deterministic_in_range_and_covers_every_malformed_kind():
    m, m2 = _mix(), _mix()
    reqs = [m.next() for _ in range(600)]
    again = [m2.next() for _ in range(600)]
    assert [(r.kind, r.payload) for r in reqs] == [(r.kind, r.payload) for r in again]
    kinds = {r.kind for r in reqs}
    assert {"completion", "chat", "stream", "disconnect"} <= kinds
    assert {c.kind for c in bad_requests.catalogue("m", V, 8192)} <= kinds  # round robin over the catalogue
    for r in reqs:
        if r.case is not None:
            assert r.payload == r.case.payload() and r.demand_tokens == 0
            continue
        body = json.loads(r.payload)
        n = len(body["prompt"]) if "prompt" in body else len(body["messages"][0]["content"].split())
        assert 100 <= n <= 300 and 8 <= body["max_tokens"] <= 32 and r.max_tokens == body["max_tokens"]
        assert r.demand_tokens == n + body["max_tokens"] and body["ignore_eos"] is True
        assert body.get("stream", False) == (r.kind in ("stream", "disconnect"))
        assert (r.disconnect_after > 0) == (r.kind == "disconnect")
        if "prompt" in body:
            assert all(1000 <= t < 200000 for t in body["prompt"])
    share = sum(r.case is not None for r in reqs) / len(reqs)
    assert 0.05 < share < 0.16


def test_request_mix_without_tokenizer_sends_no_chat_and_refuses_contexts_that_do_not_fit():
    m = _mix(tokenizer=False)
    assert {r.kind for r in (m.next() for _ in range(300))}.isdisjoint({"chat", "chat-stop-id"})
    with pytest.raises(BenchError, match="do not fit --max-model-len 200"):
        _mix(max_model_len=200)


def test_concurrency_reaches_the_overload_within_the_cap():
    m = _mix(prompt_range=(2048, 6144), output_range=(32, 160))
    assert m.kv_share() == pytest.approx(0.9) and m.mean_demand() == 4192
    n = rq.concurrency_for(116424, m, 2.2, 192)
    assert n == 68 and n * m.kv_share() * m.mean_demand() >= 2.2 * 116424
    assert rq.concurrency_for(10 ** 7, m, 2.2, 192) == 192 and rq.concurrency_for(10, m, 2.2, 192) == 4


def _req(kind="completion", **kw):
    return rq.Req(kind, "/v1/completions", b"{}", **kw)


def test_tally_classifies_every_kind_of_answer():
    t = rq.Tally()
    case = next(c for c in bad_requests.catalogue("m", V, 4096) if c.kind == "prompt-id")
    scase = next(c for c in bad_requests.catalogue("m", V, 4096) if c.stream)
    ok_err = {"error": {"code": 400, "param": case.expect_param, "message": case.expect_text}}
    assert t.add(_req(max_tokens=5), rq.Outcome(200, {"usage": {"completion_tokens": 5}})) == "completed"
    assert t.add(_req(max_tokens=5), rq.Outcome(200, {"usage": {"completion_tokens": 4}})) == "unexpected"
    assert t.add(_req(max_tokens=5), rq.Outcome(400, {"error": {"code": 400}})) == "unexpected"
    assert t.add(rq.Req(case.kind, case.path, b"", case=case), rq.Outcome(400, ok_err)) == "rejected"
    wrong_param = {"error": {"code": 400, "param": "seed", "message": case.expect_text}}
    assert t.add(rq.Req(case.kind, case.path, b"", case=case), rq.Outcome(400, wrong_param)) == "unexpected"
    assert t.add(rq.Req(case.kind, case.path, b"", case=case), rq.Outcome(500, {"error": {"code": 500}})) == "5xx"
    sev = {"error": {"code": 400, "param": scase.expect_param, "message": scase.expect_text}}
    assert t.add(rq.Req(scase.kind, scase.path, b"", stream=True, case=scase),
                 rq.Outcome(200, sev, [sev, "[DONE]"])) == "rejected"
    done = [{"choices": [{"text": "w"}], "usage": None}, {"choices": [], "usage": {"completion_tokens": 2}}, "[DONE]"]
    assert t.add(_req("stream", stream=True, max_tokens=2), rq.Outcome(200, done[0], done)) == "completed"
    assert t.add(_req("stream", stream=True, max_tokens=2), rq.Outcome(200, done[0], done[:2])) == "unexpected"
    err500 = {"error": {"code": 500, "message": "EngineDeadError"}}
    assert t.add(_req("stream", stream=True, max_tokens=2), rq.Outcome(200, err500, [err500, "[DONE]"])) == "5xx"
    assert t.add(_req("disconnect", stream=True, disconnect_after=2),
                 rq.Outcome(200, done[0], done[:2], closed_by_client=True)) == "disconnect"
    assert t.add(_req(), rq.Outcome(None, error="timeout: x", timeout=True)) == "timeout"
    assert t.add(_req(), rq.Outcome(None, error="ConnectionRefusedError: y")) == "transport"
    s = t.summary()
    assert (s["sent"], s["completed"], s["rejected_4xx"], s["unexpected"], s["http_5xx"]) == (13, 2, 2, 4, 2)
    assert (s["disconnects"], s["timeouts"], s["transport_errors"]) == (1, 1, 1)
    assert s["rejected_by_kind"] == {case.kind: 1, scase.kind: 1}
    assert len(s["examples"]["unexpected"]) == 4 and "expected 5" in s["examples"]["unexpected"][0]


def test_metrics_parsing_reads_vllms_names():
    text = """# HELP vllm:kv_cache_usage_perc KV-cache usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen3.5-27B"} 0.25
vllm:num_requests_running{engine="0",model_name="Qwen3.5-27B"} 3.0
vllm:num_requests_waiting{engine="0",model_name="Qwen3.5-27B"} 7.0
vllm:num_preemptions_total{engine="0",model_name="Qwen3.5-27B"} 12.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="Qwen3.5-27B"} 40.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="Qwen3.5-27B"} 5.0
"""
    m = rs.parse_metrics(text)
    assert rs.metric(m, "vllm:kv_cache_usage_perc", "max") == 0.25 and rs.metric(m, "nope") is None
    assert rs.by_label(m, "vllm:request_success_total", "finished_reason") == {"length": 40.0, "abort": 5.0}
    assert rs.metric(m, "vllm:num_preemptions_total") == 12.0


def _record(**over):
    rec = {"config": "bf16", "engine_deaths": 0, "kv_usage_after_drain": 0.0, "gpu_memory_growth_mib": 10.0,
           "load": {"unfinished_at_drain": 0, "demand_ratio_mean": 2.3},
           "tally": {"http_5xx": 0, "unexpected": 0, "timeouts": 0, "transport_errors": 0, "completed": 50}}
    for k, v in over.items():
        if k in ("load", "tally"):
            rec[k] = dict(rec[k], **v)
        else:
            rec[k] = v
    return rec


@pytest.mark.parametrize("over,words", [
    ({}, None),
    ({"engine_deaths": 1, "death": "server exited (1)"}, "engine died: server exited (1)"),
    ({"tally": {"http_5xx": 2}}, "2 answers 5xx"),
    ({"tally": {"unexpected": 1}}, "1 unexpected answers"),
    ({"tally": {"timeouts": 1}}, "1 timeouts"),
    ({"tally": {"completed": 0}}, "no request completed"),
    ({"kv_usage_after_drain": 0.03}, "KV cache usage after the drain 0.03"),
    ({"kv_usage_after_drain": None}, "KV cache usage after the drain None"),
    ({"gpu_memory_growth_mib": 500.0}, "GPU memory grew 500 MiB"),
    ({"load": {"demand_ratio_mean": 1.4}}, "offered KV demand 1.4x"),
    ({"load": {"unfinished_at_drain": 3}}, "3 clients still waiting"),
])
def test_verdict_fails_for_each_reason(over, words):
    ok, why = sr.verdict(_record(**over), types.SimpleNamespace(mem_tolerance_mib=128.0))
    assert ok == (words is None), why
    if words:
        assert any(words in w for w in why), why
    assert not sr.verdict({"config": "x", "error": "boom"}, None)[0]


# ============================================================================ the driver, end to end (fake server)
def drive(*args, tmp_path, variant="full", kv_tokens=700, env_extra=None, timeout=240):
    env = dict(os.environ, VLLM_DCU_BENCH_HARNESS=str(FAKE_HARNESS), FAKE_KV_TOKENS=str(kv_tokens))
    env.pop("OUT", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "bench.serve_robustness", "--variant", variant, "--gpu", "test",
                           "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--max-model-len", "2048",
                           "--prompt-tokens", "50-200", "--output-tokens", "20-40", "--max-concurrency", "16",
                           "--warmup-requests", "8", "--load-s", "5", "--drain-timeout-s", "10", *args],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)


def _results(tmp_path):
    js = list((tmp_path / "out").glob("*-test-serve-robustness.json"))
    assert len(js) == 1, list((tmp_path / "out").iterdir())
    return json.loads(js[0].read_text()), js[0].with_suffix(".md").read_text()


def test_driver_passes_a_server_that_behaves_and_writes_both_files(tmp_path):
    p = drive("--configs", "bf16,int8", tmp_path=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    doc, md = _results(tmp_path)
    assert doc["command"].startswith("python -m bench.serve_robustness --variant full") and doc["pass"]
    assert md.splitlines()[2] == f"Command: `{doc['command']}`"
    assert [r["config"] for r in doc["configs"]] == ["bf16", "int8"]
    for r in doc["configs"]:
        t = r["tally"]
        assert r["pass"] and r["engine_deaths"] == 0 and r["kv_usage_after_drain"] == 0.0, r["why"]
        assert r["kv_capacity_tokens"] == 700 and r["clients"] == 12 and r["load"]["demand_ratio_mean"] >= 2.0
        assert t["completed"] > 0 and t["rejected_4xx"] > 0 and t["disconnects"] > 0 and t["unexpected"] == 0
        assert r["finished_by_reason"].get("abort", 0) >= 1 and r["preemptions"] > 0
        assert r["gpu_memory_growth_mib"] is None  # no nvidia-smi here: reported n/a, not invented
        assert "--kv-cache-dtype int8_per_token_head" in r["server_command"] or r["config"] == "bf16"
        assert os.path.exists(tmp_path / "out" / r["server_log"])
    last = p.stdout.strip().splitlines()
    assert last[-4].startswith("| config | completed |") and "| bf16 |" in last[-2] and "| int8 |" in last[-1]
    assert "PASS" in last[-1] and "n/a -> n/a" in last[-1]
    assert "## Requests by kind" in md and "| stop-id-min-tokens |" in md
    assert not list((tmp_path / "out").glob(".*.tmp"))


def test_driver_reports_an_engine_death_and_goes_on(tmp_path):
    p = drive("--configs", "bf16,bf16-t30", tmp_path=tmp_path, variant="fragile")
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-2000:]
    doc, md = _results(tmp_path)
    assert not doc["pass"] and len(doc["configs"]) == 2
    for r in doc["configs"]:  # the second configuration started a fresh server and died again
        assert r["engine_deaths"] == 1 and not r["pass"], r
        assert any("engine died" in w for w in r["why"])
    assert "FAIL" in p.stdout.strip().splitlines()[-1]


def test_driver_finds_kv_blocks_that_disconnects_leave_behind(tmp_path):
    p = drive("--configs", "bf16", tmp_path=tmp_path, variant="leaky")
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-2000:]
    doc, _ = _results(tmp_path)
    r = doc["configs"][0]
    assert r["engine_deaths"] == 0 and r["kv_usage_after_drain"] > 0
    assert any("KV cache usage after the drain" in w for w in r["why"])


def test_driver_skips_configurations_the_build_cannot_run_and_records_a_failed_start(tmp_path):
    p = drive("--configs", "bf16,int8", tmp_path=tmp_path, variant="nodecode")
    assert p.returncode == 1
    doc, _ = _results(tmp_path)
    assert doc["configs"][0]["skipped"] == "variant nodecode lacks patch(es) dcu-triton-decode-attention"
    assert doc["configs"][1]["skipped"].startswith("variant nodecode lacks patch(es) dcu-triton-decode-attention, kv-")
    p = drive("--configs", "bf16", tmp_path=tmp_path, variant="crash")
    assert p.returncode == 1
    doc, _ = _results(tmp_path)
    r = doc["configs"][0]
    assert "server exited with status 3" in r["error"] and not r["pass"]
    assert "FAIL (" in p.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("args,message", [
    (["--configs", "bf16,fp4"], "unknown configuration fp4; supported: bf16, int8, bf16-t30, int8-t30"),
    (["--configs", "bf16,bf16"], "--configs names a configuration twice"),
    (["--layers", "64"], "--layers must be 4, 8, 12 or 16, got 64"),
    (["--load-s", "1"], "--load-s must be in [5, 600], got 1"),
    (["--overload", "1.5"], "--overload must be in [2, 10]"),
    (["--prompt-tokens", "300-100"], "--prompt-tokens must be LO-HI with 1 <= LO <= HI, got '300-100'"),
    (["--prompt-tokens", "100-2040"], "--prompt-tokens up to 2040 plus --output-tokens up to 160 do not fit"),
    (["--variant", "nope"], "unknown variant nope; available: full, fragile, leaky, nodecode, crash"),
    (["--extra-flags", "'unclosed"], "--extra-flags: No closing quotation"),
])
def test_bad_arguments_fail_with_one_clear_line(tmp_path, args, message):
    env = dict(os.environ, VLLM_DCU_BENCH_HARNESS=str(FAKE_HARNESS))
    base = ["--gpu", "test", "--out", str(tmp_path / "o"), "--max-model-len", "2048", "--prompt-tokens", "50-200",
            "--dry-run"]
    p = subprocess.run([sys.executable, "-m", "bench.serve_robustness", *base, *args], capture_output=True, text=True,
                       cwd=REPO, env=env, timeout=60)
    assert p.returncode == 2, p.stdout + p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"serve_robustness: error: {message}"), err
    assert not (tmp_path / "o").exists()


def test_dry_run_prints_one_server_command_per_configuration(tmp_path):
    env = dict(os.environ, VLLM_DCU_BENCH_HARNESS=str(FAKE_HARNESS))
    p = subprocess.run([sys.executable, "-m", "bench.serve_robustness", "--dry-run", "--configs", "bf16,int8-t30",
                        "--out", str(tmp_path / "o")], capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = [x for x in p.stdout.splitlines() if x.startswith("server ")]
    assert len(lines) == 2 and re.search(r"--attention-backend DCU_TRITON_ATTN", lines[0])
    assert "--kv-cache-dtype int8_per_token_head --scheduler-tpot-target-ms 30" in lines[1]
    assert not (tmp_path / "o").exists()
