"""Fake vllm: the parser class bench/bench_client.py builds `vllm bench serve`'s arguments with."""
import argparse

FlexibleArgumentParser = argparse.ArgumentParser
