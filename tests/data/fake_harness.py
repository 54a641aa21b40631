"""Stand-in for ci/gpu/harness.py in CPU tests of bench/serve_bench.py.

Variants run a fake `vllm` (tests/data/fake_vllm) whose server reports a
per-variant speed factor, so the driver's whole loop (start, health, bench,
stop, report) runs without a GPU.
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
SPEED = {"baseline": 1.0, "full": 1.25, "slow": 0.5, "broken": None}


def variants():
    return list(SPEED)


def variant_env(name, inprocess=True):
    env = dict(os.environ)
    env["FAKE_INPROCESS"] = str(int(inprocess))
    env["PYTHONPATH"] = os.path.join(HERE, "fake_vllm")
    env["FAKE_VLLM_SPEED"] = "crash" if SPEED[name] is None else str(SPEED[name])
    return env


def variant_dir(name):
    """Only `full` has a dcu_patchset.json (patches 0001 and 0003)."""
    return os.path.join(HERE, "fake_variants", name)


def serve_args(eager=False, **overrides):
    args = ["--language-model-only", "--attention-backend", "TRITON_ATTN"]
    if "compilation_config" in overrides:
        args += ["--compilation-config", json.dumps(overrides["compilation_config"])]
    return args + (["--enforce-eager"] if eager else [])


def write_config(out_dir, layers):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump({"model_type": "qwen3_5", "text_config": {"num_hidden_layers": layers,
                                                             "vocab_size": 248320}}, f)
