"""(c) Tensor parallel 2: `vllm serve` over two GPUs (NCCL all-reduce; the custom all-reduce is compiled and
disabled by the harness) starts, serves and returns the requested token counts."""
from __future__ import annotations

import random

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.gpus(2)]


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8_per_token_head"])
def test_tensor_parallel_2_serve_returns_requested_token_counts_on_two_gpus(
        kv_cache_dtype, model_4l, serve_env, harness, smoke_engine, server_lib, tmp_path, record):
    """With 8-bit per-token-head KV each GPU holds 2 of the 4 KV heads and their scales."""
    import torch

    port = server_lib.free_port()
    engine = dict(smoke_engine, tensor_parallel_size=2, kv_cache_dtype=kv_cache_dtype)
    argv = harness.serve_command(model_4l, port=port, **engine)
    assert "--disable-custom-all-reduce" in argv
    rnd = random.Random(11)
    with server_lib.Server(argv, serve_env, tmp_path / "serve-tp2.log", port) as srv:
        record(server_start_s=srv.start_seconds)
        # both GPUs hold a shard and a KV cache (gpu_memory_utilization of each card)
        used = []
        for i in range(2):
            free, total = torch.cuda.mem_get_info(i)
            used.append(round((total - free) / 2**30, 1))
        record(gib_used_gpu0=used[0], gib_used_gpu1=used[1])
        assert min(used) > 10, f"GiB in use per GPU: {used} (is the model really split over two GPUs?)"

        model = srv.get("/v1/models")[1]["data"][0]["id"]
        for prompt, max_tokens in (([rnd.randrange(1000, 200000) for _ in range(64)], 16),
                                   ([[rnd.randrange(1000, 200000) for _ in range(n)] for n in (10, 1500)], 7)):
            status, body = srv.post("/v1/completions", {
                "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, "return_token_ids": True})
            assert status == 200, body
            n = len(prompt) if isinstance(prompt[0], list) else 1
            assert body["usage"]["completion_tokens"] == n * max_tokens, body["usage"]
            for choice in body["choices"]:
                assert choice["finish_reason"] == "length"
                if choice.get("token_ids") is not None:
                    assert len(choice["token_ids"]) == max_tokens
