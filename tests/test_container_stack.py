"""The contest container's way in: a Qwen3.5 model folder at an absolute local path, vLLM's engine config built
from it and the chat template rendered with the official start flags' template arguments. Runs in both CI lanes:
the main one (transformers 4.57) and ci/container_lane.sh's (transformers 5.5.0 with huggingface_hub 1.x, the
container's; in the container vLLM was seen refusing an absolute local path in config loading).

The folder holds the real Qwen3.5-27B config.json (ci/gpu/dummy_model.py, 4 layers) and the synthetic tokenizer
with the Qwen chat template (bench/synth_tokenizer.py). vLLM would inspect the multimodal class the config names
(Qwen3_5ForConditionalGeneration), which imports torchvision; the index has torchvision only as CUDA builds, which
do not load with a CPU torch, so the class inspected is overridden to Qwen3-Next's (hf_overrides), whose layers
Qwen3.5 reuses. Everything else (config loading, the text config, the tokenizer, the renderer) is vLLM's own path.
"""
from __future__ import annotations

import importlib.metadata as md
import os
import re
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parent.parent
OVER = os.environ.get("VLLM_DCU_REQUIREMENTS_OVER")  # set by ci/container_lane.sh


def _pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)\s*([<>=!~][^#;]*)", line.split("#", 1)[0].strip())
        if m:
            out[m.group(1).lower()] = m.group(2).strip()
    return out


def test_the_lane_runs_the_stack_it_names():
    """transformers (and, in the container lane, everything its file pins) is what the lane's requirements say."""
    want = _pins(REPO / "ci" / "requirements-cpu.txt")
    if OVER:
        over = _pins(REPO / OVER)
        assert over.get("transformers") == "==5.5.0", over
        want.update(over)
        assert int(md.version("huggingface_hub").split(".")[0]) >= 1, md.version("huggingface_hub")
    for name in ("transformers", "tokenizers", "torch"):
        if name in want:
            got = md.version(name)
            assert SpecifierSet(want[name]).contains(got.split("+")[0], prereleases=True), (name, got, want[name])


@pytest.fixture(scope="module")
def qwen35_dir(tmp_path_factory):
    from bench.synth_tokenizer import write_tokenizer
    from ci.gpu.dummy_model import write_config

    d = tmp_path_factory.mktemp("Qwen3.5-27B").resolve()
    write_config(d, 4)
    write_tokenizer(str(d))
    return d


@pytest.fixture(scope="module")
def engine_config(qwen35_dir):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform

    mp = pytest.MonkeyPatch()
    mp.setattr(current_platform, "device_type", "cpu", raising=False)  # no GPU here: DeviceConfig's default
    try:
        # start_vllm.sh's engine flags (served name, dtype, sequences, batched tokens) with a short context
        args = EngineArgs(model=str(qwen35_dir), served_model_name=["Qwen3.5-27B"], trust_remote_code=True,
                          dtype="bfloat16", max_num_seqs=128, max_num_batched_tokens=4096, max_model_len=4096,
                          hf_overrides={"architectures": ["Qwen3NextForCausalLM"]})
        yield args.create_engine_config()
    finally:
        mp.undo()


def test_engine_config_from_an_absolute_local_qwen35_folder(engine_config, qwen35_dir):
    mc = engine_config.model_config
    assert Path(mc.model) == qwen35_dir and mc.model.startswith("/") and mc.tokenizer == mc.model
    assert mc.hf_config.model_type == "qwen3_5" and mc.hf_text_config.model_type == "qwen3_5_text"
    assert (mc.get_hidden_size(), mc.get_vocab_size(), mc.get_num_layers(engine_config.parallel_config)) == (
        5120, 248320, 4)
    assert mc.get_num_kv_heads(engine_config.parallel_config) == 4 and mc.get_head_size() == 256
    assert mc.max_model_len == 4096 and mc.served_model_name == "Qwen3.5-27B"
    assert engine_config.scheduler_config.max_num_batched_tokens == 4096


def test_chat_template_renders_with_the_official_template_arguments(engine_config):
    from vllm.renderers.params import ChatParams
    from vllm.renderers.registry import renderer_from_config

    renderer = renderer_from_config(engine_config)
    tok = renderer.get_tokenizer()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]
    # start_vllm.sh: --default-chat-template-kwargs '{"enable_thinking": false}'
    params = ChatParams().with_defaults(default_chat_template_kwargs={"enable_thinking": False,
                                                                      "add_generation_prompt": True})
    conversation, prompt = renderer.render_messages(messages, params)
    text = ("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello world<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert [m["role"] for m in conversation] == ["system", "user"]
    assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                   enable_thinking=False) == text
    assert prompt["prompt_token_ids"] == tok.encode(text, add_special_tokens=False)
    assert prompt["prompt_token_ids"][0] == tok.convert_tokens_to_ids("<|im_start|>")
