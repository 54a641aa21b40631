"""bench/start_vllm_dcu.sh: the official start flags verbatim, our per-tier additions, bad input."""
import os
import shlex
import subprocess

import pytest

from bench.serve_config import CONTEST_SERVER_FLAGS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start(*args, **env):
    e = dict(os.environ, MODEL="/models/Qwen3.5-27B")
    e.update(env)
    return subprocess.run(["bash", "bench/start_vllm_dcu.sh", *args], capture_output=True, text=True, cwd=REPO,
                          env=e)


@pytest.mark.parametrize("tier", ["all", "4-8K", "8-16K", "16-32K"])
def test_prints_the_official_command_with_the_benchmarks_locked_flags(tier):
    p = start(tier, "--print")
    assert p.returncode == 0, p.stderr
    argv = shlex.split(p.stdout)
    assert argv[:3] == ["vllm", "serve", "/models/Qwen3.5-27B"]
    assert argv[argv.index("--port") + 1] == "8001"
    flags = [a for a in argv[3:] if a not in ("--port", "8001")]
    # the same locked flags bench/serve_bench.py starts every build with, in the same order
    assert flags == CONTEST_SERVER_FLAGS[:CONTEST_SERVER_FLAGS.index("--max-num-batched-tokens") + 2] + [
        "--gpu-memory-utilization", "0.95"] + CONTEST_SERVER_FLAGS[CONTEST_SERVER_FLAGS.index(
            "--max-num-batched-tokens") + 2:]


def test_per_tier_settings_apply_to_their_tier_only():
    env = {"KV_CACHE_DTYPE_16_32K": "fp8_per_token_head", "DECODE_PARAMS_16_32K": '{"BLOCK_N": 32}',
           "ATTENTION_BACKEND_4_8K": "TRITON_ATTN"}
    argv = shlex.split(start("16-32K", "--print", **env).stdout)
    assert argv[0] == 'VLLM_DCU_DECODE_PARAMS={"BLOCK_N": 32}'
    assert argv[-2:] == ["--kv-cache-dtype", "fp8_per_token_head"] and "--attention-backend" not in argv
    argv = shlex.split(start("4-8K", "--print", **env).stdout)
    assert argv[-2:] == ["--attention-backend", "TRITON_ATTN"] and "--kv-cache-dtype" not in argv


def test_scheduler_target_is_opt_in():
    assert "--scheduler-tpot-target-ms" not in start("8-16K", "--print").stdout
    argv = shlex.split(start("8-16K", "--print", SCHEDULER_TPOT_TARGET_MS_8_16K="40").stdout)
    assert argv[-2:] == ["--scheduler-tpot-target-ms", "40"]


def test_kernel_settings_are_environment_settings_per_tier():
    out = start("16-32K", "--print").stdout
    assert "VLLM_DCU_PREFILL" not in out and "VLLM_DCU_GEMV" not in out  # the builds' defaults
    env = {"PREFILL_PARAMS_16_32K": '{"BLOCK_N": 32}', "GEMV_16_32K": "platform", "PREFILL_ATTN_4_8K": "0"}
    argv = shlex.split(start("16-32K", "--print", **env).stdout)
    assert argv[:3] == ['VLLM_DCU_PREFILL_PARAMS={"BLOCK_N": 32}', "VLLM_DCU_GEMV=platform", "vllm"]
    argv = shlex.split(start("4-8K", "--print", **env).stdout)
    assert argv[:2] == ["VLLM_DCU_PREFILL_ATTN=0", "vllm"]


def test_all_uses_the_8_16k_settings():
    argv = shlex.split(start("all", "--print", KV_CACHE_DTYPE_8_16K="int8_per_token_head").stdout)
    assert argv[-2:] == ["--kv-cache-dtype", "int8_per_token_head"]


def test_bad_tier_and_missing_model_fail_with_one_line():
    p = start("2-4K")
    assert p.returncode == 2 and p.stderr.strip() == "error: unknown tier '2-4K'; supported: all, 4-8K, 8-16K, 16-32K"
    p = start("4-8K", MODEL="")
    assert p.returncode == 2 and p.stderr.strip().startswith("error: set MODEL to the Qwen3.5-27B directory")
