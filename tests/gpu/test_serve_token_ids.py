"""Issue #20 on the GPU: no request with an out-of-range token id can kill `vllm serve` (patch 0008).

Two servers of the 4-layer dummy Qwen3.5-27B: one with --skip-tokenizer-init (token ids in and out: 0.18.1 sent an
out-of-vocabulary prompt id to the embedding there, and an out-of-vocabulary stop id with min_tokens to the
min-tokens masking, and each killed the engine core), one with the synthetic tokenizer and the official
reasoning / tool-call flags (chat). Each gets a greedy request first, then every token-id case of
bench/bad_requests.py (each must be refused with 400 naming the field; a stream's refusal is its first event), and
then the first request again: it must succeed with the same tokens, on the same server, still healthy.

    bash ci/gpu/run.sh pytest tests/gpu/test_serve_token_ids.py
"""
from __future__ import annotations

import importlib.util
import os
import random
from pathlib import Path

import pytest

from bench import bad_requests
from bench.synth_tokenizer import write_tokenizer

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]

VOCAB = 248320  # ci/gpu/dummy_model.py VOCAB_SIZE (checked against it below)
SERVED = "Qwen3.5-27B"


def _engine(smoke_engine: dict) -> dict:
    # as test_serve_http: no torch.compile, full CUDA graphs for decode batches (shares its Triton caches); no prefix
    # cache, so the repeated request is computed exactly as the first one
    return dict(smoke_engine, enable_prefix_caching=False,
                compilation_config=dict(smoke_engine["compilation_config"], mode=0,
                                        cudagraph_mode="FULL_DECODE_ONLY"))


def serve_argv_without_tokenizer(harness, model_dir: str, port: int, smoke_engine: dict) -> list[str]:
    """`vllm serve` of the dummy model folder (no tokenizer there: the harness adds --skip-tokenizer-init)."""
    return harness.serve_command(model_dir, port=port, **_engine(smoke_engine))


def serve_argv_with_tokenizer(harness, model_dir: str, port: int, smoke_engine: dict) -> list[str]:
    """`vllm serve` of a folder with the synthetic tokenizer, with start_vllm.sh's served name, parsers and chat
    settings (bench/serve_bench.py CONTEST_SERVER_FLAGS)."""
    return harness.serve_command(model_dir, port=port, served_model_name=SERVED, reasoning_parser="qwen3",
                                 enable_auto_tool_choice=True, tool_call_parser="qwen3_coder",
                                 default_chat_template_kwargs={"enable_thinking": False}, **_engine(smoke_engine))


def write_model_with_tokenizer(model_dir: Path, layers: int = 4) -> str:
    spec = importlib.util.spec_from_file_location("dcu_dummy_model_tok", REPO / "ci" / "gpu" / "dummy_model.py")
    dummy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dummy)
    assert dummy.VOCAB_SIZE == VOCAB, "the dummy model's vocabulary changed: update VOCAB"
    dummy.write_config(model_dir, layers)
    write_tokenizer(str(model_dir), VOCAB)
    return str(model_dir)


def _log(tmp_path: Path, name: str) -> Path:
    return Path(os.environ["OUT"]) / name if os.environ.get("OUT") else tmp_path / name


def _send(srv, case: bad_requests.BadCase):
    if case.stream:
        status, events = srv.post_stream(case.path, case.body, timeout=120)
        first = events[0] if events else None
        return status, first if isinstance(first, dict) else (first if status != 200 else None)
    return srv.post(case.path, case.body, timeout=120)


def _refuse_all(srv, cases) -> list[str]:
    """Send every case; return one line per case answered otherwise than expected (or after which the server
    was gone)."""
    bad = []
    for case in cases:
        status, body = _send(srv, case)
        v = bad_requests.judge(case, status, body)
        if not v.ok:
            bad.append(f"{case.kind}: {v.why}; answer {status} {str(body)[:300]}")
        if not srv.alive():
            bad.append(f"{case.kind}: the server exited; log tail:\n{srv.log_tail()}")
            break
    return bad


def _tokens(status, body) -> list[int]:
    assert status == 200, body
    ids = body["choices"][0].get("token_ids")
    assert ids, f"no token_ids in the answer (return_token_ids): {body}"
    return ids


def test_out_of_range_token_ids_are_refused_and_the_server_keeps_serving_without_tokenizer(
        model_4l, serve_env, harness, smoke_engine, server_lib, tmp_path, record):
    cfg = (Path(model_4l) / "config.json").read_text()
    assert f'"vocab_size": {VOCAB}' in cfg, "the dummy model's vocabulary changed: update VOCAB"
    port = server_lib.free_port()
    argv = serve_argv_without_tokenizer(harness, model_4l, port, smoke_engine)
    assert "--skip-tokenizer-init" in argv
    rnd = random.Random(20)
    prompt = [rnd.randrange(1000, 200000) for _ in range(64)]
    with server_lib.Server(argv, serve_env, _log(tmp_path, "serve-token-ids.log"), port) as srv:
        record(server_start_s=srv.start_seconds)
        model = srv.get("/v1/models")[1]["data"][0]["id"]
        cases = [c for c in bad_requests.catalogue(model, VOCAB, smoke_engine["max_model_len"], tokenizer=False)
                 if c.token_id]
        good = {"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0.0, "ignore_eos": True,
                "return_token_ids": True}
        first = _tokens(*srv.post("/v1/completions", good))
        failures = _refuse_all(srv, cases)
        assert not failures, "\n".join(failures)
        assert srv.alive() and srv.get("/health")[0] == 200
        again = _tokens(*srv.post("/v1/completions", good))
        assert again == first, (first, again)
        # the tokens-in endpoint still serves too
        status, body = srv.post("/inference/v1/generate", {"model": model, "token_ids": prompt,
                                                           "sampling_params": {"max_tokens": 4, "temperature": 0.0}})
        assert status == 200, body
        record(refused=len(cases), same_tokens_after=True)


def test_out_of_range_token_ids_are_refused_with_tokenizer_and_official_flags(
        serve_env, harness, smoke_engine, server_lib, tmp_path_factory, tmp_path, record):
    model_dir = write_model_with_tokenizer(tmp_path_factory.mktemp("qwen35-4l-tok"))
    port = server_lib.free_port()
    argv = serve_argv_with_tokenizer(harness, model_dir, port, smoke_engine)
    assert "--skip-tokenizer-init" not in argv
    with server_lib.Server(argv, serve_env, _log(tmp_path, "serve-token-ids-tokenizer.log"), port) as srv:
        record(server_start_s=srv.start_seconds)
        cases = [c for c in bad_requests.catalogue(SERVED, VOCAB, smoke_engine["max_model_len"],
                                                   tokenizer=True) if c.token_id]
        assert any(c.needs_tokenizer for c in cases)
        good = {"model": SERVED, "max_tokens": 12, "temperature": 0.0, "ignore_eos": True,
                "return_token_ids": True, "messages": [{"role": "user", "content": "What is the answer to the quiz?"}]}
        first = _tokens(*srv.post("/v1/chat/completions", good))
        failures = _refuse_all(srv, cases)
        assert not failures, "\n".join(failures)
        assert srv.alive() and srv.get("/health")[0] == 200
        again = _tokens(*srv.post("/v1/chat/completions", good))
        assert again == first, (first, again)
        record(refused=len(cases), same_tokens_after=True)
