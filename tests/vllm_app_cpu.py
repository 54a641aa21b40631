"""vLLM's OpenAI server on the CPU, as `vllm serve` builds it, with the engine replaced (tests of patch 0008 and of
bench/serve_robustness.py's expectations).

`openai_app(...)` parses the `vllm serve` flags with vLLM's own parser (the official start_vllm.sh flags by default),
runs vLLM's build_app and init_app_state, and serves the app through Starlette's TestClient; the engine client's
generate() runs the real InputProcessor (what AsyncLLM.add_request does before it hands a request to the engine
core) and answers a request that passed with max_tokens tokens 1, 2, 3, ... Everything that passed is recorded.

Model folders are config.json only (llama-tiny's shapes with a chosen vocabulary), optionally with the synthetic
tokenizer (bench/synth_tokenizer.py, more than 248070 ids). Needs the patched tree on sys.path (tests/conftest.py).
"""
from __future__ import annotations

import contextlib
import json
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TINY = json.loads((REPO / "tests" / "data" / "scheduler" / "llama-tiny" / "config.json").read_text())
QWEN_VOCAB = 248320
SERVED = "Qwen3.5-27B"
# start_vllm.sh's `vllm serve` flags (bench/serve_bench.py CONTEST_SERVER_FLAGS) with a short context
OFFICIAL_FLAGS = ["--served-model-name", SERVED, "--trust-remote-code", "--dtype", "bfloat16",
                  "--tensor-parallel-size", "1", "--max-num-seqs", "128", "--max-num-batched-tokens", "4096",
                  "--default-chat-template-kwargs", '{"enable_thinking": false}', "--reasoning-parser", "qwen3",
                  "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder", "--max-model-len", "4096"]


def write_model(folder: Path, vocab: int, tokenizer_vocab: int | None = None, eos: int | None = None) -> str:
    """A config.json-only model (llama-tiny's shapes, `vocab` ids) with, optionally, the synthetic tokenizer."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = dict(TINY, vocab_size=vocab)
    if eos is not None:
        cfg["eos_token_id"] = eos
    (folder / "config.json").write_text(json.dumps(cfg))
    if tokenizer_vocab is not None:
        from bench.synth_tokenizer import write_tokenizer

        write_tokenizer(str(folder), tokenizer_vocab)
    return str(folder)


def vllm_config_for(model: str, tokenizer: bool, max_model_len: int = 4096):
    """A VllmConfig on the CPU device (the CPU test machine has no vLLM platform, so not via EngineArgs)."""
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig

    mc = ModelConfig(model=model, dtype="bfloat16", seed=0, skip_tokenizer_init=not tokenizer,
                     max_model_len=max_model_len)
    return VllmConfig(model_config=mc, device_config=DeviceConfig(device="cpu"))


def stub_missing_packages(mp) -> None:
    """Test doubles for two optional packages the CPU venv lacks (the GPU box has them): the SageMaker hooks
    vLLM's api_server imports (decorators that return the function), and mistral_common, which the chat path
    imports for an isinstance check (a class nothing is an instance of)."""
    try:
        import model_hosting_container_standards.sagemaker  # noqa: F401
    except ImportError:
        sm = types.ModuleType("model_hosting_container_standards.sagemaker")

        def decorator(*a, **k):
            return a[0] if len(a) == 1 and callable(a[0]) and not k else (lambda f: f)

        for name in ("register_ping_handler", "register_invocation_handler", "stateful_session_manager",
                     "inject_adapter_id", "register_load_adapter_handler", "register_unload_adapter_handler"):
            setattr(sm, name, decorator)
        sm.bootstrap = lambda app: app
        pkg = types.ModuleType("model_hosting_container_standards")
        pkg.sagemaker = sm
        mp.setitem(sys.modules, pkg.__name__, pkg)
        mp.setitem(sys.modules, sm.__name__, sm)
    try:
        import vllm.tokenizers.mistral  # noqa: F401
    except ImportError:
        mistral = types.ModuleType("vllm.tokenizers.mistral")
        mistral.MistralTokenizer = type("MistralTokenizer", (), {})
        mp.setitem(sys.modules, mistral.__name__, mistral)


class FakeEngineClient:
    """What `vllm serve`'s API process talks to, with the engine replaced: generate() runs the real InputProcessor
    (as AsyncLLM.add_request does; a ValueError propagates as AsyncLLM.generate re-raises it) and answers a request
    that passed with max_tokens tokens 1, 2, 3, ... Every request that passed is in `added`."""

    def __init__(self, vllm_config):
        from vllm.v1.engine.input_processor import InputProcessor

        self.vllm_config, self.model_config = vllm_config, vllm_config.model_config
        self.input_processor = InputProcessor(vllm_config)
        self.renderer, self.io_processor = self.input_processor.renderer, None
        self.errored, self.is_running, self.is_stopped = False, True, False
        self.added = []

    @property
    def dead_error(self):
        return RuntimeError("engine dead")

    async def generate(self, prompt, sampling_params, request_id, **kw):
        import asyncio

        from vllm.outputs import CompletionOutput, RequestOutput
        from vllm.sampling_params import RequestOutputKind

        req = self.input_processor.process_inputs(request_id, prompt, sampling_params, supported_tasks=("generate",),
                                                  priority=kw.get("priority", 0))
        self.added.append(req)
        n = req.sampling_params.max_tokens
        if req.sampling_params.output_kind == RequestOutputKind.DELTA:  # a stream: one output per token
            for i in range(1, n + 1):
                await asyncio.sleep(0.001)
                out = CompletionOutput(0, "w", [i], None, None, finish_reason="length" if i == n else None)
                yield RequestOutput(request_id, None, req.prompt_token_ids, None, [out], i == n)
            return
        yield RequestOutput(request_id, None, req.prompt_token_ids, None,
                            [CompletionOutput(0, "w" * n, list(range(1, n + 1)), None, None, finish_reason="length")],
                            True)

    async def abort(self, *a, **k):
        return None

    async def is_tracing_enabled(self):
        return False

    async def do_log_stats(self):
        return None

    async def get_supported_tasks(self):
        return ("generate",)


def _build(mp, model: str, tokenizer: bool, flags: list[str] | None):
    """(app, args, engine, init_app_state) as `vllm serve` builds them, before init_app_state runs."""
    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.platforms import current_platform
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    mp.setattr(current_platform, "device_type", "cpu", raising=False)  # the parser's DeviceConfig needs one
    stub_missing_packages(mp)
    from vllm.entrypoints.openai.api_server import build_app, init_app_state

    flags = list(OFFICIAL_FLAGS if flags is None else flags) + ([] if tokenizer else ["--skip-tokenizer-init"])
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", model] + flags)
    validate_parsed_serve_args(args)
    engine = FakeEngineClient(vllm_config_for(model, tokenizer=tokenizer, max_model_len=args.max_model_len))
    app = build_app(args, ("generate",))
    app.state.log_stats = False
    return app, args, engine, init_app_state


@contextlib.contextmanager
def openai_app(model: str, *, tokenizer: bool, flags: list[str] | None = None):
    """(TestClient, FakeEngineClient) of vLLM's OpenAI app for `model`, `vllm serve` flags `flags` (default: the
    official ones, plus --skip-tokenizer-init without a tokenizer)."""
    import pytest

    mp = pytest.MonkeyPatch()
    try:
        from fastapi.testclient import TestClient

        app, args, engine, init_app_state = _build(mp, model, tokenizer, flags)
        with TestClient(app, raise_server_exceptions=False) as client:
            client.portal.call(init_app_state, engine, app.state, args, ("generate",))
            yield client, engine
    finally:
        mp.undo()


@contextlib.contextmanager
def openai_server(model: str, *, tokenizer: bool, flags: list[str] | None = None):
    """(port, FakeEngineClient): the same app served by uvicorn on 127.0.0.1 (real sockets: streams, clients that
    hang up), in a background thread."""
    import asyncio
    import socket
    import threading
    import time

    import pytest
    import uvicorn

    mp = pytest.MonkeyPatch()
    try:
        app, args, engine, init_app_state = _build(mp, model, tokenizer, flags)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                               lifespan="off"))
        failed: list[BaseException] = []

        async def main():
            await init_app_state(engine, app.state, args, ("generate",))
            await server.serve()

        def run():
            try:
                asyncio.run(main())
            except BaseException as e:  # noqa: BLE001 - reported by the waiting test
                failed.append(e)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        t0 = time.monotonic()
        while not server.started:
            if failed or not thread.is_alive() or time.monotonic() - t0 > 60:
                raise RuntimeError(f"uvicorn did not start: {failed}")
            time.sleep(0.05)
        try:
            yield port, engine
        finally:
            server.should_exit = True
            thread.join(timeout=20)
    finally:
        mp.undo()
