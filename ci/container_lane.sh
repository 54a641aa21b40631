#!/usr/bin/env bash
# CI's second lane (.ci/run runs it after the main one): the contest container's Python stack over the tests that
# touch transformers, tokenizers, model configs and serving. transformers 5.5.0 and the huggingface_hub it brings
# (ci/requirements-container.txt, installed over ci/requirements-cpu.txt) in a venv of their own
# ($VLLM_DCU_CONTAINER_VENV, default ~/.cache/vllm-dcu/venv-container; created on first use, a few minutes).
#   ci/container_lane.sh [pytest options]     runs the files below (a subset: ci/run_tests.sh with the two variables)
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=(
  tests/test_container_stack.py       # absolute local Qwen3.5 folder -> engine config, chat template
  tests/test_request_checks.py        # the OpenAI server as `vllm serve` builds it, tokenizer and token-id checks
  tests/test_serve_robustness.py      # the same app under the robustness benchmark's requests
  tests/test_kv_cache_dtype_config.py # ModelConfig / CacheConfig of a Qwen3.5-shaped config, 8-bit KV
  tests/test_scheduler_dcu.py         # EngineArgs and vLLM's CLI parser with the scheduler options
  tests/test_bench_tokenizer.py       # the synthetic tokenizer through AutoTokenizer
  tests/test_bench_prompts.py         # prompts sized with that tokenizer
  tests/test_gpu_bundle.py            # vLLM's Qwen3_5Config on the dummy model's config.json
  tests/test_sched_sim.py             # vLLM's scheduler on a VllmConfig of Qwen3.5's shapes
)
export VLLM_DCU_VENV=${VLLM_DCU_CONTAINER_VENV:-$HOME/.cache/vllm-dcu/venv-container}
export VLLM_DCU_REQUIREMENTS_OVER=ci/requirements-container.txt
exec bash ci/run_tests.sh -q "$@" "${FILES[@]}"
