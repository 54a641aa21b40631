"""Stand-in for ci/gpu/harness.py in CPU tests of bench/serve_robustness.py.

Variants run a fake `vllm serve` (fake_robust/vllm/entrypoints/cli/main.py) that answers like vLLM with patch 0008
(every case of bench/bad_requests.py refused as the catalogue expects), streams, notices clients that hang up, and
publishes KV usage, queue lengths, preemptions and finished requests on /metrics. FAKE_ROBUST_MODE per variant:
  full      behaves
  fragile   dies on an out-of-range stop id with min_tokens (0.18.1 without patch 0008)
  leaky     keeps the KV blocks of requests whose client hung up
  nodecode  a build without patch 0003 (no DCU_TRITON_ATTN): the benchmark must skip it
  crash     exits while starting
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, os.pardir, os.pardir, os.pardir))
MODES = {"full": "ok", "fragile": "die-on-stop-id", "leaky": "leak", "nodecode": "ok", "crash": "crash"}


def variants():
    return list(MODES)


def variant_env(name, inprocess=True):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([HERE, REPO])  # as ci/gpu/harness.py: the variant's vllm first, then the repo
    env["FAKE_ROBUST_MODE"] = MODES[name]
    env["FAKE_INPROCESS"] = str(int(inprocess))
    return env


def variant_dir(name):
    return os.path.join(HERE, "variants", "nodecode" if name == "nodecode" else "full")


def serve_args(eager=False, **overrides):
    args = ["--language-model-only", "--attention-backend", "TRITON_ATTN", "--gdn-prefill-backend", "triton"]
    if "compilation_config" in overrides:
        args += ["--compilation-config", json.dumps(overrides["compilation_config"])]
    return args + (["--enforce-eager"] if eager else [])


def write_config(out_dir, layers):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump({"model_type": "qwen3_5", "text_config": {"num_hidden_layers": layers, "vocab_size": 248320}}, f)
