"""Serving benchmark for vllm-dcu builds: synthetic tokenizer and prompts, driver, report."""
