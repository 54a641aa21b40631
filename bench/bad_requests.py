"""Malformed requests for `vllm serve` and what a robust server answers to each (issue #20).

One catalogue for three users: the GPU test tests/gpu/test_serve_token_ids.py (the token-id cases), the robustness
benchmark bench/serve_robustness.py (all of them, mixed into load), and the CPU test tests/test_serve_robustness.py,
which sends every case to vLLM's real OpenAI app (patched tree, engine replaced) to pin the expectations.

A case is a POST to a path with a JSON body (or raw bytes for broken JSON) and the expected answer: an HTTP status,
and for the token-id cases the `param` vLLM names (patch 0008) and a fragment of the message. A streaming request
has answered 200 before input processing runs, so its rejection is the stream's first event
`data: {"error": {"code": 400, "param": ...}}`: `expect_status` is then the code inside that event and
`stream` is True.

Standard library only.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class BadCase:
    kind: str  # short name; the benchmark tallies 4xx answers by it
    path: str
    body: dict | None  # JSON body; None when `raw` is sent instead
    expect_status: int
    expect_param: str | None = None  # `param` of vLLM's error (None: not asserted)
    expect_text: str | None = None  # a fragment of the error message (None: not asserted)
    raw: bytes | None = None
    stream: bool = False
    needs_tokenizer: bool = False
    token_id: bool = False  # a case of issue #20's list (a client-supplied token id out of range)
    notes: str = ""

    def payload(self) -> bytes:
        return self.raw if self.raw is not None else json.dumps(self.body).encode()


def catalogue(model: str, vocab_size: int, max_model_len: int, *, tokenizer: bool = True) -> list[BadCase]:
    """Every malformed request for a server of `model` (served name), with `vocab_size` token ids and
    `max_model_len`; cases that need a tokenizer (chat) only when the server has one."""
    V = vocab_size
    rng = f"[0, {V})"

    def cmpl(**kw):
        return dict({"model": model, "prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0.0}, **kw)

    def chat(**kw):
        return dict({"model": model, "messages": [{"role": "user", "content": "say something"}], "max_tokens": 4,
                     "temperature": 0.0}, **kw)

    def gen(token_ids, **sp):
        return {"model": model, "token_ids": token_ids, "sampling_params": dict({"max_tokens": 4}, **sp)}

    C, G, CH = "/v1/completions", "/inference/v1/generate", "/v1/chat/completions"
    cases = [
        # --------------------------------------------------------------- what 0.18.1 already refused
        BadCase("bad-json", C, None, 400, raw=b'{"model": "' + model.encode() + b'", "prompt": [1, 2',
                notes="truncated JSON"),
        BadCase("wrong-type", C, cmpl(prompt=[1, "two", 3]), 400, notes="a string among prompt ids"),
        BadCase("unknown-model", C, cmpl(model="no-such-model"), 404),
        BadCase("overlong-prompt", C, cmpl(prompt=[7] * (max_model_len + 16)), 400,
                expect_text="maximum context length"),
        BadCase("bad-temperature", C, cmpl(temperature=-1.0), 400),
        BadCase("bad-top-p", C, cmpl(top_p=1.5), 400),
        BadCase("bad-max-tokens", C, cmpl(max_tokens=-5), 400),
        BadCase("bad-n", C, cmpl(n=0), 400),
        BadCase("bad-logprobs", C, cmpl(logprobs=10 ** 6), 400),
        BadCase("negative-prompt-id", C, cmpl(prompt=[5, -1]), 400, notes="the protocol's ge=0 on prompt ids"),
        # --------------------------------------------------------------- token ids (patch 0008, issue #20)
        BadCase("prompt-id", C, cmpl(prompt=[5, V]), 400, "prompt_token_ids", f"token id {V}", token_id=True,
                notes="without a tokenizer 0.18.1 sent it to the embedding (engine death)"),
        BadCase("prompt-id-huge", C, cmpl(prompt=[5, 2 ** 62]), 400, "prompt_token_ids", rng, token_id=True),
        BadCase("batch-prompt-id", C, cmpl(prompt=[[1, 2], [3, V + 1]]), 400, "prompt_token_ids",
                f"token id {V + 1}", token_id=True, notes="second prompt of a batch"),
        BadCase("stop-id-min-tokens", C, cmpl(stop_token_ids=[V], min_tokens=1), 400, "stop_token_ids",
                f"token id {V}", token_id=True, notes="0.18.1: device-side assert in min-tokens masking"),
        BadCase("stop-id-negative", C, cmpl(stop_token_ids=[-1], min_tokens=1), 400, "stop_token_ids", rng,
                token_id=True),
        BadCase("allowed-id", C, cmpl(allowed_token_ids=[0, V]), 400, "allowed_token_ids", f"token id {V}",
                token_id=True),
        BadCase("allowed-id-negative", C, cmpl(allowed_token_ids=[-1]), 400, "allowed_token_ids", rng,
                token_id=True),
        BadCase("logit-bias-id", C, cmpl(logit_bias={str(V): 10}), 400, "logit_bias", f"token id {V}",
                token_id=True),
        BadCase("generate-token-id", G, gen([1, V]), 400, "prompt_token_ids", f"token id {V}", token_id=True,
                notes="the tokens-in endpoint"),
        BadCase("generate-seed", G, gen([1, 2], seed=2 ** 70), 400, "seed", "seed", token_id=True,
                notes="SamplingParams verbatim: a seed torch cannot take"),
        BadCase("stream-stop-id", C, cmpl(stop_token_ids=[V + 2], min_tokens=1, stream=True), 400,
                "stop_token_ids", f"token id {V + 2}", stream=True, token_id=True,
                notes="stream: the rejection is the first event"),
    ]
    if tokenizer:
        cases += [
            BadCase("chat-stop-id", CH, chat(stop_token_ids=[V], min_tokens=1), 400, "stop_token_ids",
                    f"token id {V}", needs_tokenizer=True, token_id=True),
            BadCase("chat-allowed-id", CH, chat(allowed_token_ids=[V + 5]), 400, "allowed_token_ids",
                    f"token id {V + 5}", needs_tokenizer=True, token_id=True),
            BadCase("chat-logit-bias-id", CH, chat(logit_bias={"-4": 1}), 400, "logit_bias", "token id -4",
                    needs_tokenizer=True, token_id=True),
            BadCase("chat-bad-json", CH, None, 400, raw=b'{"model": "' + model.encode() + b'", "messages": [',
                    needs_tokenizer=True),
        ]
    return cases


@dataclass
class Verdict:
    ok: bool
    status: int | None  # the HTTP status, or for a stream the code of its error event
    param: str | None = None
    message: str = ""
    why: str = ""  # what was unexpected (empty when ok)
    extra: dict = field(default_factory=dict)


def error_of(body) -> dict:
    """vLLM's error object ({"error": {"message", "type", "param", "code"}}) from a decoded body, or {}."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return body["error"]
    return {}


def judge(case: BadCase, status: int | None, body) -> Verdict:
    """Compare an answer with the case's expectation. `body` is the decoded JSON of the answer, or for a stream
    the decoded JSON of its first `data:` event (None if there was none)."""
    err = error_of(body)
    code = status
    if case.stream:
        if status != 200 and status is not None:
            code = status  # refused before the stream started: also a clean refusal if it is the expected code
        elif err:
            code = err.get("code")
        else:
            return Verdict(False, status, why="stream without an error event")
    msg, param = str(err.get("message", "")), err.get("param")
    if code != case.expect_status:
        return Verdict(False, code, param, msg, why=f"status {code}, expected {case.expect_status}")
    if case.expect_param is not None and param != case.expect_param:
        return Verdict(False, code, param, msg, why=f"param {param!r}, expected {case.expect_param!r}")
    if case.expect_text is not None and case.expect_text not in msg:
        return Verdict(False, code, param, msg, why=f"message lacks {case.expect_text!r}")
    return Verdict(True, code, param, msg)
