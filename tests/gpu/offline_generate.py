"""Offline LLM.generate on a dummy model; run by test_offline_generate.py in its own process.

    python tests/gpu/offline_generate.py --engine-json '{"model": ..., ...}' --out result.json

Builds LLM(**engine kwargs) (the harness's kwargs: TRITON_ATTN, torch.compile + CUDA graphs unless
enforce_eager), then runs two generate calls with prompt_token_ids and greedy sampling: a mixed batch of
prompts of different lengths and output lengths (chunked prefill next to decode), then a full batch of
short prompts (pure decode at the largest capture size). Writes the outputs and vLLM's compilation counters
as JSON; the test makes the assertions.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine-json", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    kwargs = json.loads(args.engine_json)

    import torch
    from vllm import LLM, SamplingParams
    from vllm.compilation.counter import compilation_counter

    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    start_s = time.perf_counter() - t0
    cc = llm.llm_engine.vllm_config.compilation_config
    vocab = llm.llm_engine.vllm_config.model_config.get_vocab_size()
    result = {
        "engine_start_s": round(start_s, 1),
        "compilation_mode": getattr(cc.mode, "name", str(cc.mode)),  # IntEnum: str() would be "3"
        "cudagraph_mode": getattr(cc.cudagraph_mode, "name", str(cc.cudagraph_mode)),
        "vocab_size": vocab,
        "counters": {k: getattr(compilation_counter, k) for k in (
            "num_graphs_seen", "num_backend_compilations", "num_cudagraph_captured",
            "num_gpu_runner_capture_triggers", "num_aot_artifacts_loaded", "num_compiled_artifacts_loaded")},
        "calls": [],
    }

    rnd = random.Random(1234)

    def run(name: str, lengths: list[int], max_tokens: list[int]) -> None:
        prompts = [{"prompt_token_ids": [rnd.randrange(1000, vocab - 1000) for _ in range(n)]} for n in lengths]
        params = [SamplingParams(max_tokens=m, ignore_eos=True, temperature=0.0, detokenize=False, logprobs=0)
                  for m in max_tokens]
        torch.cuda.synchronize()
        t = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
        rows = []
        for p, o in zip(prompts, outs):
            c = o.outputs[0]
            lps = [next(iter(lp.values())).logprob for lp in (c.logprobs or [])]
            rows.append({"prompt_len": len(p["prompt_token_ids"]),
                         "prompt_echo_ok": list(o.prompt_token_ids) == p["prompt_token_ids"],
                         "token_ids": list(c.token_ids), "finish_reason": c.finish_reason,
                         "logprobs_finite": all(math.isfinite(x) for x in lps), "n_logprobs": len(lps)})
        result["calls"].append({"name": name, "wall_s": round(wall, 2), "max_tokens": max_tokens, "outputs": rows})

    # mixed: long prompts are prefilled in chunks while short ones already decode
    run("mixed", lengths=[1, 7, 100, 513, 1500, 3000], max_tokens=[1, 5, 16, 33, 64, 8])
    # decode-only at the largest capture size (16 sequences)
    run("decode16", lengths=[rnd.randrange(4, 40) for _ in range(16)], max_tokens=[24] * 16)
    result["counters_after"] = {k: getattr(compilation_counter, k) for k in result["counters"]}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
