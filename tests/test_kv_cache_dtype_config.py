"""fp8_per_token_head / int8_per_token_head (patch 0002) in the patched vLLM tree, on the CPU.

Config and CLI names, page size with the scale bytes, the hybrid (attention + Gated DeltaNet) block
size and KV capacity at Qwen3.5-27B shapes, TRITON_ATTN's cache shape, and every startup refusal
(other backends, MLA, calculate_kv_scales, checkpoints with calibrated fp8 scales).

Qwen3.5-27B shapes come from a local text-only config (Qwen3NextForCausalLM with Qwen3.5-27B's
attention and GDN dimensions; the multimodal Qwen3.5 class needs torchvision to be inspected) and
float32 SSM state, which Qwen3.5's config maps to mamba_ssm_cache_dtype.
"""
import json
import types

import pytest
import torch

PTH = ("fp8_per_token_head", "int8_per_token_head")
QWEN35_27B = dict(
    architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", vocab_size=1024, hidden_size=5120,
    intermediate_size=17408, num_hidden_layers=64, num_attention_heads=24, num_key_value_heads=4, head_dim=256,
    linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
    linear_num_value_heads=48, full_attention_interval=4, max_position_embeddings=8192, num_experts=0,
    rms_norm_eps=1e-6, hidden_act="silu", partial_rotary_factor=0.25, torch_dtype="bfloat16",
)


@pytest.fixture(scope="module")
def patched(vllm_tree):
    from vllm.config.cache import CacheDType
    from typing import get_args

    if "fp8_per_token_head" not in get_args(CacheDType):
        pytest.fail("the per-token-head cache dtypes are not in the vLLM tree under test: is "
                    "0002-kv-cache-per-token-head.patch in patches/series?")


@pytest.fixture(scope="module")
def qwen35_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen35-27b-text")
    (d / "config.json").write_text(json.dumps(QWEN35_27B))
    return str(d)


def make_vllm_config(model_dir, cache_dtype, **cache_kw):
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig

    mc = ModelConfig(model=model_dir, dtype="bfloat16", skip_tokenizer_init=True, max_model_len=4096)
    cc = CacheConfig(cache_dtype=cache_dtype, enable_prefix_caching=True, mamba_ssm_cache_dtype="float32", **cache_kw)
    return VllmConfig(model_config=mc, cache_config=cc, device_config=DeviceConfig(device="cpu"),
                      scheduler_config=SchedulerConfig.default_factory(max_model_len=4096, is_encoder_decoder=False))


# ----------------------------------------------------------------------------------------------- names


def test_cli_choices_and_storage_dtype(patched):
    from typing import get_args

    from vllm.config.cache import CacheConfig, CacheDType
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE, kv_cache_scale_bytes

    for name in PTH:
        assert name in get_args(CacheDType)  # argparse takes --kv-cache-dtype choices from the Literal
        assert CacheConfig(cache_dtype=name).cache_dtype == name
        assert STR_DTYPE_TO_TORCH_DTYPE[name] == torch.uint8
        assert kv_cache_scale_bytes(name) == 4
    for name in ("auto", "fp8", "fp8_e4m3", "bfloat16"):
        assert kv_cache_scale_bytes(name) == 0


def test_the_names_have_one_source_kv_quant_layout(patched):
    """KV_QUANT_DTYPES of kernels/kv_quant/layout.py is the only list of the names: no patch, no dcu/ module and
    no kernel module spells them or tests a suffix; vLLM's CacheDType, dtype table and TRITON_ATTN's supported
    list are built from it."""
    import re
    from pathlib import Path
    from typing import get_args

    from vllm.config.cache import CacheDType
    from vllm.dcu_kernels.kv_quant.layout import KV_QUANT_DTYPES
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

    repo = Path(__file__).resolve().parent.parent
    spelled = re.compile(r"[\"']_?(fp8|int8)?_per_token_head[\"']")
    sources = [(f, [l for l in f.read_text().splitlines() if l.startswith("+")])
               for f in (repo / "patches").glob("*.patch")]
    sources += [(f, f.read_text().splitlines()) for d in ("dcu", "kernels") for f in (repo / d).rglob("*.py")
                if f.name != "layout.py" and not f.name.startswith("bench") and f.name != "numerics.py"]
    for f, lines in sources:
        assert not [l for l in lines if spelled.search(l)], f
    assert set(KV_QUANT_DTYPES) == set(PTH)
    assert set(KV_QUANT_DTYPES) <= set(get_args(CacheDType))
    assert set(KV_QUANT_DTYPES) <= set(STR_DTYPE_TO_TORCH_DTYPE)
    assert set(KV_QUANT_DTYPES) <= set(TritonAttentionBackend.supported_kv_cache_dtypes)


def test_kv_cache_dtype_cli_choices_include_the_names(patched):
    import argparse

    from vllm.config import CacheConfig
    from vllm.engine.arg_utils import get_kwargs

    kwargs = get_kwargs(CacheConfig)["cache_dtype"]  # what --kv-cache-dtype is built from
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--kv-cache-dtype", choices=kwargs["choices"], type=kwargs["type"])
    for name in PTH:
        assert parser.parse_args(["--kv-cache-dtype", name]).kv_cache_dtype == name
    with pytest.raises(argparse.ArgumentError):
        parser.parse_args(["--kv-cache-dtype", "int4_per_token_head"])


@pytest.mark.parametrize("name", PTH)
def test_calculate_kv_scales_is_refused_naming_triton_attn(patched, name):
    from vllm.config.cache import CacheConfig

    with pytest.raises(ValueError, match="calculate_kv_scales.*TRITON_ATTN"):
        CacheConfig(cache_dtype=name, calculate_kv_scales=True)


# ----------------------------------------------------------------------------------------------- specs


def test_attention_spec_page_size_counts_four_scale_bytes_per_token_head(patched):
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    kw = dict(block_size=16, num_kv_heads=4, head_size=256, dtype=torch.uint8)
    assert FullAttentionSpec(**kw).page_size_bytes == 16 * 2 * 4 * 256
    assert FullAttentionSpec(**kw, scale_bytes_per_token_head=4).page_size_bytes == 16 * 2 * 4 * 260
    assert SlidingWindowSpec(**kw, sliding_window=128, scale_bytes_per_token_head=4).page_size_bytes == 16 * 2 * 4 * 260
    one_token = FullAttentionSpec(**{**kw, "block_size": 1}, scale_bytes_per_token_head=4).page_size_bytes
    assert 16 * one_token == 33_280  # Qwen3.5-27B: 16 full-attention layers
    assert 16 * FullAttentionSpec(**{**kw, "block_size": 1, "dtype": torch.bfloat16}).page_size_bytes == 65_536


def test_full_attention_spec_merge_keeps_scale_bytes_and_rejects_mixed_layers(patched):
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    kw = dict(block_size=16, num_kv_heads=4, head_size=256, dtype=torch.uint8)
    pth = FullAttentionSpec(**kw, scale_bytes_per_token_head=4)
    merged = FullAttentionSpec.merge([pth, pth])
    assert merged.scale_bytes_per_token_head == 4 and merged.page_size_bytes == pth.page_size_bytes
    with pytest.raises(AssertionError):
        FullAttentionSpec.merge([pth, FullAttentionSpec(**kw)])


def test_attention_layer_spec_and_impl_for_each_dtype(patched, qwen35_dir):
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

    for name, scale_bytes in (("auto", 0), ("fp8_per_token_head", 4), ("int8_per_token_head", 4)):
        vc = make_vllm_config(qwen35_dir, name)
        with set_current_vllm_config(vc):
            layer = Attention(24, 256, 256**-0.5, num_kv_heads=4, cache_config=vc.cache_config,
                              prefix=f"layers.3.attn.{name}", attn_backend=TritonAttentionBackend)
        spec = layer.get_kv_cache_spec(vc)
        assert spec.scale_bytes_per_token_head == scale_bytes
        assert spec.page_size_bytes == vc.cache_config.block_size * 2 * 4 * (256 * (2 if name == "auto" else 1)
                                                                            + scale_bytes)
        assert layer.query_quant is None  # no fp8 query quantization for these dtypes
        if name != "auto":
            assert layer.impl.kv_quant == name.split("_")[0]
            assert layer.impl.supports_quant_query_input is False
            assert layer.impl.fused_rope_kvcache_supported() is False


# ----------------------------------------------------------------------------------------------- hybrid sizing


@pytest.mark.slow
def test_qwen35_27b_hybrid_block_size_per_cache_dtype(patched, qwen35_dir):
    # 16 * cdiv(mamba page 3,207,168 B, 16 * attention bytes per token); int8 rounds to 128 tokens (its V rows by dim
    # then start on 128-byte lines: kv_quant.layout.PAGE_ALIGN_TOKENS), which keeps its capacity (1,289,600 tokens in
    # the test below against fp8's 1,289,712)
    want = {"auto": 784, "fp8": 1568, "fp8_per_token_head": 1552, "int8_per_token_head": 1664}
    per_token = {"auto": 4096, "fp8": 2048, "fp8_per_token_head": 2080, "int8_per_token_head": 2080}
    for name, block in want.items():
        cc = make_vllm_config(qwen35_dir, name).cache_config
        assert cc.block_size == block, name
        assert cc.mamba_cache_mode == "align" and cc.mamba_block_size == block
        assert cc.mamba_page_size_padded == block * per_token[name]  # GDN pages padded to the attention page
        assert block * per_token[name] >= 3_207_168
    # the decode and prefill benches page each kind as the engine does (both take kv_quant.layout's table)
    from kernels.decode_attention import bench as decode_bench
    from kernels.kv_quant.layout import QWEN35_27B_PAGE_TOKENS
    from kernels.prefill_attention import bench as prefill_bench

    engine = {"bf16": want["auto"], "fp8": want["fp8_per_token_head"], "int8": want["int8_per_token_head"]}
    assert QWEN35_27B_PAGE_TOKENS == engine
    for bench in (decode_bench, prefill_bench):
        assert {k: bench.BLOCK[k] for k in ("bf16", "fp8", "int8")} == engine, bench


@pytest.mark.slow
def test_qwen35_27b_kv_capacity_is_1_97x_bf16(patched, qwen35_dir):
    """Real specs from Attention layers and GDN shapes through vLLM's KV cache config (hybrid manager)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    tokens = {}
    for name in ("auto", "fp8_per_token_head", "int8_per_token_head"):
        vc = make_vllm_config(qwen35_dir, name)
        vc.scheduler_config.disable_hybrid_kv_cache_manager = False  # the CPU platform turns it off
        cc = vc.cache_config
        specs = {}
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            with set_current_vllm_config(vc):
                for i in range(64):
                    if (i + 1) % 4 == 0:
                        layer = Attention(24, 256, 256**-0.5, num_kv_heads=4, cache_config=cc,
                                          prefix=f"{name}.layers.{i}.attn", attn_backend=TritonAttentionBackend)
                        specs[f"layers.{i}.attn"] = layer.get_kv_cache_spec(vc)
                    else:
                        specs[f"layers.{i}.linear_attn"] = MambaSpec(
                            block_size=cc.mamba_block_size,
                            shapes=Qwen3NextForCausalLM.get_mamba_state_shape_from_config(vc),
                            dtypes=Qwen3NextForCausalLM.get_mamba_state_dtype_from_config(vc),
                            page_size_padded=cc.mamba_page_size_padded, mamba_type="gdn_attention",
                            mamba_cache_mode=cc.mamba_cache_mode)
        finally:
            torch.set_default_dtype(default)
        kv_config = get_kv_cache_configs(vc, [specs], [40 * 2**30])[0]
        attn = [g.kv_cache_spec for g in kv_config.kv_cache_groups if isinstance(g.kv_cache_spec, FullAttentionSpec)]
        assert len(attn) == 1 and len(kv_config.kv_cache_groups) == 4  # 1 attention + 3 GDN groups
        assert attn[0].page_size_bytes == cc.block_size * 4 * 2 * (512 if name == "auto" else 260)
        tokens[name] = kv_config.num_blocks * cc.block_size
    for name in PTH:
        assert tokens[name] / tokens["auto"] == pytest.approx(1.97, abs=0.01), tokens


# ----------------------------------------------------------------------------------------------- backends


def test_triton_attn_cache_shape_and_dtypes(patched):
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend as B

    for name in PTH:
        assert B.supports_kv_cache_dtype(name)
        assert B.get_kv_cache_shape(10, 1552, 4, 256, cache_dtype_str=name) == (10, 2, 1552, 4, 260)
    assert B.get_kv_cache_shape(10, 784, 4, 256, cache_dtype_str="auto") == (10, 2, 784, 4, 256)


def _selector_kwargs(kv_cache_dtype, use_mla=False):
    from vllm.platforms.interface import DeviceCapability

    return dict(head_size=576 if use_mla else 256, dtype=torch.bfloat16, kv_cache_dtype=kv_cache_dtype,
                block_size=None, use_mla=use_mla, has_sink=False, use_sparse=False, use_mm_prefix=False,
                use_per_head_quant_scales=False, device_capability=DeviceCapability(9, 0), attn_type="decoder")


@pytest.mark.parametrize("name", PTH)
def test_every_other_backend_refuses_naming_triton_attn(patched, monkeypatch, name):
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    _rocm(monkeypatch)  # some ROCm backends import the ROCm platform module to check the arch

    checked, accepted = [], []
    for member in AttentionBackendEnum:
        if member.value is None:
            continue
        try:
            cls = member.get_class()
        except Exception:  # needs a compiled extension or a GPU library to import
            continue
        for use_mla in (False, True):
            reasons = cls.validate_configuration(**_selector_kwargs(name, use_mla))
            if member.name in ("TRITON_ATTN", "DCU_TRITON_ATTN") and not use_mla:
                assert reasons == [], (member.name, reasons)
                accepted.append(member.name)
            elif cls.is_mla() == use_mla:
                assert f"kv_cache_dtype {name} is supported only by TRITON_ATTN and DCU_TRITON_ATTN" in reasons, (
                    member.name, reasons)
                checked.append(member.name)
    # FLASH_ATTN accepts every fp8* name when FA3 is there: it must refuse these explicitly
    assert {"FLASH_ATTN", "FLEX_ATTENTION", "ROCM_ATTN", "TRITON_MLA"} <= set(checked), checked
    assert "TRITON_ATTN" in accepted


def _rocm(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a, **k: types.SimpleNamespace(gcnArchName="gfx936"))
    from vllm.platforms import rocm
    from vllm.platforms.interface import DeviceCapability

    monkeypatch.setattr(rocm.RocmPlatform, "get_device_capability", classmethod(lambda cls, *a: DeviceCapability(9, 3)))
    return rocm.RocmPlatform


@pytest.mark.parametrize("name", PTH)
def test_rocm_auto_selection_lands_on_a_triton_backend(patched, monkeypatch, name):
    from vllm.v1.attention.selector import AttentionSelectorConfig

    platform = _rocm(monkeypatch)
    kw = _selector_kwargs(name)
    kw.pop("device_capability")
    path = platform.get_attn_backend_cls(None, AttentionSelectorConfig(**kw))
    assert path.endswith(("triton_attn.TritonAttentionBackend", "vllm.dcu.triton_attn.DcuTritonAttentionBackend")), path


@pytest.mark.parametrize("name", PTH)
def test_explicit_other_backend_fails_at_startup_naming_triton_attn(patched, monkeypatch, name):
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

    platform = _rocm(monkeypatch)
    kw = _selector_kwargs(name)
    kw.pop("device_capability")
    with pytest.raises(ValueError, match=f"ROCM_ATTN.*kv_cache_dtype {name} is supported only by TRITON_ATTN"):
        platform.get_attn_backend_cls(AttentionBackendEnum.ROCM_ATTN, AttentionSelectorConfig(**kw))


@pytest.mark.parametrize("name", PTH)
def test_mla_models_are_refused_naming_triton_attn(patched, name):
    from vllm.config.cache import CacheConfig
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention

    with pytest.raises(ValueError, match=f"{name} is not supported for MLA models.*TRITON_ATTN"):
        MLAAttention(num_heads=16, scale=1.0, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                     q_lora_rank=None, kv_lora_rank=512, kv_b_proj=None, cache_config=CacheConfig(cache_dtype=name))


@pytest.mark.parametrize("name", PTH)
def test_checkpoint_with_calibrated_fp8_kv_scales_is_refused(patched, qwen35_dir, name):
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

    vc = make_vllm_config(qwen35_dir, name)
    quant_config = types.SimpleNamespace(kv_cache_scheme={"strategy": "tensor"})
    with set_current_vllm_config(vc), pytest.raises(ValueError, match="calibrated fp8 KV scales"):
        Attention(24, 256, 256**-0.5, num_kv_heads=4, cache_config=vc.cache_config, quant_config=quant_config,
                  prefix=f"ckpt.{name}", attn_backend=TritonAttentionBackend)
    assert vc.cache_config.cache_dtype == name  # not silently switched to per-tensor fp8
