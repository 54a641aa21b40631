"""The tuning command ``python -m vllm.dcu.tune`` (dcu/tune/) in Triton's CPU interpreter at toy shapes: the file it
writes (the loader accepts it for this device; paths, launch overrides and the GEMV table as expected), the sweep's
choice of a launch override, injected kernel failures and wrong outputs deciding "upstream" with their reason, and
bad input (one error line, exit 2, no file). The kernels are imported through the patched tree (vllm.dcu_kernels),
as the command imports them."""
import json
import os
import subprocess
import sys

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
import triton_interp_compat  # noqa: E402,F401

from dcu.tune import shapes  # noqa: E402

TOY = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
       "intermediate_size": 32, "vocab_size": 64}


@pytest.fixture(scope="module")
def tune(vllm_tree):
    from vllm.dcu.tune import __main__ as cli

    return cli


def _config(tmp_path, doc=TOY):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    return path


def _load(path):
    from vllm.dcu_kernels.tuning import tuned_file

    warnings = []
    loaded = tuned_file.load(path, tuned_file.device_identity(torch.device("cpu")), warnings.append)
    assert loaded is not None and not warnings, warnings
    return loaded.doc


@pytest.fixture(scope="module")
def quick_run(tune, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("quick")
    out = tmp / "tuned.json"
    rc = tune.main(["--model-config", str(_config(tmp)), "--quick", "--out", str(out)])
    return rc, out


def test_quick_writes_a_file_the_loader_accepts_with_every_launch_kind(quick_run, capsys):
    from vllm.dcu_kernels.gemv.dispatch import ShapeKey
    from vllm.dcu_kernels.tuning import tuned_file

    rc, out = quick_run
    assert rc == 0
    doc = _load(out)
    assert doc["tune"]["mode"] == "quick" and set(doc["tune"]["phases"]) == {"decode", "prefill", "gemv", "kv_write"}
    assert doc["model"]["attention"] == {"heads_q": 4, "heads_kv": 2, "head_dim": 32}
    assert set(doc["paths"]) == set(tuned_file.PATHS)
    for name, entry in doc["paths"].items():
        assert entry["use"] in tuned_file.USES and entry["why"], name
        # the interpreter's kernels run and match upstream: every decision is a measurement
        assert entry["why"].startswith("measured ") and entry["ratio"] > 0, (name, entry)
        assert (entry["use"] == "ours") == (entry["ratio"] < 1), (name, entry)
    assert doc["launch"] == {}  # --quick: the table's entries
    ids = [ShapeKey(n, k, "bfloat16", False, silu).id for _, n, k, silu in shapes.from_config(
        out.parent / "config.json").gemms]
    assert sorted(doc["gemv"]) == sorted(ids) == sorted(doc["model"]["gemv"])
    for per_bucket in doc["gemv"].values():
        assert set(per_bucket) == {"1", "2", "4", "8"}
        for e in per_bucket.values():
            assert e["choice"] in ("triton", "platform") and e["platform_us"] > 0 and e["triton_us"] > 0


def test_full_keeps_the_faster_candidate_as_the_launch_override(tune, tmp_path, monkeypatch):
    """A tiny --full: one candidate per width (and an invalid one, skipped); a timer under which a launch with the
    candidate's key runs faster, so the override carries exactly that key."""
    from vllm.dcu.tune import sweep
    from vllm.dcu_kernels.tuning import candidates

    monkeypatch.setattr(candidates, "decode_candidates", lambda entry, w, rocm: [
        ("2 warps", {w: {"num_warps": 2}}), ("bad", {w: {"BLOCK_N": 3}})])
    monkeypatch.setattr(candidates, "prefill_candidates", lambda entry, w, rocm: [])
    monkeypatch.setattr(candidates, "gemv_candidates", lambda cfg, b: [])
    real = sweep.time_us

    def timer(calls, copies=1, reps=10):
        t = real(calls, copies, reps)
        fast = '"num_warps": 2' in os.environ.get("VLLM_DCU_DECODE_PARAMS", "")
        return {name: (1.0 if fast else 2.0) if name == "ours" else 3.0 for name in t}

    monkeypatch.setattr(sweep, "time_us", timer)
    out = tmp_path / "tuned.json"
    assert tune.main(["--model-config", str(_config(tmp_path)), "--full", "--out", str(out)]) == 0
    doc = _load(out)
    assert doc["tune"]["mode"] == "full"
    assert doc["launch"] == {"decode": {"kv16": {"num_warps": 2}, "kv8": {"num_warps": 2}}}
    sweeps = [r for r in doc["rows"] if r.get("phase") == "decode" and "sweep" in r]
    assert {(r["sweep"], r["candidate"]) for r in sweeps} == {(w, c) for w in ("kv16", "kv8")
                                                              for c in ("table", "2 warps", "bad")}
    assert all("BLOCK_N must be a power of two" in r["skipped"] for r in sweeps if r["candidate"] == "bad")
    for path in ("decode.bf16", "decode.int8", "decode.fp8"):
        assert doc["paths"][path]["use"] == "ours" and doc["paths"][path]["ratio"] == pytest.approx(1 / 3, abs=1e-4)
        assert doc["paths"][path]["why"].endswith("chosen launch")


def _decode_sides(monkeypatch, kernel):
    from vllm.dcu.tune import attention, report

    monkeypatch.setattr(attention, "decode_attention", kernel)
    cases = shapes.Cases(decode=((2, 40),), prefill=(), prefill_short=(), kv_write=())
    model = shapes.ModelShapes("toy", 4, 2, 32, {"bf16": 16, "fp8": 16, "int8": 16}, ())
    rows = []
    sides, override = attention.run("decode", model, cases, torch.device("cpu"), False, rows, print)
    return {s.path: report.decide(s) for s in sides}, rows


def test_a_kernel_that_fails_to_compile_decides_upstream(tune, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("injected: out of resources: shared memory\nsecond line")

    paths, _ = _decode_sides(monkeypatch, broken)
    for name in ("decode.bf16", "decode.int8", "decode.fp8"):
        assert paths[name] == {"use": "upstream", "ratio": None,
                               "why": "failed to compile: RuntimeError: injected: out of resources: shared memory "
                                      "second line"}


def test_a_kernel_with_a_wrong_output_decides_upstream(tune, monkeypatch):
    from vllm.dcu.tune import attention

    real = attention.decode_attention

    def wrong(*args, **kwargs):
        return real(*args, **kwargs).add_(0.25)

    paths, rows = _decode_sides(monkeypatch, wrong)
    for name in ("decode.bf16", "decode.int8", "decode.fp8"):
        assert paths[name]["use"] == "upstream" and paths[name]["ratio"] is None
        # the startup check's comparison and wording (dcu/kernel_checks.compare), the case first
        assert paths[name]["why"].startswith("differs from upstream: 2 x 40: max abs error 0.25"), paths[name]
        assert paths[name]["why"].endswith("(limits 0.04, 0.01)")


def test_a_kv_write_with_a_wrong_byte_decides_upstream(tune, monkeypatch):
    from vllm.dcu.tune import kv_write, report

    real = kv_write.reshape_and_cache_per_token_head

    def wrong(key, value, k_codes, *rest):
        real(key, value, k_codes, *rest)
        k_codes[0, 0, 0, :1] ^= 1

    monkeypatch.setattr(kv_write, "reshape_and_cache_per_token_head", wrong)
    model = shapes.ModelShapes("toy", 4, 2, 32, {"bf16": 16, "fp8": 16, "int8": 16}, ())
    cases = shapes.Cases(decode=(), prefill=(), prefill_short=(), kv_write=(3,))
    sides = kv_write.run(model, cases, torch.device("cpu"), [], print)
    for side in sides:
        got = report.decide(side)
        assert got["use"] == "upstream" and got["why"].startswith("differs from upstream: 1 of "), got


def test_an_interrupt_halfway_leaves_no_file(tune, tmp_path, monkeypatch):
    from vllm.dcu.tune import attention

    real = attention.run

    def interrupted(kind, *args):
        if kind == "prefill":
            raise KeyboardInterrupt
        return real(kind, *args)

    monkeypatch.setattr(attention, "run", interrupted)
    monkeypatch.setattr(shapes, "TOY_CASES", shapes.Cases(decode=((1, 20),), prefill=(), prefill_short=(),
                                                          kv_write=()))
    out = tmp_path / "tuned.json"
    assert tune.main(["--model-config", str(_config(tmp_path)), "--out", str(out)]) == 130
    assert list(tmp_path.iterdir()) == [tmp_path / "config.json"]  # no file, no temporary left


@pytest.mark.parametrize("args, message", [
    (["--model", "llama-7b"], "error: unknown model 'llama-7b'; named shape sets: qwen3.5-27b"),
    (["--model-config", "{tmp}/missing.json"], "error: cannot read model config"),
    (["--model-config", "{tmp}/bad.json"], "error: model config {tmp}/bad.json: num_key_value_heads must be"),
    (["--model", "qwen3.5-27b", "--fast"], "error: unrecognized arguments: --fast"),
    (["--model", "qwen3.5-27b", "--quick", "--full"], "error: argument --full: not allowed with argument --quick"),
    ([], "error: one of the arguments --model --model-config is required"),
    (["--model", "qwen3.5-27b", "--full", "--sweep-budget-s", "0"], "error: --sweep-budget-s must be a positive"),
])
def test_bad_input_is_one_error_line_exit_2_and_no_file(vllm_tree, tmp_path, args, message):
    (tmp_path / "bad.json").write_text(json.dumps({**TOY, "num_key_value_heads": 0}))
    out = tmp_path / "tuned.json"
    args = [a.format(tmp=tmp_path) for a in args] + ["--out", str(out)]
    proc = subprocess.run([sys.executable, "-m", "vllm.dcu.tune", *args], capture_output=True, text=True,
                          env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message.format(tmp=tmp_path)), proc.stderr
    assert not out.exists()


def test_qwen35_config_gives_the_named_shape_set(tmp_path):
    cfg = {"text_config": {"hidden_size": 5120, "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256,
                           "intermediate_size": 17408, "vocab_size": 248320, "attn_output_gate": True,
                           "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128,
                           "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4}}
    got = shapes.from_config(_config(tmp_path, cfg))
    want = shapes.named("Qwen3.5-27B")
    assert got.attention == want.attention and got.pages == want.pages == {"bf16": 784, "fp8": 1552, "int8": 1664}
    assert sorted(g[1:] for g in got.gemms) == sorted(g[1:] for g in want.gemms)


def test_the_engine_reads_the_file_the_command_wrote(quick_run, monkeypatch):
    """End to end on the CPU: the file of the quick run above, one path edited to upstream, is what DCU_TRITON_ATTN's
    builder and the GEMV dispatch read at start (VLLM_DCU_TUNED_FILE), and the decision table says so."""
    import types

    import dcu_backend_fakes
    from vllm.dcu import gemv as dcu_gemv
    from vllm.dcu import triton_attn
    from vllm.dcu_kernels.tuning import decisions, tuned_file

    rc, out = quick_run
    doc = json.loads(out.read_text())
    doc["paths"]["decode.bf16"] = {"use": "upstream", "ratio": 1.2, "why": "edited by the test"}
    edited = out.parent / "edited.json"
    tuned_file.write(edited, doc)
    monkeypatch.setenv("VLLM_DCU_TUNED_FILE", str(edited))
    monkeypatch.setattr(dcu_gemv, "_TABLES", {})
    decisions.reset()
    triton_attn.DcuTritonAttentionMetadataBuilder(types.SimpleNamespace(block_size=16), ["layer.0"],
                                                  dcu_backend_fakes.fake_vllm_config(4, 2, 32), torch.device("cpu"))
    assert not decisions.runs_ours("decode.bf16")
    table = dcu_gemv.table(torch.device("cpu"))
    assert table._read_cache() == doc["gemv"]  # the dispatch's one loader: the same file, its gemv section
    lines = decisions.table_lines()
    assert lines[0] == f"tuned file: {edited}"
    assert any(line.startswith("decode.bf16") and "upstream (unified attention): measured 1.20x upstream: edited by "
               "the test" in line for line in lines)


@pytest.mark.slow
def test_the_rehearsal_sweeps_the_dcu_8bit_candidates_and_each_matches_upstream(tune, monkeypatch):
    """The DCU's 8-bit decode candidates (the options of sm90's measured entry over the DCU's paper entry, alone and
    together) through the rehearsal's code path (VLLM_DCU_EMULATE_ARCH=gfx936: the DCU's entry, portable
    conversions, software fp8) in the interpreter: each one the parser accepts compiles and matches upstream, so a
    DCU's --full spends its time on real contenders."""
    from vllm.dcu.tune import attention, sweep
    from vllm.dcu_kernels import targets
    from vllm.dcu_kernels.decode_attention import launch_params as decode_params
    from vllm.dcu_kernels.tuning import candidates

    monkeypatch.setenv(targets.EMULATE_ENV, "gfx936")
    monkeypatch.setenv("VLLM_DCU_TUNED", "0")
    monkeypatch.setattr(decode_params, "current_target", lambda device=None: "gfx936")  # the interpreter's is its own
    decode_params._CACHE.clear()
    monkeypatch.setattr(sweep, "time_us", lambda calls, copies=1, reps=10: {name: 1.0 for name in calls})
    cases = shapes.Cases(decode=((2, 80),), prefill=(), prefill_short=(), kv_write=())
    model = shapes.ModelShapes("toy", 4, 2, 32, {"bf16": 32, "fp8": 32, "int8": 32}, ())
    family = attention.decode_family(model, cases, torch.device("cpu"))
    rows = []
    sweep.sweep_width(family, "kv8", True, rows, print)
    decode_params._CACHE.clear()
    got = {r["candidate"]: r for r in rows}
    assert {"BLOCK_N 16", "BLOCK_N 64", "2 stages"} <= set(got)  # around the DCU's entry (BLOCK_N 32, 1 stage)
    new = [f"{k} {v}" for k, v in candidates.KV8_MEASURED_OPTIONS.items()]
    new += ["sm90's kv8 options", "sm90's kv8 options, int8 2 stages"]
    for label in new:
        assert "us" in got[label] and "failed" not in got[label] and "skipped" not in got[label], got[label]


def test_prefill_decides_by_total_time_decode_by_the_geomean(tune):
    # the gfx936 rehearsal on the H200 (2026-12-05): the DCU's bf16 prefill tile took 0.50x upstream's time on a
    # 4096-token chunk and 2.01x on a 16-token one; the geomean (1.00x) gave prefill to upstream, though a prompt's
    # prefill is the sum of its chunks and ours halves it. Decode keeps the geomean (a batch of 1 counts as one of 16).
    from vllm.dcu.tune import attention, report
    from vllm.dcu.tune.common import Side

    times = dict(cases=["4096 after 16K", "16 after 16K"], ours_us=[5000.0, 402.0], upstream_us=[10000.0, 200.0])
    prefill = report.decide(Side("prefill.bf16", by_total_time=True, **times))
    assert prefill["use"] == "ours" and prefill["ratio"] == pytest.approx(5402 / 10200, abs=1e-4)
    assert "(total time; per case 0.50x / 2.01x)" in prefill["why"]
    decode = report.decide(Side("decode.bf16", **times))
    assert decode["use"] == "upstream" and decode["ratio"] == pytest.approx(1.0025, abs=1e-4)
    assert "(geomean of 0.50x / 2.01x)" in decode["why"]
    model = shapes.ModelShapes("toy", 4, 2, 32, {"bf16": 32, "fp8": 32, "int8": 32}, ())
    cases = shapes.Cases(decode=((2, 80),), prefill=((40, 64),), prefill_short=((40, 2),), kv_write=())
    assert attention.prefill_family(model, cases, torch.device("cpu")).by_total_time
    assert not attention.decode_family(model, cases, torch.device("cpu")).by_total_time
