"""dcu/scheduler/ (patch 0004's code) alone, without vLLM: the presets and option checks, the step-time model, and
the budget policy's arithmetic on stand-in requests. The policy inside vLLM's real scheduler is
tests/test_scheduler_dcu.py."""
from __future__ import annotations

import math
import random
import types

import pytest

from dcu.scheduler import budget, options, step_model
from dcu.scheduler.budget import TpotBudget


# ------------------------------------------------------------------------------------------ options

def _args(**kw):
    base = dict(scheduler_preset=None, max_num_seqs=None, max_num_batched_tokens=None, scheduler_tpot_target_ms=None)
    return types.SimpleNamespace(**{**base, **kw})


def test_preset_fills_only_what_the_user_left_unset():
    a = _args(scheduler_preset="16k-32k", max_num_seqs=7)
    options.apply_scheduler_preset(a)
    assert (a.max_num_seqs, a.max_num_batched_tokens, a.scheduler_tpot_target_ms) == (7, 8192, 150.0)
    a = _args()
    options.apply_scheduler_preset(a)
    assert (a.max_num_seqs, a.max_num_batched_tokens, a.scheduler_tpot_target_ms) == (None, None, None)
    with pytest.raises(ValueError, match="unknown scheduler_preset 'x'; supported: 4k-8k, 8k-16k, 16k-32k"):
        options.apply_scheduler_preset(_args(scheduler_preset="x"))


def test_presets_follow_the_documented_rule():
    """docs/scheduler.md: targets of about 5x the 64-layer decode step (~20 ms on an H200), longer tiers fewer
    sequences; every preset passes the startup checks."""
    p = options.SCHEDULER_PRESETS
    assert list(p) == ["4k-8k", "8k-16k", "16k-32k"]
    assert [x.tpot_target_ms for x in p.values()] == sorted(x.tpot_target_ms for x in p.values())
    assert all(90 <= x.tpot_target_ms <= 160 for x in p.values())
    assert [x.max_num_seqs for x in p.values()] == sorted((x.max_num_seqs for x in p.values()), reverse=True)
    for x in p.values():
        options.check_scheduler_options(_config(target=x.tpot_target_ms, max_batched=x.max_num_batched_tokens))


def _config(target=None, floor=0, when="kv-pressure", max_batched=4096, chunked=True):
    return types.SimpleNamespace(scheduler_tpot_target_ms=target, scheduler_min_prefill_tokens=floor,
                                 scheduler_tpot_cap_when=when, max_num_batched_tokens=max_batched,
                                 enable_chunked_prefill=chunked)


@pytest.mark.parametrize("kw, message", [
    (dict(target=0), "scheduler_tpot_target_ms must be a finite number > 0"),
    (dict(target=math.nan), "scheduler_tpot_target_ms must be a finite number > 0"),
    (dict(target="fast"), "scheduler_tpot_target_ms must be a finite number > 0"),
    (dict(floor=512), "scheduler_min_prefill_tokens only applies with scheduler_tpot_target_ms"),
    (dict(target=30, floor=-1), "must be >= 0"),
    (dict(target=30, floor=5000), "must not exceed max_num_batched_tokens (4096)"),
    (dict(target=30, chunked=False), "needs chunked prefill"),
    (dict(when="sometimes"), "unknown scheduler_tpot_cap_when 'sometimes'; supported: kv-pressure, always"),
])
def test_option_checks_name_the_option_and_the_rule(kw, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        options.check_scheduler_options(_config(**kw))


def test_option_checks_accept_the_default_and_a_valid_target():
    options.check_scheduler_options(_config())
    options.check_scheduler_options(_config(target=30, floor=4096, when="always"))


# ------------------------------------------------------------------------------------------ step-time model

def test_features_are_scaled_near_one_and_mark_steps_with_prefill():
    x = step_model.step_features(2048, 32, 3 << 20, 0.0)
    assert x == (1.0, 2.0, 0.5, 3.0, 0.0, 0.0)
    assert step_model.step_features(1, 1, 0, 1 << 26)[4:] == (1.0, 1.0)
    assert step_model.step_features(1, 1, 0, 0.0, has_prefill=True)[5] == 1.0


def test_cholesky_solve_matches_a_known_system():
    a = [[4.0, 2.0, 0.6], [2.0, 5.0, 1.0], [0.6, 1.0, 3.0]]
    want = [1.0, -2.0, 0.5]
    b = [sum(a[i][j] * want[j] for j in range(3)) for i in range(3)]
    assert step_model.solve_spd(a, b) == pytest.approx(want, rel=1e-12)


def test_step_time_model_recovers_a_linear_device_and_shrugs_off_an_outlier():
    rng = random.Random(0)
    truth = [6.0, 3.0, 1.5, 9.0, 4.0, 7.0]  # ms per unit of each scaled feature (the last: step has prefill)
    model = step_model.StepTimeModel()
    xs = []
    for _ in range(200):
        prefill = rng.random() < 0.5
        x = step_model.step_features(rng.randint(1, 8192), rng.randint(1, 128), rng.randint(0, 3 << 20),
                                     rng.randint(1, 1 << 27) if prefill else 0)
        xs.append(x)
        model.observe(x, float(sum(c * v for c, v in zip(truth, x))) + rng.gauss(0, 0.1), outlier_ms=10.0)
    probe = xs[-1]
    want = float(sum(c * v for c, v in zip(truth, probe)))
    assert model.predict(probe) == pytest.approx(want, rel=0.02)
    assert model.coef[5] == pytest.approx(7.0, abs=0.5)
    assert model.resid_std < 1.0
    model.observe(probe, 50 * want, outlier_ms=10.0)  # one stalled step
    assert model.predict(probe) == pytest.approx(want, rel=0.1)


def test_step_time_model_keeps_slopes_non_negative():
    """A device whose time falls with the request count (noise, or a feature that does not matter) must not
    make the prediction fall as a batch grows: that slope is dropped and the rest refitted."""
    model = step_model.StepTimeModel()
    rng = random.Random(1)
    for _ in range(100):
        x = step_model.step_features(rng.randint(1, 4096), rng.randint(1, 64), 0, 0)
        model.observe(x, 5.0 + 3.0 * x[1] - 1.0 * x[2], outlier_ms=10.0)
    assert all(c >= 0 for c in model.coef[1:]) and model.coef[2] == 0.0
    assert model.coef[1] > 0


# ------------------------------------------------------------------------------------------ budget policy

def _req(prompt, computed, out=0, max_tokens=100, placeholders=0, rid="r"):
    return types.SimpleNamespace(request_id=rid, num_prompt_tokens=prompt, num_tokens=prompt + out,
                                 num_computed_tokens=computed, num_output_tokens=out, max_tokens=max_tokens,
                                 num_output_placeholders=placeholders, is_prefill_chunk=False,
                                 num_tokens_with_spec=prompt + out)


def _budget(align=0, floor=0, max_tokens=4096, target=30.0, waiting=()):
    sched = types.SimpleNamespace(max_num_scheduled_tokens=max_tokens, need_mamba_block_aligned_split=bool(align),
                                  cache_config=types.SimpleNamespace(block_size=align or 16),
                                  waiting=list(waiting), skipped_waiting=[], kv_cache_manager=None)
    return TpotBudget(sched, target, floor)


def test_prefilling_and_final_token_tests_follow_the_request_counters():
    assert budget.is_prefilling(_req(1000, 500))
    assert not budget.is_prefilling(_req(1000, 1000, out=1))
    assert budget.is_prefilling(types.SimpleNamespace(**{**vars(_req(1000, 1000, out=1)), "is_prefill_chunk": True}))
    # async scheduling: the last token of max_tokens 3 is already in flight
    assert budget.final_token_in_flight(_req(100, 102, out=2, max_tokens=3, placeholders=1))
    assert not budget.final_token_in_flight(_req(100, 101, out=1, max_tokens=3, placeholders=1))


@pytest.mark.parametrize("align, floor, want_floor, want_quantum", [
    (0, 0, TpotBudget.DEFAULT_FLOOR, 16), (0, 600, 600, 16), (784, 0, 784, 784), (784, 900, 1568, 784),
    (0, 9000, 4096, 16),
])
def test_floor_and_quantum_follow_align_mode_and_the_token_budget(align, floor, want_floor, want_quantum):
    b = _budget(align=align, floor=floor)
    assert (b.floor, b.quantum, b.align_block) == (want_floor, want_quantum, align)


def test_output_allowance_is_the_prior_until_enough_requests_finished_then_their_quantile():
    b = _budget()
    assert b.output_allowance() == TpotBudget.OUTPUT_PRIOR
    b._out_lens.extend([100] * (TpotBudget.OUTPUT_MIN_SAMPLES - 1))
    assert b.output_allowance() == TpotBudget.OUTPUT_PRIOR
    b._out_lens.extend([100, 300])
    assert b.output_allowance() == 100  # one long answer in nine does not move the 0.9 quantile
    b._out_lens.extend([300, 300])
    assert b.output_allowance() == 300  # three in eleven do
    assert len(b._out_lens) <= TpotBudget.OUTPUT_WINDOW


def test_no_sliver_takes_a_short_tail_with_the_chunk_before_it():
    b = _budget()
    head = _req(1000, 400)  # 600 left
    assert b._no_slivers(560, head, room=2048, more_prefills=False) == 600  # 40 left would be a sliver
    assert b._no_slivers(500, head, room=2048, more_prefills=False) == 500  # 100 left: fine
    assert b._no_slivers(560, head, room=580, more_prefills=False) == 560  # the tail does not fit the room


def test_no_sliver_leaves_room_for_the_next_prefill_beside_a_tail():
    tail = _req(1000, 990)  # 10 tokens left
    assert _budget()._no_slivers(256, tail, room=2048, more_prefills=True) == 256
    assert _budget()._no_slivers(16, tail, room=2048, more_prefills=True) == 10 + TpotBudget.MIN_SLIVER
    assert _budget(align=784)._no_slivers(784, tail, room=4096, more_prefills=True) == 10 + 784


def test_cap_starts_at_the_floor_and_then_grows_at_most_by_the_growth_factor():
    b = _budget(target=30.0)
    head = _req(20000, 0)
    assert b._prefill_cap(4096, [_req(100, 100, out=1, rid="d")], [head]) == b.floor  # no model yet
    for _ in range(20):  # a device where prefill is cheap: the model allows the whole budget
        b.model.observe(step_model.step_features(2048, 2, 0, 1e6), 5.0, outlier_ms=10.0)
        b.model.observe(step_model.step_features(64, 2, 0, 0), 4.0, outlier_ms=10.0)
    b.last_cap = 512
    assert b._prefill_cap(4096, [_req(100, 100, out=1, rid="d")], [head]) == int(TpotBudget.GROWTH * 512)


def test_without_block_tables_the_kv_gate_counts_as_pressure():
    b = _budget()
    b.scheduler.kv_cache_manager = types.SimpleNamespace(coordinator=None)
    assert b.kv_oversubscribed([_req(100, 100, out=1)], None) is True


def test_budget_is_made_only_when_a_target_is_set():
    sched = _budget().scheduler
    sched.scheduler_config = types.SimpleNamespace(scheduler_tpot_target_ms=None)
    assert budget.make_tpot_budget(sched) is None
    sched.scheduler_config = types.SimpleNamespace(scheduler_tpot_target_ms=45.0, scheduler_min_prefill_tokens=0,
                                                   scheduler_tpot_cap_when="always")
    b = budget.make_tpot_budget(sched)
    assert isinstance(b, TpotBudget) and (b.target_ms, b.cap_when) == (45.0, "always")
