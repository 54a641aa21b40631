"""The decode GEMV's dispatch table (kernels/gemv/dispatch.py) without a GPU and without vLLM.

Timings are injected: ``measure(bucket) -> (triton_us, platform_us)``, ``warm(bucket)``. Covers the
VLLM_DCU_GEMV values and the bad-value error, the choice with its 1% hysteresis, the table kept in
the device's tuned file (hit skips timing, keyed by device and versions, atomic write, unreadable
files), graph capture and freezing.
"""
import json
import os

import pytest

from kernels.gemv import dispatch as d
from kernels.tuning import tuned_file

IDENT = {"device": "NVIDIA H200 132 CUs", "arch": "sm90", "torch": "2.11.0", "triton": "3.6.0", "kernels": "abc"}
KEY = d.ShapeKey(16384, 5120, "bfloat16")
KEY_SMALL = d.ShapeKey(96, 5120, "bfloat16", bias=True)


class Recorder:
    """measure/warm callables with scripted timings, counting calls."""

    def __init__(self, times):
        self.times = times  # bucket -> (triton_us, platform_us)
        self.measured, self.warmed = [], []

    def measure(self, b):
        self.measured.append(b)
        return self.times[b]

    def warm(self, b):
        self.warmed.append(b)


def make_table(tmp_path, mode="auto", ident=IDENT, logs=None):
    logs = [] if logs is None else logs
    return d.DispatchTable(mode, ident, path=tmp_path / "tuned.json", log=logs.append), logs


TIMES = {1: (40.0, 50.0), 2: (49.8, 50.0), 4: (60.0, 50.0), 8: (float("nan"), 50.0)}


@pytest.mark.parametrize("raw,mode", [(None, "auto"), ("", "auto"), ("auto", "auto"), ("Triton", "triton"),
                                      (" platform ", "platform"), ("off", "off")])
def test_mode_values(raw, mode):
    env = {} if raw is None else {d.ENV_MODE: raw}
    assert d.read_mode(env) == mode


def test_bad_mode_is_one_error_naming_the_allowed_values():
    with pytest.raises(ValueError) as info:
        d.read_mode({d.ENV_MODE: "fast"})
    msg = str(info.value)
    assert msg == "VLLM_DCU_GEMV='fast' is not one of auto, triton, platform, off"
    with pytest.raises(ValueError, match="VLLM_DCU_GEMV_SILU_MUL='yes' is not one of 0, 1"):
        d.read_silu_mul({d.ENV_SILU_MUL: "yes"})
    assert d.read_silu_mul({}) is True and d.read_silu_mul({d.ENV_SILU_MUL: "0"}) is False


def test_decide_keeps_the_platform_unless_triton_wins_by_more_than_one_percent():
    assert d.decide(40.0, 50.0) == "triton"
    assert d.decide(49.4, 50.0) == "triton"  # 1.2% faster
    assert d.decide(49.6, 50.0) == "platform"  # 0.8% faster: within the hysteresis
    assert d.decide(50.0, 50.0) == "platform"
    assert d.decide(float("nan"), 50.0) == "platform"
    assert d.decide(10.0, float("inf")) == "triton"


def test_row_buckets():
    assert [d.bucket_of(r) for r in range(0, 10)] == [None, 1, 2, 4, 4, 8, 8, 8, 8, None]


def test_auto_measures_every_bucket_once_and_picks_the_faster(tmp_path):
    tab, logs = make_table(tmp_path)
    rec = Recorder(TIMES)
    entry = tab.ensure(KEY, rec.measure, rec.warm)
    assert rec.measured == [1, 2, 4, 8]
    assert {b: e["choice"] for b, e in entry.items()} == {1: "triton", 2: "platform", 4: "platform", 8: "platform"}
    assert [tab.choice(KEY, r) for r in range(1, 10)] == ["triton"] + ["platform"] * 8
    tab.ensure(KEY, rec.measure, rec.warm)  # second sight: a lookup
    assert rec.measured == [1, 2, 4, 8]
    assert len(logs) == 1 and logs[0].startswith("dcu-gemv: 16384x5120:bfloat16 (measured): rows 1: triton 40.0 / "
                                                 "platform 50.0 us -> triton; rows 2:")


def test_unknown_shape_or_more_than_8_rows_is_the_platform(tmp_path):
    tab, _ = make_table(tmp_path)
    assert tab.choice(KEY, 1) == "platform"
    tab.ensure(KEY, Recorder({b: (1.0, 50.0) for b in d.BUCKETS}).measure, lambda b: None)
    assert tab.choice(KEY, 8) == "triton" and tab.choice(KEY, 9) == "platform" and tab.choice(KEY, 0) == "platform"


def test_cache_hit_skips_timing_and_warms_only_the_triton_buckets(tmp_path):
    tab, _ = make_table(tmp_path)
    tab.ensure(KEY, Recorder(TIMES).measure, lambda b: None)
    assert tab.path.exists()
    tab2, logs = make_table(tmp_path)
    rec = Recorder({})
    entry = tab2.ensure(KEY, rec.measure, rec.warm)
    assert rec.measured == [] and rec.warmed == [1]
    assert entry == tab.entries[KEY.id]
    assert "(tuned file tuned.json)" in logs[0]


def test_cache_is_keyed_by_device_and_versions(tmp_path):
    tab, _ = make_table(tmp_path)
    tab.ensure(KEY, Recorder(TIMES).measure, lambda b: None)
    for change in ({"device": "AMD BW1000 80 CUs"}, {"triton": "3.7.0"}, {"kernels": "def"}):
        ident = {**IDENT, **change}
        other, logs = make_table(tmp_path, ident=ident)
        rec = Recorder(TIMES)
        other.ensure(KEY, rec.measure, rec.warm)
        assert rec.measured == [1, 2, 4, 8]  # a file for another identity is not used ...
        assert any("ignoring tuned file" in line and "made for" in line for line in logs)
        assert json.loads(other.path.read_text())["identity"] == ident  # ... and is replaced by this device's
    doc = json.loads(tab.path.read_text())
    assert tuned_file.check_doc(doc) == [] and set(doc["gemv"]) == {KEY.id}


def test_the_table_lives_in_the_tuned_file_beside_the_other_sections(tmp_path):
    doc = tuned_file.new_doc(IDENT, {"name": "toy"}, "quick")
    doc["paths"]["decode.bf16"] = {"use": "ours", "ratio": 0.5, "why": "measured"}
    tuned_file.write(tmp_path / "tuned.json", doc)
    tab, _ = make_table(tmp_path)
    tab.ensure(KEY, Recorder(TIMES).measure, lambda b: None)
    after = json.loads(tab.path.read_text())
    assert after["paths"] == doc["paths"] and set(after["gemv"]) == {KEY.id}  # merged, nothing else lost


def test_shapes_of_two_processes_merge_in_one_file(tmp_path):
    a, _ = make_table(tmp_path)
    b, _ = make_table(tmp_path)
    a.ensure(KEY, Recorder(TIMES).measure, lambda _: None)
    b.ensure(KEY_SMALL, Recorder(TIMES).measure, lambda _: None)
    assert set(json.loads(a.path.read_text())["gemv"]) == {KEY.id, KEY_SMALL.id}


def test_cache_write_is_atomic(tmp_path, monkeypatch):
    tab, _ = make_table(tmp_path)
    tab.ensure(KEY, Recorder(TIMES).measure, lambda _: None)
    before = tab.path.read_bytes()

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(tuned_file.os, "replace", broken_replace)
    tab2, logs = make_table(tmp_path)
    tab2.ensure(KEY_SMALL, Recorder(TIMES).measure, lambda _: None)  # measured; the save fails
    assert tab2.choice(KEY_SMALL, 1) == "triton"
    assert tab.path.read_bytes() == before  # the old table is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == [tab.path.name]  # no temporary file left
    assert any("could not write the tuned file" in line for line in logs)


def test_the_tuned_file_is_written_through_a_temporary_file(tmp_path, monkeypatch):
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append((os.path.dirname(src), os.path.basename(src), dst))
        real_replace(src, dst)

    monkeypatch.setattr(tuned_file.os, "replace", spy)
    path = tmp_path / "sub" / "t.json"
    tuned_file.write(path, tuned_file.new_doc(IDENT, {}, "quick"))
    assert json.loads(path.read_text())["identity"] == IDENT
    (folder, tmp_name, dst), = seen
    assert folder == str(path.parent) and tmp_name.startswith(".t.json.") and dst == path


@pytest.mark.parametrize("content", ["{not json", json.dumps({"identity": {"device": "x"}, "entries": {}}),
                                     json.dumps({**tuned_file.new_doc(IDENT, {}, "quick"),
                                                 "gemv": {KEY.id: {"1": {"choice": "gpu"}}}})])
def test_unreadable_or_foreign_cache_is_measured_again(tmp_path, content):
    tab, logs = make_table(tmp_path)
    tab.path.parent.mkdir(parents=True, exist_ok=True)
    tab.path.write_text(content)
    rec = Recorder(TIMES)
    tab.ensure(KEY, rec.measure, rec.warm)
    assert rec.measured == [1, 2, 4, 8]
    assert json.loads(tab.path.read_text())["identity"] == IDENT


def test_forced_modes_do_not_time(tmp_path):
    tab, logs = make_table(tmp_path, mode="triton")
    rec = Recorder({})
    tab.ensure(KEY, rec.measure, rec.warm)
    assert rec.measured == [] and rec.warmed == [1, 2, 4, 8]  # every bucket compiled now, not while serving
    assert all(tab.choice(KEY, r) == "triton" for r in range(1, 9)) and tab.choice(KEY, 9) == "platform"
    tab, logs = make_table(tmp_path, mode="platform")
    tab.ensure(KEY, rec.measure, rec.warm)
    assert rec.warmed == [1, 2, 4, 8] and all(tab.choice(KEY, r) == "platform" for r in range(1, 9))
    assert not list(tmp_path.glob("*.json"))  # nothing measured, nothing cached
    with pytest.raises(ValueError, match="not one of"):
        d.DispatchTable("fast", IDENT, path=tmp_path / "t.json")


def test_no_timing_during_graph_capture_or_after_freeze(tmp_path):
    tab, logs = make_table(tmp_path)
    rec = Recorder(TIMES)
    tab.ensure(KEY, rec.measure, rec.warm, capturing=True)
    assert rec.measured == [] and rec.warmed == [] and tab.choice(KEY, 1) == "platform"
    assert "first seen during CUDA/HIP graph capture" in logs[-1]
    tab.ensure(KEY_SMALL, rec.measure, rec.warm)  # before the freeze: measured
    tab.freeze()
    assert "table complete (auto): 2 shapes, the Triton GEMV in 1 of 8" in logs[-1]
    other = d.ShapeKey(5120, 17408, "bfloat16")
    tab.ensure(other, rec.measure, rec.warm)
    assert rec.measured == [1, 2, 4, 8] and tab.choice(other, 1) == "platform"
    assert "first seen after the warm-up" in logs[-1]
    assert set(json.loads(tab.path.read_text())["gemv"]) == {KEY_SMALL.id}  # only measured shapes are cached


def test_freeze_reports_the_memory_that_measuring_left_on_the_device(tmp_path, monkeypatch):
    """The H100's start without a tuned file sized 1.6% fewer KV blocks than one with it; the measurement runs before
    vLLM sizes the KV cache, so the table's summary says what it grew: memory outside torch's allocator and torch's
    allocated peak (a start from the file measures nothing and says nothing; without a GPU nothing is said)."""
    marks = iter([(100 << 20, 500 << 20), (164 << 20, 700 << 20), (164 << 20, 700 << 20), (180 << 20, 650 << 20)])
    monkeypatch.setattr(d, "memory_mark", lambda: next(marks))
    tab, logs = make_table(tmp_path)
    rec = Recorder(TIMES)
    tab.ensure(KEY, rec.measure, rec.warm)
    tab.ensure(KEY_SMALL, rec.measure, rec.warm)
    tab.freeze()
    assert logs[-1].endswith("measuring grew device memory outside torch's allocator by 80 MiB and torch's "
                             "allocated peak by 200 MiB")
    cached, clogs = make_table(tmp_path)  # the same file: nothing measured
    monkeypatch.setattr(d, "memory_mark", lambda: pytest.fail("a start from the file must not look"))
    cached.ensure(KEY, rec.measure, rec.warm)
    cached.freeze()
    assert "measuring grew" not in clogs[-1]
    monkeypatch.setattr(d, "memory_mark", lambda: None)  # no GPU
    cpu, cpu_logs = make_table(tmp_path / "cpu")
    cpu.ensure(KEY, rec.measure, rec.warm)
    cpu.freeze()
    assert cpu_logs[-1].endswith(f"tuned file {cpu.path}")


def test_fallback_records_the_platform(tmp_path):
    tab, logs = make_table(tmp_path)
    tab.fallback(KEY, "measuring failed (RuntimeError: boom)")
    assert tab.choice(KEY, 1) == "platform" and "boom" in logs[-1]


def test_shape_key_names():
    assert KEY.id == "16384x5120:bfloat16"
    assert d.ShapeKey(34816, 5120, "float16", True, True).id == "silu_mul:34816x5120:float16:bias"


def test_l2_copies():
    mib = 1 << 20
    assert d.l2_copies(254 * mib, 50 * mib) == 1
    assert d.l2_copies(100 * mib, 50 * mib) == 1
    assert d.l2_copies(63 * mib, 50 * mib) == 2
    assert d.l2_copies(10 * mib, 50 * mib) == 10
    assert d.l2_copies(mib, 50 * mib) == 64  # capped


def test_cache_dir_variables(tmp_path):
    assert tuned_file.cache_dir({"VLLM_DCU_CACHE": str(tmp_path)}) == tmp_path  # the build's cache variable
    assert tuned_file.cache_dir({}).parts[-2:] == (".cache", "vllm-dcu")
    assert tuned_file.default_path(IDENT, {"VLLM_DCU_CACHE": str(tmp_path)}) == \
        tmp_path / "tuned" / "sm90-nvidia-h200-132-cus.json"
    old = tmp_path / "old"
    assert tuned_file.default_path(IDENT, {"VLLM_DCU_GEMV_CACHE_DIR": str(old)}).parent == old / "tuned"  # still read
    assert tuned_file.default_path(IDENT, {"VLLM_DCU_GEMV_CACHE_DIR": str(old), "VLLM_DCU_CACHE": str(tmp_path)}) \
        .parent == tmp_path / "tuned"
    assert tuned_file.default_path(IDENT, {"VLLM_DCU_TUNED_FILE": str(tmp_path / "x.json")}) == tmp_path / "x.json"


def test_a_variable_for_the_launch_options_keeps_the_file_out(tmp_path):
    tab, _ = make_table(tmp_path)
    tab.ensure(KEY, Recorder(TIMES).measure, lambda b: None)
    other = d.DispatchTable("auto", IDENT, path=tab.path, log=lambda line: None, use_file=False)
    rec = Recorder(TIMES)
    other.ensure(KEY_SMALL, rec.measure, rec.warm)
    other.ensure(KEY, rec.measure, rec.warm)
    assert rec.measured == [1, 2, 4, 8] * 2  # timed with the variable's options, not read from the file
    assert set(json.loads(tab.path.read_text())["gemv"]) == {KEY.id}  # and not written into it


def test_summary_lines_name_the_side_and_ratio(tmp_path):
    tab, _ = make_table(tmp_path)
    tab.ensure(KEY, Recorder(TIMES).measure, lambda b: None)
    tab.fallback(KEY_SMALL, "measuring failed (RuntimeError: boom)")
    lines = tab.summary_lines()
    assert lines[0] == ("gemv 16384x5120:bfloat16  1 row ours 0.80x, 2 rows platform 1.00x, 4 rows platform 1.20x, "
                        "8 rows platform (measured at start)")
    assert lines[1].startswith("gemv 96x5120:bfloat16:bias  1 row platform") and "boom" in lines[1]
