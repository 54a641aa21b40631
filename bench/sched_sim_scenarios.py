"""The scheduler simulator's scenarios and step times (data only, no vLLM import): bench/sched_sim.py (the command
line) and bench/sched_sim_engine.py (the simulated engine) both read them, so neither imports the other."""

# Step times of the 16-layer Qwen3.5-27B-shaped model on the H200, fitted by patch 0004's step-time model on the
# real engine (bench/results/2026-11-30-h200-gpu-sched-tpot-test.md: 4.68 ms + 40.6 ms per 1024 tokens + 9.2 ms
# per 64 requests + 65.9 ms per 2^26 prefill query-key pairs; residual 2.5 ms over 380 steps).
# mixed_ms: the fixed cost of a step that carries prefill work in the harness's decode-graph mode (eager prefill, no
# CUDA graph): 24 ms reproduces the two served runs of the budget at target 30 ms (2026-11-30, 16-32K, dcu64:
# 0.25 req/s TPOT P99 42.6 simulated vs 43.8 ms measured, TTFT P99 6.9 vs 6.5 s; 0.6 req/s TPOT P99 42.9 vs 46.9 ms,
# TTFT P99 26.8 vs 28.4 s, 0 preemptions in both); without it the simulator missed the cost of small chunks.
H200_L16 = dict(base=4.7, per_token=40.6 / 1024, per_req=9.2 / 64, per_kv=0.0, per_pair=65.9 / (1 << 26),
                superlinear=0.0, mixed_ms=24.0)

# name: (make_scheduler kwargs, prompt length range, output tokens)
SCENARIOS = {
    # `vllm serve` on the KV cache a 64 GB DCU leaves, scaled to 16 layers (bench/profiles.py dcu64: 1.77 GiB
    # = 148 blocks of 784 tokens shared by the attention group and three Gated DeltaNet groups; prefix caching
    # off, as serve ran it), contest scheduler flags, async scheduling.
    "dcu64-16-32K": (dict(hybrid=True, prefix_caching=False, gdn_groups=3, num_blocks=148, block_size=784,
                          max_batched=4096, max_num_seqs=128, async_sched=True, max_model_len=32768),
                     (16384, 32768 - 1024), 250),
    "dcu64-8-16K": (dict(hybrid=True, prefix_caching=False, gdn_groups=3, num_blocks=148, block_size=784,
                         max_batched=4096, max_num_seqs=128, async_sched=True, max_model_len=32768),
                    (8192, 16384), 250),
}
