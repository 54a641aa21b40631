"""Stand-in so bench/bench_client.py's pandas check passes under the fake vllm (CPU tests only)."""
