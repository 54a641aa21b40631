"""The CPU parts of the engine-equivalence work (issue #15): the scaled dummy weights (ci/gpu/scaled_weights.py),
the tolerance derivation (bench/logprob_tolerance.py), the logprob worker on a fake engine (bench/logprob_eq.py),
the comparison / report logic (bench/logprob_compare.py), bench/kv_drift.py's report, and the derivation checked
against bench/equiv_sim.py's simulation of the same model at reduced width.

The engines themselves run on a GPU: tests/gpu/test_engine_equivalence.py, bench/kv_drift.py.
"""
from __future__ import annotations

import json
import math
import sys
import types

import numpy as np
import pytest
import torch

from bench import equiv_sim, kv_drift
from bench import logprob_compare as lcmp
from bench import logprob_eq as leq
from bench import logprob_tolerance as ltol
from ci.gpu import scaled_weights as sw
from tests.data.fake_logprob_llm import FakeLLM

# --- scaled dummy weights ------------------------------------------------------------------------------------


def _named(cls_name, **params):
    """A module whose class is called cls_name (the rules go by class name) with the given parameters."""
    cls = type(cls_name, (torch.nn.Module,), {})
    m = cls()
    for k, shape in params.items():
        m.register_parameter(k, torch.nn.Parameter(torch.full(shape, 0.5)))
    return m


def qwen35_like(hidden=64, vocab=512, heads=2, kv_heads=1, head_dim=32, inter=96):
    """The parameter layout of vLLM's Qwen3.5 (one GDN layer, one full-attention layer), tiny."""
    root = torch.nn.Module()
    model = torch.nn.Module()
    root.model = model
    model.embed_tokens = _named("VocabParallelEmbedding", weight=(vocab, hidden))
    model.layers = torch.nn.ModuleList()
    for kind in ("linear", "full"):
        layer = torch.nn.Module()
        if kind == "linear":
            gdn = _named("Qwen3_5GatedDeltaNet", A_log=(4,), dt_bias=(4,))
            gdn.in_proj_qkvz = _named("MergedColumnParallelLinear", weight=(4 * 32, hidden))
            gdn.in_proj_ba = _named("MergedColumnParallelLinear", weight=(8, hidden))
            gdn.conv1d = _named("ColumnParallelLinear", weight=(96, 1, 4))
            gdn.norm = _named("RMSNormGated", weight=(16,))
            gdn.out_proj = _named("RowParallelLinear", weight=(hidden, 32))
            layer.linear_attn = gdn
        else:
            attn = torch.nn.Module()
            attn.qkv_proj = _named("QKVParallelLinear", weight=((2 * heads + 2 * kv_heads) * head_dim, hidden))
            attn.o_proj = _named("RowParallelLinear", weight=(hidden, heads * head_dim))
            attn.q_norm = _named("GemmaRMSNorm", weight=(head_dim,))
            attn.k_norm = _named("GemmaRMSNorm", weight=(head_dim,))
            attn.attn = _named("Attention")
            attn.attn.register_buffer("_k_scale", torch.tensor(1.0))
            layer.self_attn = attn
        layer.mlp = torch.nn.Module()
        layer.mlp.gate_up_proj = _named("MergedColumnParallelLinear", weight=(2 * inter, hidden))
        layer.mlp.down_proj = _named("RowParallelLinear", weight=(hidden, inter))
        layer.input_layernorm = _named("GemmaRMSNorm", weight=(hidden,))
        layer.post_attention_layernorm = _named("GemmaRMSNorm", weight=(hidden,))
        model.layers.append(layer)
    model.norm = _named("GemmaRMSNorm", weight=(hidden,))
    root.lm_head = _named("ParallelLMHead", weight=(vocab, hidden))
    return root


def test_every_qwen35_parameter_gets_the_rule_of_its_kind():
    scales = sw.Scales(score_std=4.0, logit_std=2.5, dt_bias=-2.0)
    rules = {name: (kind, val) for name, kind, val in sw.plan(qwen35_like(), scales)}
    assert rules["model.embed_tokens.weight"] == ("normal", 1.0)
    assert rules["lm_head.weight"] == ("normal", 2.5 / math.sqrt(64))  # logits of unit-RMS hidden: std 2.5
    assert rules["model.layers.1.self_attn.qkv_proj.weight"] == ("normal", 1 / math.sqrt(64))  # fan_in = shape[1]
    assert rules["model.layers.1.self_attn.o_proj.weight"] == ("normal", 1 / math.sqrt(64))
    assert rules["model.layers.0.mlp.down_proj.weight"] == ("normal", 1 / math.sqrt(96))
    assert rules["model.layers.0.linear_attn.conv1d.weight"] == ("normal", 1 / math.sqrt(4))  # [C, 1, kernel]
    # GemmaRMSNorm applies 1 + w: gain 1 is w = 0; q/k norms get sqrt(score_std) each
    assert rules["model.layers.0.input_layernorm.weight"] == ("const", 0.0)
    assert rules["model.norm.weight"] == ("const", 0.0)
    assert rules["model.layers.1.self_attn.q_norm.weight"] == ("const", 1.0)  # sqrt(4) - 1
    assert rules["model.layers.1.self_attn.k_norm.weight"] == ("const", 1.0)
    assert rules["model.layers.0.linear_attn.norm.weight"] == ("const", 1.0)  # RMSNormGated applies w itself
    assert rules["model.layers.0.linear_attn.A_log"] == ("const", 0.0)
    assert rules["model.layers.0.linear_attn.dt_bias"] == ("const", -2.0)
    assert len(rules) == len(dict(qwen35_like().named_parameters()))  # buffers (_k_scale) are not touched


def test_reinit_draws_the_planned_std_deterministically_per_parameter_name():
    a, b = qwen35_like(hidden=256, vocab=2048), qwen35_like(hidden=256, vocab=2048)
    summary = sw.reinit_(a, sw.Scales())
    sw.reinit_(b, sw.Scales())
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert summary["normal"] + summary["const"] == len(pa) and summary["keep"] == 0
    for name in pa:
        assert torch.equal(pa[name], pb[name]), name  # same seed, same name: same values (another process too)
    emb, head = pa["model.embed_tokens.weight"], pa["lm_head.weight"]
    assert abs(float(emb.std()) - 1.0) < 0.02
    assert abs(float(head.std()) - 3.0 / 16) < 0.01
    assert torch.all(pa["model.layers.1.self_attn.q_norm.weight"] == math.sqrt(3.0) - 1.0)
    # the values depend on the parameter's name and the seed, not on what else the model holds
    c = qwen35_like(hidden=256, vocab=2048)
    c.extra = _named("RowParallelLinear", weight=(8, 8))
    sw.reinit_(c, sw.Scales())
    assert torch.equal(dict(c.named_parameters())["lm_head.weight"], head)
    sw.reinit_(c, sw.Scales(seed=1))
    assert not torch.equal(dict(c.named_parameters())["lm_head.weight"], head)


def test_a_parameter_without_a_rule_fails_before_anything_is_written():
    m = qwen35_like()
    m.model.layers[0].attn_layer_scale = torch.nn.Parameter(torch.full((1, 1, 64), 7.0))
    before = m.model.embed_tokens.weight.detach().clone()
    with pytest.raises(ValueError, match=r"no re-initialisation rule for model\.layers\.0\.attn_layer_scale"):
        sw.reinit_(m, sw.Scales())
    assert torch.equal(m.model.embed_tokens.weight, before)


def test_quantized_checkpoint_kv_scales_and_a_vision_tower_are_kept():
    m = qwen35_like()
    m.model.layers[1].self_attn.attn.k_scale = torch.nn.Parameter(torch.tensor(-1.0), requires_grad=False)
    m.visual = torch.nn.Module()
    m.visual.patch_embed = _named("Conv3dLayer", weight=(8, 3, 2, 2, 2), bias=(8,))
    summary = sw.reinit_(m, sw.Scales())
    assert summary["keep"] == 3 and float(m.model.layers[1].self_attn.attn.k_scale) == -1.0
    assert torch.all(m.visual.patch_embed.weight == 0.5)


def test_scales_round_trip_and_reject_bad_values():
    s = sw.Scales(score_std=2.0, seed=3)
    assert sw.Scales.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert sw.Scales.from_dict(None) == sw.Scales()
    assert sw.Scales(score_std=4.0).qk_norm_gain == 2.0
    with pytest.raises(ValueError, match=r"unknown scale\(s\) \['temperature'\]"):
        sw.Scales.from_dict({"temperature": 1.0})
    for bad in ({"logit_std": 0.0}, {"score_std": float("nan")}, {"seed": -1}, {"seed": 1.5}, {"a_log": "0"}):
        with pytest.raises(ValueError):
            sw.Scales.from_dict(bad)


def test_param_seeds_are_stable_across_processes():
    # crc32, not hash(): a fixed number for a fixed name (a second engine process draws the same weights)
    assert sw.param_seed(0, "lm_head.weight") == 2097055460
    assert sw.param_seed(1, "lm_head.weight") != sw.param_seed(0, "lm_head.weight")


def test_loader_registers_with_vllm_and_reinitialises_through_it(vllm_tree):
    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader

    assert sw.register_loader() == sw.LOAD_FORMAT
    loader = get_model_loader(LoadConfig(load_format=sw.LOAD_FORMAT,
                                         model_loader_extra_config={"score_std": 4.0, "seed": 5}))
    assert loader.scales == sw.Scales(score_std=4.0, seed=5)
    m = qwen35_like()
    loader.load_weights(m, None)
    assert torch.all(m.model.layers[1].self_attn.k_norm.weight == 1.0)
    with pytest.raises(ValueError, match="unknown scale"):
        get_model_loader(LoadConfig(load_format=sw.LOAD_FORMAT, model_loader_extra_config={"nope": 1}))


def test_engine_kwargs_use_the_loader_and_a_cheap_engine_start():
    from ci.gpu import harness

    cfg = leq.make_config("x", "DCU_TRITON_ATTN", "int8_per_token_head", work="<tmp>/w", layers=8,
                          lengths=[4096, 1024], steps=8)
    assert cfg["lengths"] == [1024, 4096] and cfg["max_len"] == 4096 + 8 + 64
    assert cfg["env"] == {"VLLM_DCU_GEMV": "off"} and cfg["scales"] == sw.Scales().to_dict()
    kw = leq.engine_kwargs(harness, "<tmp>/w/model-l8", cfg, sw.LOAD_FORMAT)
    assert kw["load_format"] == sw.LOAD_FORMAT and kw["model_loader_extra_config"] == sw.Scales().to_dict()
    assert kw["attention_backend"] == "DCU_TRITON_ATTN" and kw["kv_cache_dtype"] == "int8_per_token_head"
    assert kw["max_logprobs"] == -1 and kw["enable_prefix_caching"] is False and kw["skip_tokenizer_init"] is True
    assert kw["compilation_config"] == {"custom_ops": ["none"], "mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY",
                                        "cudagraph_capture_sizes": [1, 2, 4]}
    with pytest.raises(ValueError, match="kv must be one of"):
        leq.make_config("x", "TRITON_ATTN", "fp8", work="<tmp>/w", layers=8, lengths=[8], steps=1)


# --- tolerance derivation ------------------------------------------------------------------------------------


def test_bf16_kernel_rounding_eps_is_two_u_over_root_3():
    parts = ltol.attention_eps("bf16-kernels", 3.0, 256)
    assert parts["eps"] == pytest.approx(2 * 2.0**-8 / math.sqrt(3), rel=1e-12)


@pytest.mark.parametrize("kind,lo,hi", [("int8", 6e-3, 8e-3), ("fp8", 2.3e-2, 2.9e-2)])
def test_8bit_relative_error_of_a_256_wide_head_comes_from_the_cache_quantizer(kind, lo, hi):
    # int8: step absmax / 127, absmax ~2.9 RMS for 256 Gaussian values: 2.9 / (127 sqrt(12)) ~ 6.6e-3;
    # e4m3: 3 mantissa bits, relative step 2^-3 .. 2^-4 per binade: ~2.6e-2
    r = ltol.quant_rel_error(kind, 256)
    assert lo < r < hi
    parts = ltol.attention_eps(kind, 3.0, 256)
    assert parts["k_scores"] == pytest.approx(3.0 * r) and parts["v"] == pytest.approx(r)
    assert parts["eps"] == pytest.approx(math.sqrt((3 * r) ** 2 + r**2 + parts["rounding"] ** 2))


def test_limits_scale_with_depth_margin_and_vocabulary():
    kw = dict(vocab=248320, prompt_len=32767, logit_std=3.0, score_std=3.0)
    t8, t16 = ltol.derive("int8", layers=8, **kw), ltol.derive("int8", layers=16, **kw)
    p8 = ltol.propagation(8) * t8.eps
    assert ltol.propagation(16) == 2 * ltol.propagation(8) == 1.0  # 0.25 per full-attention layer
    assert ltol.rounding_floor(8) == pytest.approx(0.5 * 2.0**-8 * 8)
    assert t8.sigma == pytest.approx(3.0 * math.hypot(p8, ltol.rounding_floor(8)))
    assert t16.sigma == pytest.approx(2 * t8.sigma)  # both terms grow with the depth
    assert t8.step_max_abs == pytest.approx(2 * ltol.z(248320) * t8.sigma + 0.125)  # + one bf16 step at ~19
    assert t8.step_kl == pytest.approx((2 * t8.sigma) ** 2 / 2)
    assert t8.prompt_max_abs == pytest.approx(2 * ltol.z(32767) * t8.sigma + 0.125)
    assert ltol.z(248320) == pytest.approx(math.sqrt(2 * math.log(248320)) + 1.5)
    assert (ltol.bf16_ulp(15.0), ltol.bf16_ulp(16.0), ltol.bf16_ulp(1.0)) == (0.0625, 0.125, 2.0**-7)
    bf16, fp8 = ltol.derive("bf16-kernels", layers=8, **kw), ltol.derive("fp8", layers=8, **kw)
    assert bf16.step_max_abs < t8.step_max_abs < fp8.step_max_abs
    # the numbers written in tests/gpu/test_engine_equivalence.py's docstring
    assert [round(t.sigma, 3) for t in (bf16, t8, fp8)] == [0.047, 0.058, 0.132]
    assert [round(t.step_max_abs, 2) for t in (bf16, t8, fp8)] == [0.74, 0.87, 1.84]
    assert [round(t.step_kl, 4) for t in (bf16, t8, fp8)] == [0.0045, 0.0067, 0.035]
    assert [round(t.prompt_rms, 3) for t in (bf16, t8, fp8)] == [0.095, 0.115, 0.265]
    assert [round(t.prompt_max_abs, 2) for t in (bf16, t8, fp8)] == [0.7, 0.82, 1.73]
    assert "int8: eps = 0.0224" in t8.derivation
    with pytest.raises(ValueError, match="mode must be one of"):
        ltol.derive("fp4", layers=8, **kw)


def test_comparison_mode_follows_the_two_kv_dtypes():
    cm = ltol.comparison_mode
    assert cm({"kv": "auto"}, {"kv": "auto"}) == "bf16-kernels"
    assert cm({"kv": "auto"}, {"kv": "int8_per_token_head"}) == "int8"
    assert cm({"kv": "bfloat16"}, {"kv": "fp8_per_token_head"}) == "fp8"
    with pytest.raises(ValueError, match="reference must be bf16"):
        cm({"kv": "int8_per_token_head"}, {"kv": "auto"})
    with pytest.raises(ValueError, match="unknown KV dtype"):
        cm({"kv": "fp8"}, {"kv": "auto"})


# --- the derivation against the simulation ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def sims():
    """bench/equiv_sim.py runs of every comparison: bf16 everywhere (the engine) at 4, 8 and 16 layers (1, 2, 4
    full-attention layers), and float64 but attention (the linear propagation alone) at 4 and 8."""
    torch.set_num_threads(1)
    out = {}
    for bf16, plan in ((True, ((4, (0, 1)), (8, (0, 1)), (16, (0,)))), (False, ((4, (0,)), (8, (0,))))):
        for layers, seeds in plan:
            for mode in equiv_sim.MODES:
                for seed in seeds:
                    out[(bf16, mode, layers, seed)] = equiv_sim.simulate(mode, layers, tokens=192, seed=seed,
                                                                         bf16=bf16)
    return out


def _sim_tol(mode, layers, r):
    d = equiv_sim.Dims()
    return ltol.derive(mode, layers=layers, vocab=d.vocab, prompt_len=r["tokens"] - 1, logit_std=3.0, score_std=3.0,
                      head_dim=d.head_dim)


@pytest.mark.slow
def test_simulated_linear_propagation_and_attention_error_stay_within_their_bounds(sims):
    # float64 but attention: what reaches the logits of an attention error, linearly (P), and the attention error
    # itself (eps, from the rounding / quantization models) against the derivation's bounds
    d = equiv_sim.Dims()
    for (bf16, mode, layers, seed), r in sims.items():
        where = f"{mode} {layers} layers seed {seed} bf16 {bf16}: {r}"
        if bf16:
            continue
        assert r["eps"] <= ltol.attention_eps(mode, 3.0, d.head_dim)["eps"] * 1.05, where
        assert r["propagation"] <= ltol.propagation(layers), where


@pytest.mark.slow
def test_simulated_drift_with_bf16_everywhere_stays_within_the_derived_limits(sims):
    # the engine's reality: bf16 activations, so two engines that differ at all differ by re-rounding everywhere
    # after it. The floor F bounds the bf16-kernel drift alone, the limits (margin 2) every comparison.
    for (bf16, mode, layers, seed), r in sims.items():
        if not bf16:
            continue
        tol = _sim_tol(mode, layers, r)
        where = f"{mode} {layers} layers seed {seed}: {r}"
        if mode == "bf16-kernels":
            assert r["drift_std"] / 3.0 <= ltol.rounding_floor(layers), where
        assert r["drift_std"] <= tol.sigma, where
        assert r["drift_max"] <= tol.step_max_abs, where
        assert r["kl"] <= tol.step_kl, where
        assert r["prompt_rms"] <= tol.prompt_rms, where
        assert r["prompt_max"] <= tol.prompt_max_abs, where


@pytest.mark.slow
def test_simulated_weights_give_peaked_not_flat_logits_and_far_context_reaches_them():
    w = equiv_sim.build(4, sw.Scales())
    ids = torch.randint(0, 8192, (256,), generator=torch.Generator().manual_seed(0))
    ref = equiv_sim.forward(w, ids, equiv_sim.Engine())[-1]
    probe = ids.clone()
    probe[:128] = torch.randint(0, 8192, (128,), generator=torch.Generator().manual_seed(1))
    other = equiv_sim.forward(w, probe, equiv_sim.Engine())[-1]
    assert 2.5 < float(ref.std()) < 3.5  # logit_std 3
    assert 10 / 8192 < float(ref.exp().max()) < 0.9
    # the far half of the context (gone from the linear-attention layers' state) moves the last position's
    # logprobs beyond the bf16 kernels' limits, as the GPU test's probe asserts (measured 2-4x the max limit and
    # 20-40x the KL limit at 4-8 layers and 256-1024 tokens)
    bf16 = ltol.derive("bf16-kernels", layers=4, vocab=8192, prompt_len=255, logit_std=3.0, score_std=3.0,
                      head_dim=64)
    assert float((other - ref).abs().max()) > bf16.step_max_abs
    assert lcmp._kl(ref.numpy(), other.numpy()) > 10 * bf16.step_kl


# --- comparison and report -------------------------------------------------------------------------------------


def _run(name, kv, lengths=(8, 12), steps=3, vocab=50, seed=0, layers=8):
    g = np.random.default_rng(seed)
    lengths_d = {}
    for n in lengths:
        logits = g.normal(0, 3, (steps + 1, vocab))
        lp = (logits - np.log(np.exp(logits).sum(1, keepdims=True))).astype(np.float32)
        lengths_d[n] = dict(tokens=lp.argmax(1).astype(np.int64), logprobs=lp, prompt=np.arange(n, dtype=np.int32),
                            prompt_lp=g.normal(-5, 1, n - 1).astype(np.float32))
    meta = dict(name=name, kv=kv, layers=layers, vocab=vocab, scales=sw.Scales().to_dict(), start_s=1.0,
                lengths={str(n): dict(wall_s=0.5) for n in lengths})
    return {"meta": meta, "lengths": lengths_d, "probe": None}


def _perturbed(run, name, kv, scale, seed=1):
    import copy

    g = np.random.default_rng(seed)
    out = copy.deepcopy(run)
    out["meta"]["name"], out["meta"]["kv"] = name, kv
    for d in out["lengths"].values():
        d["logprobs"] = (d["logprobs"] + g.normal(0, scale, d["logprobs"].shape)).astype(np.float32)
        d["prompt_lp"] = (d["prompt_lp"] + g.normal(0, scale, d["prompt_lp"].shape)).astype(np.float32)
    return out


def test_identical_runs_compare_bit_identical_and_pass():
    ref = _run("a", "auto")
    metrics = lcmp.compare(ref, _run("b", "auto"))
    assert all(m["bit_identical"] and m["diverged_at"] is None and m["steps_compared"] == 4 for m in metrics.values())
    tol = lcmp.tolerances_for(ref["meta"], ref["meta"], metrics)
    assert lcmp.check(metrics, tol) == []
    assert lcmp.ratios(metrics, tol)[8]["step_max_abs"] == 0.0


def test_steps_are_compared_through_the_first_different_token_and_no_further():
    ref = _run("a", "auto")
    other = _run("b", "auto")
    other["lengths"][8]["tokens"][2] += 1  # third sampled token differs: steps 0, 1, 2 share their context
    other["lengths"][8]["logprobs"][3] += 100.0  # after the divergence: different context, never compared
    m = lcmp.compare(ref, other)[8]
    assert m["diverged_at"] == 2 and m["steps_compared"] == 3 and m["step_max_abs"] == 0.0
    assert "ref_gap" in m["steps"][-1]


def test_drift_beyond_the_limits_fails_with_the_number_and_the_limit():
    ref = _run("a", "auto", lengths=(8,))
    small = lcmp.compare(ref, _perturbed(ref, "b", "int8_per_token_head", 1e-3))
    tol = lcmp.tolerances_for(ref["meta"], {**ref["meta"], "kv": "int8_per_token_head"}, small)
    assert lcmp.check(small, tol) == []
    big = lcmp.compare(ref, _perturbed(ref, "b", "int8_per_token_head", 1.0))
    failures = lcmp.check(big, tol)
    assert any(f.startswith("length 8: step max |d logprob| ") and "> limit" in f for f in failures)
    assert any(f.startswith("length 8: prompt RMS ") for f in failures)


def test_non_finite_logprobs_and_different_prompts_are_caught():
    ref = _run("a", "auto", lengths=(8,))
    bad = _run("b", "auto", lengths=(8,))
    bad["lengths"][8]["logprobs"][1, 3] = np.nan
    m = lcmp.compare(ref, bad)
    tol = lcmp.tolerances_for(ref["meta"], ref["meta"], m)
    assert lcmp.check(m, tol) == ["length 8: non-finite logprobs"]
    other = _run("c", "auto", lengths=(8,))
    other["lengths"][8]["prompt"][0] = 99
    with pytest.raises(ValueError, match="different prompts"):
        lcmp.compare(ref, other)
    with pytest.raises(ValueError, match="different weights"):
        lcmp.tolerances_for(ref["meta"], {**ref["meta"], "layers": 4}, m)


def test_dense_and_prompt_logprobs_from_vllm_flat_and_dict_outputs(vllm_tree):
    from vllm.logprobs import FlatLogprobs, Logprob

    vocab = 6
    rows = [np.log(np.full(vocab, 1 / vocab)), np.log(np.arange(1, vocab + 1) / 21.0)]
    flat, dicts = FlatLogprobs(), []
    for i, row in enumerate(rows):
        d = {3: Logprob(float(row[3]), 1)}  # the sampled token first, then all of them (logprobs=-1)
        d.update({t: Logprob(float(row[t]), r) for r, t in enumerate(np.argsort(-row), 1)})
        flat.append(d)
        dicts.append(d)
    for src in (flat, dicts):
        assert np.allclose(leq.dense_logprobs(src, vocab), np.stack(rows))
    short = FlatLogprobs()
    short.append({0: Logprob(-1.0, 1)})
    with pytest.raises(ValueError, match="5 of 6 logprobs missing"):
        leq.dense_logprobs(short, vocab)
    ids = [5, 2, 4]
    plp = FlatLogprobs()
    plp.append(None)  # the first prompt token has no logprob
    plp.append({2: Logprob(-0.5, 3)})
    plp.append({4: Logprob(-1.5, 7)})
    assert leq.prompt_token_logprobs(plp, ids).tolist() == [-0.5, -1.5]
    assert leq.prompt_token_logprobs([None, {2: Logprob(-0.5)}, {4: Logprob(-1.5)}], ids).tolist() == [-0.5, -1.5]
    with pytest.raises(ValueError, match="token 4 not among"):
        leq.prompt_token_logprobs([None, {2: Logprob(-0.5)}, {3: Logprob(-1.5)}], ids)


def test_prompts_are_the_same_in_every_configuration_and_probe_keeps_the_second_half():
    a = leq.prompt_ids(0, 1024, 248320)
    assert a == leq.prompt_ids(0, 1024, 248320) and a != leq.prompt_ids(1, 1024, 248320)
    assert all(1000 <= t < 248320 - 1000 for t in a)
    p = leq.probe_ids(a, 0, 248320)
    assert len(p) == 1024 and p[512:] == a[512:] and sum(x != y for x, y in zip(p[:512], a[:512])) > 500


def test_saved_runs_load_back(tmp_path):
    run = _run("a", "auto", lengths=(8,))
    for n, d in run["lengths"].items():
        np.savez(tmp_path / f"len{n}.npz", **d)
    np.savez(tmp_path / "probe.npz", logprobs=run["lengths"][8]["logprobs"][:1], length=np.int64(8))
    (tmp_path / "meta.json").write_text(json.dumps(run["meta"]))
    back = leq.load_run(tmp_path)
    assert back["meta"] == run["meta"] and back["probe"].shape == (50,)
    assert all(np.array_equal(back["lengths"][8][k], v) for k, v in run["lengths"][8].items())


def test_launch_reports_a_worker_that_fails(tmp_path):
    cfg = leq.make_config("w", "TRITON_ATTN", "auto", work=tmp_path, layers=4, lengths=[8], steps=1)
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "meta.json").write_text("{}")  # stale: must not count as this run's result
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": "/nonexistent"}
    ok, text = leq.launch(cfg, env, 60, tmp_path / "w.log")
    assert not ok and text.startswith("worker w failed (1)")
    assert not (tmp_path / "w" / "meta.json").exists()


# --- bench/kv_drift.py -----------------------------------------------------------------------------------------


def test_kv_drift_configs_parse_like_e2e_offline():
    assert kv_drift.parse_config("int8=full:DCU_TRITON_ATTN:int8_per_token_head:VLLM_DCU_GEMV=off,X=1") == dict(
        name="int8", variant="full", backend="DCU_TRITON_ATTN", kv="int8_per_token_head",
        env={"VLLM_DCU_GEMV": "off", "X": "1"})
    for bad in ("int8", "a=full:X", "a=full:X:auto:1BAD=2", "=full:X:auto"):
        with pytest.raises(ValueError, match="expected NAME=VARIANT:BACKEND:KV_DTYPE"):
            kv_drift.parse_config(bad)


def test_kv_drift_report_has_the_command_the_numbers_and_the_limits():
    ref = _run("bf16", "auto")
    runs = {"bf16": ref, "int8": _perturbed(ref, "int8", "int8_per_token_head", 1e-3)}
    specs = [kv_drift.parse_config(s) for s in kv_drift.DEFAULT_CONFIGS]
    args = types.SimpleNamespace(layers=8, steps=3, lengths=[8, 12])
    doc, lines = kv_drift.build_report("bash ci/gpu/run.sh python bench/kv_drift.py", "NVIDIA H200", args, specs,
                                       runs, {"fp8": "skipped: 12 s left before the deadline"})
    md = "\n".join(lines)
    assert lines[2] == "Command: `bash ci/gpu/run.sh python bench/kv_drift.py`"
    assert "| int8 vs bf16 | 8 |" in md and "| int8 vs bf16 | 12 |" in md
    assert "- int8: eps = " in md and "fp8: no result (skipped: 12 s left before the deadline)" in md
    pair = doc["pairs"]["int8 vs bf16"]
    assert pair["failures"] == [] and set(pair["metrics"]) == {"8", "12"}
    assert pair["limits"]["8"]["mode"] == "int8" and 0 < pair["ratios"]["8"]["prompt_rms"] < 1
    json.dumps(doc)  # the JSON file's content


def test_sampling_params_ask_for_every_logprob_and_pass_vllms_validation(vllm_tree):
    from vllm import SamplingParams

    sp = leq.sampling_params(SamplingParams, 9, True)
    assert (sp.logprobs, sp.prompt_logprobs, sp.temperature, sp.max_tokens) == (-1, 0, 0.0, 9)
    assert sp.flat_logprobs and sp.ignore_eos and not sp.detokenize
    assert leq.sampling_params(SamplingParams, 1, False).prompt_logprobs is None
    model_config = types.SimpleNamespace(max_logprobs=-1, get_vocab_size=lambda: 248320)
    sp._validate_logprobs(model_config)  # max_logprobs=-1 (engine_kwargs) admits the whole vocabulary
    with pytest.raises(ValueError, match="greater than max allowed"):
        sp._validate_logprobs(types.SimpleNamespace(max_logprobs=20, get_vocab_size=lambda: 248320))


def test_worker_writes_runs_that_compare_bit_identical(vllm_tree, monkeypatch, tmp_path):
    import vllm

    monkeypatch.setattr(vllm, "LLM", FakeLLM)
    runs = {}
    for name, backend in (("triton-bf16", "TRITON_ATTN"), ("dcu-bf16", "DCU_TRITON_ATTN")):
        cfg = leq.make_config(name, backend, "auto", work=tmp_path, layers=8, lengths=[40, 25], steps=3,
                              probe=name == "dcu-bf16")
        leq.worker(json.loads(json.dumps(cfg)))  # as it arrives on the command line
        runs[name] = leq.load_run(cfg["out_dir"])
    kw = FakeLLM.made[-1].kw
    assert kw["load_format"] == sw.LOAD_FORMAT and kw["attention_backend"] == "DCU_TRITON_ATTN"
    run = runs["dcu-bf16"]
    assert run["meta"]["lengths"].keys() == {"25", "40"} and run["meta"]["vocab"] == 4096
    assert run["lengths"][40]["logprobs"].shape == (4, 4096) and run["lengths"][40]["prompt_lp"].shape == (39,)
    assert run["probe"].shape == (4096,)
    metrics = lcmp.compare(runs["triton-bf16"], run)
    assert all(m["bit_identical"] and m["steps_compared"] == 4 for m in metrics.values())
    assert lcmp.check(metrics, lcmp.tolerances_for(runs["triton-bf16"]["meta"], run["meta"], metrics)) == []


# --- tests/gpu/test_engine_equivalence.py's logic, on fake engines ---------------------------------------------


class _NoisyLLM(FakeLLM):
    """A fake engine whose DCU_TRITON_ATTN runs are off by more than rounding (a broken attention)."""

    def _lp(self, ids):
        lp = super()._lp(ids)
        if self.kw["attention_backend"] == "DCU_TRITON_ATTN" and self.kw["kv_cache_dtype"] == "auto":
            noisy = lp + np.random.default_rng(len(ids)).normal(0, 0.3, lp.shape)
            return noisy - np.log(np.exp(noisy).sum())
        return lp


def _gpu_test(monkeypatch, tmp_path, llm_cls):
    """The GPU test module with short prompts and an engine_run that runs the worker in-process on llm_cls."""
    import importlib.util

    import vllm

    spec = importlib.util.spec_from_file_location("engine_eq_gpu", leq.REPO / "tests" / "gpu" /
                                                  "test_engine_equivalence.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "LENGTHS", (40, 64))
    monkeypatch.setattr(mod, "STEPS", 3)
    monkeypatch.setattr(vllm, "LLM", llm_cls)
    done = {}

    def engine_run(name):
        if name not in done:
            backend, kv = mod.CONFIGS[name]
            cfg = leq.make_config(name, backend, kv, work=tmp_path, layers=mod.LAYERS, lengths=mod.LENGTHS,
                                  steps=mod.STEPS, probe=name == "dcu-bf16")
            leq.worker(json.loads(json.dumps(cfg)))
            done[name] = leq.load_run(cfg["out_dir"])
        return done[name]

    return mod, engine_run


def test_gpu_equivalence_tests_pass_on_agreeing_engines_and_record_their_numbers(vllm_tree, monkeypatch, tmp_path):
    mod, engine_run = _gpu_test(monkeypatch, tmp_path, FakeLLM)
    recorded = {}
    mod.test_outputs_depend_on_far_context_through_attention(engine_run, recorded.update)
    assert 2.5 < recorded["first_token_logprob_std"] < 3.5 and recorded["probe_kl"] > 0.1
    mod.test_dcu_triton_attn_matches_triton_attn_with_bf16_kv(engine_run, recorded.update)
    assert recorded["bit_identical"] == {40: True, 64: True} and recorded["steps_compared"] == {40: 4, 64: 4}
    for kv in ("int8", "fp8"):
        mod.test_8bit_kv_matches_bf16_kv_on_dcu_triton_attn(engine_run, recorded.update, kv)
    assert recorded["worst_step_max_abs_of_limit"] == 0.0


def test_gpu_equivalence_test_fails_on_a_broken_backend_with_the_limits_in_the_message(vllm_tree, monkeypatch,
                                                                                         tmp_path):
    mod, engine_run = _gpu_test(monkeypatch, tmp_path, _NoisyLLM)
    with pytest.raises(AssertionError, match=r"(?s)length 40: step max \|d logprob\| .* > limit .*bf16-kernels: eps"):
        mod.test_dcu_triton_attn_matches_triton_attn_with_bf16_kv(engine_run, lambda **kw: None)


@pytest.mark.slow
def test_kv_drift_runs_its_configurations_and_writes_the_report(vllm_tree, monkeypatch, tmp_path):
    # bench/kv_drift.py end to end with a stand-in harness: each configuration's worker is a real process whose
    # vllm.LLM is the fake engine (a sitecustomize on its PYTHONPATH installs it, from tests/data on the same path)
    import os

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import fake_logprob_llm\nfake_logprob_llm.install()\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(leq.REPO / "tests" / "data"),
                                                       os.environ.get("PYTHONPATH", "")]))
    harness = types.SimpleNamespace(HarnessError=type("HarnessError", (Exception,), {}), variants=lambda: ["full"],
                                    variant_env=lambda name, inprocess=True: dict(env))
    monkeypatch.setitem(sys.modules, "vllm_dcu_harness", harness)
    out = tmp_path / "out"
    args = ["--layers", "8", "--lengths", "40,64", "--steps", "2", "--work", str(tmp_path / "work"), "--out", str(out)]
    assert kv_drift.main(args) == 0
    (md,) = out.glob("*-kv-drift.md")
    text = md.read_text()
    assert text.splitlines()[2].startswith("Command: `bash ci/gpu/run.sh python bench/kv_drift.py --layers 8")
    for pair in ("int8 vs bf16", "fp8 vs bf16"):
        assert f"| {pair} | 40 |" in text and f"| {pair} | 64 |" in text
    doc = json.loads(md.with_suffix(".json").read_text())
    assert doc["failed"] == {} and all(p["failures"] == [] for p in doc["pairs"].values())
    # a deadline too close to start anything: every configuration skipped and recorded, exit status 1
    assert kv_drift.main(args + ["--deadline-s", "30", "--out", str(tmp_path / "late")]) == 1
    late = next((tmp_path / "late").glob("*.md")).read_text()
    assert "bf16: no result (skipped:" in late and "fp8: no result (skipped:" in late
    assert kv_drift.main(["bf16=nope:DCU_TRITON_ATTN:auto", "x=full:DCU_TRITON_ATTN:auto"]) == 2
