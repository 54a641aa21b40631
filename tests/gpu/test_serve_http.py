"""(b) `vllm serve` on 127.0.0.1, driven by OpenAI-style HTTP requests with token-id prompts (no tokenizer)."""
from __future__ import annotations

import os
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def _ids(rnd: random.Random, n: int) -> list[int]:
    return [rnd.randrange(1000, 200000) for _ in range(n)]


def _completion(srv, model: str, prompt, max_tokens: int, **extra):
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "return_token_ids": True, **extra}
    return srv.post("/v1/completions", body)


def _assert_completion(status, body, n_prompts: int, prompt_lens: list[int], max_tokens: int) -> None:
    assert status == 200, body
    assert len(body["choices"]) == n_prompts, body
    for choice in body["choices"]:
        assert choice["finish_reason"] == "length", choice
        if choice.get("token_ids") is not None:
            assert len(choice["token_ids"]) == max_tokens, choice
    assert body["usage"]["completion_tokens"] == n_prompts * max_tokens, body["usage"]
    assert body["usage"]["prompt_tokens"] == sum(prompt_lens), body["usage"]


def test_serve_answers_completions_rejects_overlong_prompt_with_400_and_keeps_serving(
        model_4l, serve_env, harness, smoke_engine, server_lib, tmp_path, record):
    port = server_lib.free_port()
    # (a) covers torch.compile; here the server skips it (starts in about a minute instead of several) and
    # keeps full CUDA graphs for decode batches
    engine = dict(smoke_engine, compilation_config=dict(smoke_engine["compilation_config"], mode=0,
                                                        cudagraph_mode="FULL_DECODE_ONLY"))
    argv = harness.serve_command(model_4l, port=port, **engine)
    assert "--skip-tokenizer-init" in argv and "--attention-backend" in argv
    rnd = random.Random(7)
    # the server log comes back from the GPU machine when $OUT is set
    log = Path(os.environ["OUT"]) / "serve-smoke.log" if os.environ.get("OUT") else tmp_path / "serve.log"
    with server_lib.Server(argv, serve_env, log, port) as srv:
        record(server_start_s=srv.start_seconds)
        status, models = srv.get("/v1/models")
        assert status == 200, models
        model = models["data"][0]["id"]
        assert models["data"][0].get("max_model_len") == smoke_engine["max_model_len"], models

        # one prompt, then a batch of two in one request
        status, body = _completion(srv, model, _ids(rnd, 50), 12)
        _assert_completion(status, body, 1, [50], 12)
        status, body = _completion(srv, model, [_ids(rnd, 30), _ids(rnd, 700)], 5)
        _assert_completion(status, body, 2, [30, 700], 5)

        # streaming: token ids arrive in chunks, usage at the end, then [DONE]
        status, events = srv.post_stream("/v1/completions", {
            "model": model, "prompt": _ids(rnd, 40), "max_tokens": 9, "temperature": 0.0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True})
        assert status == 200, events
        assert events and events[-1] == "[DONE]", events[-3:]
        usage = [e["usage"] for e in events[:-1] if isinstance(e, dict) and e.get("usage")]
        assert usage and usage[-1]["completion_tokens"] == 9, usage

        # over-long prompt: HTTP 400 naming the context length, not a crash
        status, err = _completion(srv, model, _ids(rnd, smoke_engine["max_model_len"] + 500), 4)
        assert status == 400, (status, err)
        assert "maximum context length" in str(err), err
        assert srv.alive()

        # ... and the server keeps serving: 8 concurrent requests of different lengths
        lens = [16, 64, 200, 1000, 2500, 33, 5, 128]

        def one(n: int):
            return n, _completion(srv, model, _ids(random.Random(n), n), 8)

        with ThreadPoolExecutor(len(lens)) as pool:
            for n, (status, body) in pool.map(one, lens):
                _assert_completion(status, body, 1, [n], 8)
        assert srv.get("/health")[0] == 200
        record(requests_ok=13)
