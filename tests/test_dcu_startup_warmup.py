"""dcu/startup_warmup.py (patch 0009): what the profile-run and post-allocation warm-ups call, with stand-ins for the
Gated DeltaNet layer and the model runner (the H200 run that shows no compile at a first request is in
bench/results/2026-12-02-h200-e2e-offline-startup-warmup.md)."""
import types

import pytest
import torch

from dcu import startup_warmup as sw


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv(sw.ENV_VAR, raising=False)
    monkeypatch.setattr(sw, "_WARM_GDN", set())


def test_env_switch_takes_0_or_1_and_names_them_otherwise():
    assert sw.enabled({}) and sw.enabled({sw.ENV_VAR: "1"}) and not sw.enabled({sw.ENV_VAR: "0"})
    with pytest.raises(ValueError, match="supported values are 1 .default. and 0"):
        sw.enabled({sw.ENV_VAR: "yes"})


def test_gdn_lengths_start_with_a_full_chunk_then_the_short_bt_variants():
    assert sw.gdn_lengths(4096) == [4096, 32, 16]
    assert sw.gdn_lengths(8) == [64, 32, 16]  # a profile run shorter than one 64-token chunk still tunes BT 64


class FakeGDN:
    """What warm_gdn_prefill uses of Qwen3NextGatedDeltaNet: A_log, dt_bias, rearrange_mixed_qkv, get_state_dtype,
    get_state_shape, chunk_gated_delta_rule; records the calls."""

    heads_k, heads_v, dk, dv = 2, 4, 8, 8

    def __init__(self):
        self.A_log = torch.zeros(self.heads_v)
        self.dt_bias = torch.zeros(self.heads_v)
        self.rule_calls, self.upstream_calls = [], 0

    def rearrange_mixed_qkv(self, mixed_qkv):
        n = mixed_qkv.shape[0]
        q, k, v = torch.split(mixed_qkv, [self.heads_k * self.dk, self.heads_k * self.dk, self.heads_v * self.dv], -1)
        qk = [x.reshape(1, n, self.heads_k, self.dk).contiguous() for x in (q, k)]
        return qk[0], qk[1], v.reshape(1, n, self.heads_v, self.dv).contiguous()

    def get_state_dtype(self):
        return torch.bfloat16, torch.float32

    def get_state_shape(self):
        return (3, 2 * self.heads_k * self.dk + self.heads_v * self.dv), (self.heads_v, self.dv, self.dk)

    def chunk_gated_delta_rule(self, **kw):
        self.rule_calls.append(kw)

    def _warmup_prefill_kernels(self, mixed_qkv):
        self.upstream_calls += 1


def fake_gating(A_log, a, b, dt_bias):
    """fused_gdn_gating's outputs: g float32, beta in b's dtype, both [1, tokens, heads]."""
    return torch.zeros(1, *a.shape, dtype=torch.float32), torch.zeros(1, *b.shape, dtype=b.dtype)


def _inputs(layer, n, dtype=torch.bfloat16):
    width = 2 * layer.heads_k * layer.dk + layer.heads_v * layer.dv
    return (torch.randn(n, width).to(dtype), torch.randn(n, layer.heads_v).to(dtype),
            torch.randn(n, layer.heads_v).to(dtype))


def test_profile_run_warmup_calls_the_delta_rule_as_a_prefill_does():
    layer = FakeGDN()
    qkv, b, a = _inputs(layer, 256)
    assert sw.warm_gdn_prefill(layer, qkv, b, a, gating=fake_gating) is not None
    assert [c["q"].shape[1] for c in layer.rule_calls] == [256, 32, 16]
    for call in layer.rule_calls:
        n = call["q"].shape[1]
        # what _forward_core's prefill branch passes: int32 cu_seqlens (query_start_loc), g in float32, beta in the
        # model's dtype, an initial state of the state dtype, the final state asked for
        assert call["cu_seqlens"].dtype == torch.int32 and call["cu_seqlens"].tolist() == [0, n]
        assert call["g"].dtype == torch.float32 and call["beta"].dtype == torch.bfloat16
        assert call["initial_state"].dtype == torch.float32 and call["initial_state"].shape == (1, 4, 8, 8)
        assert call["output_final_state"] is True and call["use_qk_l2norm_in_kernel"] is True
        assert call["q"].is_contiguous() and call["v"].shape == (1, n, 4, 8)
    assert layer.upstream_calls == 0


def test_profile_run_warmup_runs_once_per_layer_shape_and_pads_a_short_run():
    layer = FakeGDN()
    qkv, b, a = _inputs(layer, 8)  # shorter than a 64-token chunk: new rows of the same dtype
    sw.warm_gdn_prefill(layer, qkv, b, a, gating=fake_gating)
    assert [c["q"].shape[1] for c in layer.rule_calls] == [64, 32, 16]
    assert all(c["q"].dtype == torch.bfloat16 for c in layer.rule_calls)
    assert sw.warm_gdn_prefill(layer, *_inputs(layer, 300), gating=fake_gating) is None  # the next layer: done
    assert len(layer.rule_calls) == 3
    sw.warm_gdn_prefill(layer, *_inputs(layer, 300, torch.float16), gating=fake_gating)  # another dtype: warmed
    assert len(layer.rule_calls) == 6


def test_profile_run_warmup_switched_off_runs_upstreams(monkeypatch):
    monkeypatch.setenv(sw.ENV_VAR, "0")
    layer = FakeGDN()
    assert sw.warm_gdn_prefill(layer, *_inputs(layer, 64), gating=fake_gating) is None
    assert layer.upstream_calls == 1 and layer.rule_calls == []


def test_rows_slices_the_profile_runs_tensor_or_makes_one_like_it():
    t = torch.arange(12, dtype=torch.float16).reshape(6, 2)
    assert sw._rows(t, 4).data_ptr() == t.data_ptr() and sw._rows(t, 4).shape == (4, 2)
    longer = sw._rows(t, 9)
    assert longer.shape == (9, 2) and longer.dtype == torch.float16


class FakeRunner:
    def __init__(self, backends=("DCU_TRITON_ATTN", "GDN_ATTN"), max_tokens=4096):
        self.attn_groups = [[types.SimpleNamespace(backend=types.SimpleNamespace(get_name=lambda n=n: n))]
                            for n in backends]
        self.max_num_tokens = max_tokens
        self.device = torch.device("cpu")
        self.dummy_runs, self.zeroed = [], []

    def _dummy_run(self, n, **kw):
        self.dummy_runs.append((n, kw))

    def _zero_block_ids(self, ids):
        self.zeroed.append(list(ids))


def test_first_request_warmup_runs_two_mixed_prefill_batches_and_the_block_zeroing():
    runner = FakeRunner()
    assert sw.warm_first_request(runner) is not None
    assert [n for n, _ in runner.dummy_runs] == [64, 67]  # a multiple of 16 and not
    for _, kw in runner.dummy_runs:
        assert kw == dict(force_attention=True, create_mixed_batch=True, skip_eplb=True, is_profile=True)
    assert runner.zeroed == [[0], [0, 0], [0] * 16]  # the null block, n_blocks 1 / other / multiple of 16


def test_first_request_warmup_fits_the_token_budget():
    assert sw.first_request_tokens(4096) == [64, 67]
    assert sw.first_request_tokens(50) == [50]
    assert sw.first_request_tokens(1) == [2]
    runner = FakeRunner(max_tokens=66)
    sw.warm_first_request(runner)
    assert [n for n, _ in runner.dummy_runs] == [64, 66]


def test_first_request_warmup_skips_backends_it_does_not_know_and_when_off(monkeypatch, caplog):
    runner = FakeRunner(backends=("FLASH_ATTN", "GDN_ATTN"))
    with caplog.at_level("INFO", logger="vllm.dcu.startup_warmup"):
        assert sw.warm_first_request(runner) is None
    assert runner.dummy_runs == [] and runner.zeroed == []
    assert "FLASH_ATTN" in caplog.text and "DCU_TRITON_ATTN" in caplog.text
    monkeypatch.setenv(sw.ENV_VAR, "0")
    runner = FakeRunner()
    assert sw.warm_first_request(runner) is None and runner.dummy_runs == []
