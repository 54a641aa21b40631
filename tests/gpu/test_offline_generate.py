"""(a) Offline LLM.generate with TRITON_ATTN, torch.compile and CUDA graphs on the 4-layer dummy model."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
SCRIPT = Path(__file__).with_name("offline_generate.py")


def test_offline_generate_with_compile_and_cuda_graphs_returns_requested_token_counts(
        model_4l, run_env, harness, smoke_engine, tmp_path, record):
    kwargs = harness.engine_kwargs(model_4l, **smoke_engine)
    assert kwargs["attention_backend"] == "TRITON_ATTN" and "enforce_eager" not in kwargs
    out, log = tmp_path / "offline.json", tmp_path / "offline.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, str(SCRIPT), "--engine-json", json.dumps(kwargs), "--out", str(out)],
                                env=run_env, stdout=f, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=450)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = f"killed after 450 s, wait {proc.wait()}"
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-60:])
    assert rc == 0 and out.is_file(), f"offline generate failed ({rc}):\n{tail}"
    res = json.loads(out.read_text())
    record(engine_start_s=res["engine_start_s"],
           mixed_wall_s=res["calls"][0]["wall_s"], decode16_wall_s=res["calls"][1]["wall_s"])

    # torch.compile through vLLM's backend, and CUDA graphs really captured
    assert "VLLM_COMPILE" in res["compilation_mode"], res["compilation_mode"]
    assert "NONE" not in res["cudagraph_mode"], res["cudagraph_mode"]
    c = res["counters_after"]
    assert c["num_graphs_seen"] + c["num_aot_artifacts_loaded"] + c["num_compiled_artifacts_loaded"] > 0, c
    assert c["num_gpu_runner_capture_triggers"] >= 1 and c["num_cudagraph_captured"] > 0, c

    vocab = res["vocab_size"]
    for call in res["calls"]:
        for want, row in zip(call["max_tokens"], call["outputs"]):
            assert len(row["token_ids"]) == want, (call["name"], row["prompt_len"], want)
            assert row["finish_reason"] == "length"
            assert row["prompt_echo_ok"]
            assert all(0 <= t < vocab for t in row["token_ids"])
            assert row["n_logprobs"] == want and row["logprobs_finite"], (call["name"], row["prompt_len"])
    # dummy weights give arbitrary tokens, but NaN logits would give a constant id 0 everywhere
    every = [t for call in res["calls"] for row in call["outputs"] for t in row["token_ids"]]
    assert len(set(every)) > 1, "every generated token is the same id (NaN logits?)"
