#!/bin/bash
# Session 9 call C (#17 served): one build, bf16 KV (full) vs int8 per-token-head KV (full8), load protocol, dcu64
# KV budget, 16-32K at 0.6 req/s (bf16 KV-limited there), the decode kernel's kv8 entry Efit as an override.
set -u
bash ci/gpu/run.sh prepare > /dev/null 2>&1 || { echo "prepare failed"; exit 1; }
export VLLM_DCU_DECODE_PARAMS='{"kv8":{"BLOCK_N":64,"num_stages":3,"early_convert":1,"page_loop":1,"split_round":"down"}}'
PYTHONPATH=$PWD/ci/gpu/diag bash ci/gpu/run.sh python -m bench.serve_bench --variants full,full8 --baseline full \
  --tiers 16-32K --protocols load --profile dcu64 --load-requests 12 --load-rate 16-32K=0.6 --mode decode-graph \
  --capture-sizes 1,2,4,8,16,32 --variant-flags 'full8=--kv-cache-dtype int8_per_token_head' --no-repeat-baseline \
  --what kv8-efit-load --deadline-s 540
