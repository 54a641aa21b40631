"""The device decides (issue #43), on the CPU: the tuned file (format, identity, bad input), the decisions taken from
variables, the file and the table, the startup checks that hand a failing kernel's launch kind to upstream's path, the
launch tables' layering (table < tuned file < variable) and the decision table. The kernels run in Triton's
interpreter at toy shapes; the engine-side hooks are in tests/test_dcu_triton_attn.py."""
import json
import logging
import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")
import triton_interp_compat  # noqa: E402,F401

from dcu import kernel_checks  # noqa: E402
from kernels.decode_attention import launch_params as decode_params  # noqa: E402
from kernels.kv_quant import cache_write  # noqa: E402
from kernels.tuning import decisions, tuned_file  # noqa: E402

IDENT = {"device": "cpu", "arch": "interpreter", "triton": "3.6.0", "torch": "2.13.0", "kernels": "k1"}
SHAPE = {"heads_q": 4, "heads_kv": 2, "head_dim": 32}


def test_kernel_checks_take_the_repositorys_kernels_this_file_reads():
    # dcu/ imported as the top-level `dcu` resolves the kernels as `kernels` (dcu/_kernels.py), whatever else is on the
    # path (the tests' tree has vllm.dcu_kernels): the decisions kernel_checks records are the ones this file reads
    assert kernel_checks._kernels()[-1] is decisions and kernel_checks._kernels()[3] is cache_write


@pytest.fixture
def tuned(tmp_path, monkeypatch):
    """A tuned file at VLLM_DCU_TUNED_FILE for this process's identity; ``write(doc)`` (re)writes it."""
    path = tmp_path / "tuned.json"
    monkeypatch.setenv("VLLM_DCU_TUNED_FILE", str(path))
    for var in ("VLLM_DCU_DECODE_ATTN", "VLLM_DCU_PREFILL_ATTN", "VLLM_DCU_KV_WRITE", "VLLM_DCU_TUNED",
                decode_params.ENV_VAR):
        monkeypatch.delenv(var, raising=False)
    ident = tuned_file.device_identity(torch.device("cpu"))

    def write(**sections):
        doc = tuned_file.new_doc(ident, {"name": "toy", "attention": SHAPE}, "quick")
        doc.update(sections)
        tuned_file.write(path, doc)
        decisions.reset()
        return doc

    write.path, write.identity = path, ident
    return write


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# --- the file ---------------------------------------------------------------------------------------------------

def test_identity_names_the_device_and_a_kernels_hash_of_the_shipped_files_only(tmp_path):
    ident = tuned_file.device_identity(torch.device("cpu"))
    assert set(ident) == set(tuned_file.IDENTITY_KEYS) and ident["arch"] == "interpreter"
    root = tmp_path / "k"
    (root / "sub").mkdir(parents=True)
    (root / "a.py").write_text("x = 1\n")
    (root / "sub" / "bench.py").write_text("bench\n")
    before = tuned_file.kernels_digest(root)
    (root / "sub" / "bench.py").write_text("another bench\n")  # not shipped: the same hash
    assert tuned_file.kernels_digest(tmp_path / "k") == before
    tuned_file._DIGEST.clear()
    (root / "a.py").write_text("x = 2\n")
    assert tuned_file.kernels_digest(root) != before


def test_written_file_loads_back_whole(tmp_path):
    doc = tuned_file.new_doc(IDENT, {"name": "toy", "attention": SHAPE}, "full")
    doc["launch"]["decode"] = {"kv16": {"BLOCK_N": 32}}
    doc["paths"]["decode.int8"] = {"use": "upstream", "ratio": 1.3, "why": "slower"}
    tuned_file.write(tmp_path / "t.json", doc)
    tf = tuned_file.load(tmp_path / "t.json", IDENT, pytest.fail)
    assert json.loads(tf.launch_override("decode")) == {"kv16": {"BLOCK_N": 32}}
    assert tf.path_entry("decode.int8", SHAPE)["use"] == "upstream"
    assert tf.path_entry("decode.int8", {**SHAPE, "heads_q": 8}) is None  # tuned for another attention shape
    assert tf.launch_override("prefill") is None


@pytest.mark.parametrize("content,why", [
    ("", "not valid JSON"),
    ('{"format": "vllm-dcu-tuned/1", "identity": {', "not valid JSON"),  # truncated
    ("[1, 2]", "not a JSON object"),
    (json.dumps({"format": "something-else/3"}), "format 'something-else/3'"),
    (json.dumps({**tuned_file.new_doc(IDENT, {}, "quick"), "extra": 1}), "unknown key(s) ['extra']"),
])
def test_a_corrupt_truncated_or_foreign_file_is_ignored_with_one_line(tmp_path, content, why):
    path = tmp_path / "t.json"
    path.write_text(content)
    lines = []
    assert tuned_file.load(path, IDENT, lines.append) is None
    assert len(lines) == 1 and str(path) in lines[0] and why in lines[0]


@pytest.mark.parametrize("change,named", [({"arch": "gfx936"}, "arch 'gfx936' (this device: 'interpreter')"),
                                          ({"triton": "3.1.0"}, "triton '3.1.0'"),
                                          ({"kernels": "old"}, "kernels 'old'"),
                                          ({"device": "K100_AI 64 CUs"}, "device 'K100_AI 64 CUs'")])
def test_a_file_made_for_another_device_or_build_is_ignored_naming_the_mismatch(tmp_path, change, named):
    tuned_file.write(tmp_path / "t.json", tuned_file.new_doc({**IDENT, **change}, {}, "quick"))
    lines = []
    assert tuned_file.load(tmp_path / "t.json", IDENT, lines.append) is None
    assert len(lines) == 1 and "made for" in lines[0] and named in lines[0]


def test_a_bad_entry_is_refused_naming_its_key_and_the_rest_is_kept(tmp_path):
    doc = tuned_file.new_doc(IDENT, {"attention": SHAPE}, "quick")
    doc["paths"] = {"decode.bf16": {"use": "ours", "ratio": 0.4, "why": "fast"},
                    "decode.int8": {"use": "ours", "speed": "fast"},
                    "prefill.bf16": {"use": "maybe"},
                    "decode.int4": {"use": "ours"}}
    doc["gemv"] = {"8x8:bfloat16": {"1": {"choice": "gpu"}}}
    (tmp_path / "t.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="paths.decode.int8: unknown key"):
        tuned_file.write(tmp_path / "u.json", doc)  # the writer refuses what the loader would drop
    assert not (tmp_path / "u.json").exists()
    lines = []
    tf = tuned_file.load(tmp_path / "t.json", IDENT, lines.append)
    assert set(tf.doc["paths"]) == {"decode.bf16"} and tf.gemv_entries() == {}
    assert len(lines) == 4
    assert any("paths.decode.int8: unknown key(s) ['speed']" in line for line in lines)
    assert any("paths.prefill.bf16.use must be one of ours, upstream, got 'maybe'" in line for line in lines)
    assert any("unknown launch kind 'decode.int4'" in line for line in lines)
    assert any("gemv.8x8:bfloat16: must hold the row buckets" in line for line in lines)


def test_an_unwritable_folder_leaves_no_file_and_no_temporary(tmp_path, monkeypatch):
    def broken(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(tuned_file.os, "replace", broken)
    with pytest.raises(OSError):
        tuned_file.write(tmp_path / "t.json", tuned_file.new_doc(IDENT, {}, "quick"))
    assert list(tmp_path.iterdir()) == []


# --- decisions -------------------------------------------------------------------------------------------------

def test_without_a_file_every_kind_is_ours_with_the_table_entry(tuned):
    assert decisions.decide("decode.bf16").why == "no tuned file: table entry"
    assert decisions.runs_ours("prefill.int8")


def test_the_file_decides_and_a_variable_overrides_it(tuned, monkeypatch):
    tuned(paths={"decode.bf16": {"use": "upstream", "ratio": 1.25, "why": "1 x 16K"},
                 "decode.int8": {"use": "ours", "ratio": 0.5, "why": "1 x 16K"}})
    assert not decisions.runs_ours("decode.bf16")
    assert decisions.decide("decode.bf16").why == "measured 1.25x upstream: 1 x 16K"
    tuned(paths={"decode.int8": {"use": "ours", "ratio": 0.5, "why": "measured 0.50x upstream at 1 x 16K"}})
    assert decisions.decide("decode.int8").why == "measured 0.50x upstream at 1 x 16K"  # the command's line, once
    tuned(paths={"decode.bf16": {"use": "upstream", "ratio": 1.25, "why": "1 x 16K"},
                 "decode.int8": {"use": "ours", "ratio": 0.5, "why": "1 x 16K"}})
    assert decisions.runs_ours("decode.int8")
    assert decisions.decide("prefill.bf16").why == "not in the tuned file tuned.json: table entry"
    decisions.reset()
    monkeypatch.setenv("VLLM_DCU_DECODE_ATTN", "1")
    assert decisions.runs_ours("decode.bf16") and decisions.decide("decode.bf16").forced
    decisions.reset()
    monkeypatch.setenv("VLLM_DCU_DECODE_ATTN", "0")
    assert not decisions.runs_ours("decode.int8") and decisions.decide("decode.int8").why == "VLLM_DCU_DECODE_ATTN=0"
    decisions.reset()
    monkeypatch.setenv("VLLM_DCU_DECODE_ATTN", "yes")
    with pytest.raises(ValueError, match="VLLM_DCU_DECODE_ATTN='yes': supported values are 1"):
        decisions.decide("decode.bf16")


def test_reading_can_be_switched_off(tuned, monkeypatch):
    tuned(paths={"decode.bf16": {"use": "upstream", "ratio": 1.25, "why": "x"}})
    monkeypatch.setenv("VLLM_DCU_TUNED", "0")
    assert decisions.runs_ours("decode.bf16") and decisions.active_file() is None


def test_a_failing_check_hands_the_kind_to_upstream_with_one_warning(tuned, caplog):
    def compile_error():
        raise RuntimeError("LLVM ERROR: cannot select\nsecond line")

    def wrong():
        raise decisions.MismatchError("max abs error 3")

    with caplog.at_level(logging.WARNING, logger="vllm.dcu.tuning"):
        assert decisions.check_at_start("decode.bf16", compile_error) is False
        assert decisions.check_at_start("prefill.fp8", wrong) is False
        assert decisions.check_at_start("decode.fp8", lambda: None) is True
    assert warnings_of(caplog) == [
        "vllm-dcu: decode.bf16: our kernel failed to compile or run: RuntimeError: LLVM ERROR: cannot select second "
        "line; unified attention runs instead",
        "vllm-dcu: prefill.fp8: our kernel differs from upstream: max abs error 3; unified attention runs instead"]
    assert not decisions.runs_ours("decode.bf16") and decisions.runs_ours("decode.fp8")
    assert decisions.check_at_start("decode.bf16", pytest.fail) is False  # decided: not checked again
    lines = decisions.table_lines()
    assert lines[0].startswith("tuned file: none")
    assert any(line.startswith("decode.bf16") and "upstream (unified attention): failed to compile" in line
               for line in lines)
    assert any(line.startswith("decode.fp8") and "ours: no tuned file: table entry (checked at start)" in line
               for line in lines)


def test_a_forced_kernel_that_fails_is_one_clear_error(tuned, monkeypatch):
    monkeypatch.setenv("VLLM_DCU_PREFILL_ATTN", "1")
    with pytest.raises(RuntimeError) as info:
        decisions.check_at_start("prefill.bf16", lambda: 1 / 0)
    assert str(info.value) == ("vllm-dcu: prefill.bf16 failed to compile or run: ZeroDivisionError: division by zero; "
                               "it was forced with VLLM_DCU_PREFILL_ATTN=1 (unset it to fall back to unified attention)")


def test_the_table_is_logged_once(tuned):
    lines = []
    decisions.decide("decode.bf16")
    assert decisions.log_table_once(lines.append) and not decisions.log_table_once(lines.append)
    assert len(lines) == 1 and "which kernels run on this device" in lines[0] and "decode.bf16" in lines[0]


# --- launch tables: table < tuned file < variable ----------------------------------------------------------------

def test_the_files_launch_override_applies_under_the_variable(tuned, monkeypatch, caplog):
    decode_params._CACHE.clear()
    base = decode_params.get_params("interpreter")
    assert base["kv16"]["BLOCK_N"] == 16
    tuned(launch={"decode": {"kv16": {"BLOCK_N": 32}, "max_splits": 4}})
    decode_params._CACHE.clear()
    entry = decode_params.get_params("interpreter")
    assert entry["kv16"]["BLOCK_N"] == 32 and entry["max_splits"] == 4
    monkeypatch.setenv(decode_params.ENV_VAR, '{"max_splits": 2}')
    entry = decode_params.get_params("interpreter")
    assert entry["kv16"]["BLOCK_N"] == 32 and entry["max_splits"] == 2  # the variable over the file
    monkeypatch.delenv(decode_params.ENV_VAR)
    assert decode_params.get_params("interpreter", override="")["kv16"]["BLOCK_N"] == 16  # benches: table only
    tuned(launch={"decode": {"kv16": {"BLOCK_N": 32, "tiles": 3}}})
    decode_params._CACHE.clear()
    with caplog.at_level(logging.WARNING, logger="vllm.dcu.tuning"):
        entry = decode_params.get_params("interpreter")
    assert entry["kv16"]["BLOCK_N"] == 16  # refused: the table's entry
    (line,) = warnings_of(caplog)
    assert "tuned file's launch.decode refused" in line and "'kv16' must be an object with keys from" in line


# --- the startup checks on the kernels (interpreter, toy shapes) -------------------------------------------------

@pytest.mark.parametrize("cache_dtype", ["auto", "int8_per_token_head", "fp8_per_token_head"])
def test_decode_check_passes_on_our_kernel(tuned, cache_dtype):
    assert kernel_checks.check_decode(4, 2, 32, torch.float16, cache_dtype, 16, "cpu") is True
    path = kernel_checks.path_name("decode", kernel_checks._kv_quant_of(cache_dtype))
    assert decisions.decide(path).checked and decisions.runs_ours(path)


def test_decode_check_catches_a_kernel_that_computes_something_else(tuned, monkeypatch, caplog):
    import kernels.decode_attention as pkg

    real = pkg.decode_attention

    def off_by_a_bit(q, *args, **kw):
        out = real(q, *args, **kw)
        out[0, 0, 0] += 0.5
        return out

    monkeypatch.setattr(pkg, "decode_attention", off_by_a_bit)
    rest = kernel_checks._kernels()[1:]
    monkeypatch.setattr(kernel_checks, "_kernels", lambda: (off_by_a_bit, *rest))
    with caplog.at_level(logging.WARNING, logger="vllm.dcu.tuning"):
        assert kernel_checks.check_decode(4, 2, 32, torch.float16, "auto", 16, "cpu") is False
    (line,) = warnings_of(caplog)
    assert line.startswith("vllm-dcu: decode.bf16: our kernel differs from upstream: batch 1: max abs error 0.5")




@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_kv_write_check_and_the_torch_write_it_falls_back_to(tuned, monkeypatch, kind):
    assert kernel_checks.check_kv_write(2, 32, torch.float16, f"{kind}_per_token_head", 16, "cpu") is True
    decisions.reset()

    real = cache_write.reshape_and_cache_per_token_head

    def broken(key, value, k_codes, *rest):
        real(key, value, k_codes, *rest)
        k_codes[1, 0, 0, 0] ^= 1  # one bit of the first written token

    monkeypatch.setattr(cache_write, "reshape_and_cache_per_token_head", broken)
    assert kernel_checks.check_kv_write(2, 32, torch.float16, f"{kind}_per_token_head", 16, "cpu") is False
    assert "cache bytes differ from the torch write" in decisions.decide(f"kv_write.{kind}").why
    # the engine's write now takes the torch path: what the kernel would have written, byte for byte
    from kernels.kv_quant import layout

    caches = [torch.zeros(layout.kv_cache_shape(3, 16, 2, 32), dtype=torch.uint8) for _ in range(2)]
    key, value = torch.randn(2, 5, 2, 32).half()
    slots = torch.tensor([16, 17, -1, 33, 20])
    cache_write.reshape_and_cache_routed(key, value, *layout.split_kv_cache(caches[0], 32, kind), slots, kind)
    monkeypatch.undo()
    cache_write.reshape_and_cache_per_token_head(key, value, *layout.split_kv_cache(caches[1], 32, kind), slots, kind)
    assert torch.equal(caches[0][1:], caches[1][1:])


def test_the_dcu_rehearsal_takes_the_dcu_entry_without_rocm_only_options(monkeypatch):
    """VLLM_DCU_EMULATE_ARCH on a CUDA GPU: the gfx936 entry, validated as the DCU's, minus the options CUDA's Triton
    refuses; the portable conversions and software fp8, as on the DCU."""
    from kernels import targets
    from kernels.fp8_e4m3 import use_software_fp8
    from kernels.prefill_attention import launch_params as prefill_params

    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setenv(targets.EMULATE_ENV, "gfx936")
    decisions.reset()
    monkeypatch.setenv("VLLM_DCU_TUNED", "0")
    assert targets.device_arch() == "gfx936" and use_software_fp8()
    for mod in (decode_params, prefill_params):
        mod._CACHE.clear()
        entry = mod.get_params("gfx936")
        assert "waves_per_eu" not in json.dumps(entry) and "matrix_instr_nonkdim" not in json.dumps(entry)
        assert mod.PARAMS["gfx936"]["kv16"]["waves_per_eu"] >= 1  # the table itself keeps them for the DCU
        mod._CACHE.clear()
    assert decode_params.get_params("gfx936")["kv16"]["BLOCK_N"] == decode_params.PARAMS["gfx936"]["kv16"]["BLOCK_N"]
    monkeypatch.setenv(targets.EMULATE_ENV, "gfx90a")
    with pytest.raises(ValueError, match="VLLM_DCU_EMULATE_ARCH='gfx90a': supported values are gfx936, gfx928"):
        targets.device_arch()
    decode_params._CACHE.clear()


# --- one format: a bench's suggestion is what the variables and the tuned file take --------------------------------

@pytest.mark.parametrize("family,target,change", [
    ("decode", "sm90", lambda e: e["kv8"].update(BLOCK_N=32) or e.update(programs_per_cu=3)),
    ("decode", "sm90", lambda e: e["kv8"].pop("gluon")),  # a dropped option becomes null
    ("decode", "gfx936", lambda e: e["kv16"].update(BLOCK_N=16, num_stages=1)),
    ("prefill", "gfx936", lambda e: e["kv8_short"].update(BLOCK_M=32)),
    ("gemv", "sm90", lambda e: e["rows"]["1"].update(num_warps=8)),
])
def test_a_suggestion_round_trips_through_the_variable_and_the_tuned_file(tuned, family, target, change):
    from kernels.tuning import suggest

    lp = suggest._launch_params(family)
    entry = json.loads(json.dumps(lp.PARAMS[target]))
    change(entry)
    override = suggest.as_override(family, target, entry)
    got = lp.get_params(target, override=json.dumps(override))  # the variable's path
    assert suggest._strip(got) == suggest._strip(entry)
    lines = suggest.suggestion_lines(family, target, entry)
    var = tuned_file.FAMILIES[family]
    assert lines[1].startswith(f"{var}='") and json.loads(lines[1][len(var) + 2:-1]) == override
    if target == "sm90" and family == "decode":  # the tuned file's path: launch.<family> under no variable
        tuned(launch={family: override})
        lp._CACHE.clear()
        assert suggest._strip(lp.get_params("sm90")) == suggest._strip(entry)
        lp._CACHE.clear()


def test_a_suggestion_the_format_cannot_express_is_reported_not_raised():
    from kernels.tuning import suggest

    entry = json.loads(json.dumps(decode_params.PARAMS["sm90"]))
    entry["kv16"].pop("num_warps")  # a required option cannot be dropped with null
    with pytest.raises(ValueError, match="cannot be written as VLLM_DCU_DECODE_PARAMS"):
        suggest.as_override("decode", "sm90", entry)
    fields, md = suggest.suggestion("decode", "sm90", entry)
    assert fields["suggested_override"] is None and "No suggestion" in md


@pytest.mark.parametrize("target", ["sm90", "gfx936", "gfx928"])
def test_every_sweep_candidate_of_the_tables_is_a_valid_override(target):
    """The tuning command's --full candidates (kernels/tuning/candidates.py) around each table entry are launch options
    the family's own parser accepts: a sweep spends its compiles on real candidates, not on refused ones."""
    from kernels.gemv import launch_params as gemv_params
    from kernels.prefill_attention import launch_params as prefill_params
    from kernels.tuning import candidates

    rocm = target.startswith("gfx")
    for lp, make, widths in ((decode_params, candidates.decode_candidates, ("kv16", "kv8")),
                             (prefill_params, candidates.prefill_candidates, ("kv16", "kv8", "kv8_short"))):
        for width in widths:
            cands = make(lp.PARAMS[target], width, rocm)
            assert 3 <= len(cands) <= 13  # the DCU's kv8: 13 (its own int8 options, sm90's measured ones)
            for label, override in cands:
                lp.get_params(target, override=json.dumps(override))  # raises naming the key if refused
    for bucket in gemv_params.ROW_BUCKETS:
        for table in ("rows", "silu_rows"):
            config = gemv_params.PARAMS[target][table][str(bucket)]
            for label, cfg in candidates.gemv_candidates(config, bucket):
                gemv_params.check_config(dict(cfg), f"{target} {table} {bucket}: {label}", rocm=rocm, rows=bucket,
                                         silu_mul=table == "silu_rows")


def test_the_dcu_sweep_tries_what_sm90s_measured_entries_turned_on():
    """The DCU's 8-bit Triton entry was chosen on paper without the options sm90's sweeps found (pages in an outer
    loop, even splits, int8 x int8 QK^T, splits rounded down): its --full sweep tries each alone and all together;
    sm90's entry, which has them, gets none of these."""
    from kernels.gemv import launch_params as gemv_params
    from kernels.tuning import candidates

    def labels(target):
        return {label: ov for label, ov in candidates.decode_candidates(decode_params.PARAMS[target], "kv8", True)}

    dcu = labels("gfx936")
    for key, value in candidates.KV8_MEASURED_OPTIONS.items():
        assert decode_params.PARAMS["gfx936"]["kv8"].get(key) != value
        assert dcu[f"{key} {value}"] == {"kv8": {key: value}}
    assert dcu["sm90's kv8 options"] == {"kv8": candidates.KV8_MEASURED_OPTIONS}
    dcu_int8 = decode_params.PARAMS["gfx936"]["kv8"]["int8"]  # the entry's own int8 options go along
    assert dcu["sm90's kv8 options, int8 2 stages"] == {"kv8": {**candidates.KV8_MEASURED_OPTIONS,
                                                                "int8": {**dcu_int8, "num_stages": 2}}}
    assert dcu["no int8 options"] == {"kv8": {"int8": None}}
    assert {k: decode_params.PARAMS["sm90"]["kv8"][k] for k in candidates.KV8_MEASURED_OPTIONS} == \
        candidates.KV8_MEASURED_OPTIONS
    assert not any(label.split()[0] in candidates.KV8_MEASURED_OPTIONS or label.startswith("sm90")
                   for label in labels("sm90"))
    # the GEMV's: the other warp count everywhere; at two rows on the dot path, the FMA launch that beat it on sm90
    two_rows = dict(candidates.gemv_candidates(gemv_params.PARAMS["gfx936"]["rows"]["2"], 2))
    assert gemv_params.PARAMS["gfx936"]["rows"]["2"]["DOT"] == 1
    assert two_rows["FMA, K_STAGES 4"]["DOT"] == 0 and two_rows["FMA, K_STAGES 4"]["K_STAGES"] == 4
    one_row = dict(candidates.gemv_candidates(gemv_params.PARAMS["gfx936"]["rows"]["1"], 1))
    assert {"8 warps", "4 warps"} & set(one_row) and not any(label.startswith("FMA") for label in one_row)


@pytest.mark.parametrize("cache_dtype,mirror", [("auto", None), ("int8_per_token_head", 0)])
def test_prefill_check_passes_on_our_kernel_and_catches_a_wrong_one(tuned, monkeypatch, caplog, cache_dtype, mirror):
    """The prefill warm-up's check (dcu/prefill_attention.warmup calls it on the GPU): a chunk over a page boundary and
    a decode row against the float32 reference; mirror 0: an 8-bit cache read directly."""
    kv_quant = kernel_checks._kv_quant_of(cache_dtype)
    args = (4, 2, 32, torch.float16, kv_quant, 16, "cpu", mirror)
    assert kernel_checks.check_prefill(*args) is True
    assert decisions.decide(kernel_checks.path_name("prefill", kv_quant)).checked
    decisions.reset()
    real = kernel_checks._kernels()

    def shifted(q, k, v, out, *a, **kw):
        real[1](q, k, v, out, *a, **kw)
        out[-1] += 1.0  # the decode row off by one

    monkeypatch.setattr(kernel_checks, "_kernels", lambda: (real[0], shifted, *real[2:]))
    with caplog.at_level(logging.WARNING, logger="vllm.dcu.tuning"):
        assert kernel_checks.check_prefill(*args) is False
    (line,) = warnings_of(caplog)
    assert "our kernel differs from upstream: warm-up batch: max abs error" in line
