"""kernels/gemv/bench.py's whole flow on the CPU (--smoke: Triton interpreter, toy shapes), its sweep
grid, and the GEMV compiled ahead of time for sm90 and a wave64 AMD target (kernels/gemv/compile_check.py)
without a GPU, so the H200 run is not the first time either is executed or compiled."""
import json
import os
import subprocess
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import triton_interp_compat  # noqa: E402,F401

from kernels.gemv import bench, launch_params  # noqa: E402
from tests.compile_checks import compile_check_rows  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_smoke_run_writes_json_and_markdown_and_prints_the_table_last(tmp_path, monkeypatch, capsys):
    for name in ("SHAPES", "ROWS", "DEV", "SMOKE"):  # smoke_setup changes module globals: restore them after
        monkeypatch.setattr(bench, name, getattr(bench, name))
    base = bench.main(["--smoke", "--out", str(tmp_path)])
    doc = json.loads(open(base + ".json").read())
    md = open(base + ".md").read()
    assert os.path.basename(base).endswith("-cpu-smoke-gemv")
    assert md.splitlines()[2] == "Command: `python -m kernels.gemv.bench --smoke`"
    got = {(r["op"], r["rows"]) for r in doc["rows"]}
    assert got == {(name, r) for name, *_ in bench.SHAPES for r in bench.ROWS}
    for r in doc["rows"]:
        assert r["pick"] in ("triton", "platform") and r["triton_us"] > 0 and r["platform_us"] > 0
        assert r["triton_err"] < 1e-2 and r["platform_err"] < 1e-2
    assert any(r.get("us") for r in doc["sweep"])
    override = doc["meta"]["suggested_override"]  # the VLLM_DCU_GEMV_PARAMS format, as the tuned file keeps it
    entry = launch_params.get_params("interpreter", override=json.dumps(override))
    assert entry["rows"] and entry["silu_rows"]
    out = capsys.readouterr().out.rstrip().splitlines()
    assert out[0].startswith("Suggested launch options for interpreter (the VLLM_DCU_GEMV_PARAMS format")
    assert out[3] == f"VLLM_DCU_GEMV_PARAMS='{json.dumps(override, separators=(',', ':'), sort_keys=True)}'"
    assert out[-1].startswith("| b+silu | 40x48 | 4 |")  # the table is the last thing printed


def test_sweep_grid_is_bounded_and_valid():
    for rocm in (False, True):
        for silu in (False, True):
            total = set()
            for b in launch_params.ROW_BUCKETS:
                grid = bench.sweep_grid(b, rocm=rocm, silu=silu)
                assert 4 <= len(grid) <= 12
                for cfg in grid:
                    launch_params.check_config(dict(cfg), "grid", rocm=rocm, rows=b, silu_mul=silu)
                    total.add((json.dumps(cfg, sort_keys=True), b if not cfg["DOT"] else 16))
            assert len(total) <= 20  # distinct compiles per variant
    assert bench.split_candidates(96) == [4, 8, 16] and bench.split_candidates(5120) == [1, 2, 4]
    assert bench.split_candidates(16384) == []


def test_gemv_compiles_for_sm90_and_wave64_without_spills():
    rows = compile_check_rows("gemv")
    assert {r["target"] for r in rows} == {"sm90", "gfx936"}
    for r in rows:
        assert "error" not in r, r
        assert r["spills"] == 0, r
        limit = 227 * 1024 if r["target"] == "sm90" else 64 * 1024
        assert r["shared"] <= limit, r
        if r["target"] == "sm90" and r["config"]["DOT"]:
            assert r["cp_async"] > 0, r  # W streamed by async copies (the pipeliner ran)
        if r["target"] == "sm90" and not r["config"]["DOT"]:
            # 16-byte loads along K, or with K_STAGES (a pipelined K loop) async copies into shared memory
            assert (r["cp_async"] if "K_STAGES" in r["config"] else r["ld_v4"]) > 0, r
        if r["target"] == "gfx936":
            # the weight stream in 16-byte loads per lane (global_load_dwordx4) on the wave64 target; the dot path's
            # rows reach the MFMA units
            assert r["ld_v4"] > 0, r
            assert (r["mma"] > 0) == bool(r["config"]["DOT"]), r


def test_smoke_variants_times_every_variant_against_the_table_and_the_platform(tmp_path, monkeypatch, capsys):
    for name in ("SHAPES", "ROWS", "DEV", "SMOKE"):
        monkeypatch.setattr(bench, name, getattr(bench, name))
    base = bench.main(["--smoke", "--variants", "--out", str(tmp_path)])
    assert os.path.basename(base).endswith("-cpu-smoke-gemv-variants")
    with open(base + ".json") as f:
        doc = json.load(f)
    sides = {(r["op"], r["rows"], r["side"]) for r in doc["rows"]}
    want = set()
    for name, n, k, silu in bench.SHAPES:  # the fused shape too, at one row only
        table = launch_params.config_for("interpreter", n, k, 1, silu)
        want |= {(name, 1, side) for side in ("platform", "table", *bench.variant_grid(table), *bench.read_sides())}
    assert sides == want
    for r in doc["rows"]:
        assert r["us"] > 0 and (r["err"] is None if r["side"].startswith("read ") else r["err"] < 1e-2)
        if r["side"] == "table":
            assert r["vs_table"] == 1
    assert sum(r["best"] for r in doc["rows"]) == len(bench.SHAPES)  # GEMV sides only, never the read roof
    out = capsys.readouterr().out
    assert "| best |" in out and "read roof % copy |" in out


def test_read_roof_reads_every_element_of_w_once(monkeypatch):
    for name in ("SHAPES", "ROWS", "DEV", "SMOKE"):
        monkeypatch.setattr(bench, name, getattr(bench, name))
    bench.smoke_setup()
    # chunks past W's end too; programs_per_sm 0: one program per block; torch.sum
    for n, k, block, per_sm in [(6, 96, 64, 2), (7, 99, 32, 3), (40, 48, 256, 1), (7, 99, 64, 0), (6, 96, None, 0)]:
        op = bench.Op("t", n, k, False, 1 << 20)
        cfg = {"BLOCK": block, "programs_per_sm": per_sm} if block else {"torch.sum": "float32"}
        sums = op.read(cfg)(0)
        if block:
            assert sums.shape == (bench.num_sms() * per_sm if per_sm else -(-n * k // block),)
        assert abs(sums.double().sum().item() - op.w[0].double().sum().item()) < 1e-3
    assert set(bench.read_sides()) == {"read b64x2", "read b64", "read torch.sum"}  # the smoke run's sides


def test_smoke_variants_with_tries_time_the_named_options_per_row_bucket(tmp_path, monkeypatch):
    for name in ("SHAPES", "ROWS", "DEV", "SMOKE"):
        monkeypatch.setattr(bench, name, getattr(bench, name))
    base = bench.main(["--smoke", "--variants", "--rows", "1,4", "--shapes", "6x96", "--out", str(tmp_path),
                       "--try", 'n2={"DOT":0,"BLOCK_N":2,"BLOCK_K":32}',
                       "--try", 'only4={"4":{"DOT":1,"BLOCK_N":16,"BLOCK_K":32}}'])
    with open(base + ".json") as f:
        doc = json.load(f)
    sides = {(r["op"], r["rows"], r["side"]): r for r in doc["rows"]}
    # the fused shape is left out by --shapes; "only4" runs at 4 rows only; options merge over the table's; the
    # read roof once per shape, in the first rows' call
    assert set(sides) == {("small-n", 1, s) for s in ("platform", "table", "n2", *bench.read_sides())} | \
        {("small-n", 4, s) for s in ("platform", "table", "n2", "only4")}
    table4 = launch_params.config_for("interpreter", 6, 96, 4)
    assert sides[("small-n", 4, "only4")]["config"] == {**table4, "DOT": 1, "BLOCK_N": 16, "BLOCK_K": 32}
    assert sides[("small-n", 1, "n2")]["config"]["BLOCK_N"] == 2
    assert all(r["err"] < 1e-2 for r in doc["rows"] if not r["side"].startswith("read "))
    assert doc["meta"]["variant_rows"] == [1, 4] and doc["meta"]["variant_K_STAGES"] == []


@pytest.mark.parametrize("argv, message", [
    (["--try", 'a={"BLOCK_N":2}'], "--try, --rows and --shapes go with --variants"),
    (["--variants", "--try", "a=[1]"], "--try a: JSON must be a non-empty object"),
    (["--variants", "--try", "table={}"], "--try needs LABEL=JSON with a label other than table / platform"),
    (["--variants", "--try", "a={"], "--try a: not JSON"),
    (["--variants", "--rows", "3"], "--rows must be taken from"),
    (["--variants", "--rows", "1,,2"], "--rows must be taken from"),
    (["--variants", "--shapes", "1x2"], "--shapes: unknown ['1x2']"),
    (["--smoke", "--variants", "--try", 'a={"BLOCK_N":3}'], "--try a (rows 1): BLOCK_N must be a power of two"),
])
def test_bad_variant_arguments_exit_with_one_error_line(argv, message, monkeypatch):
    for name in ("SHAPES", "ROWS", "DEV", "SMOKE"):
        monkeypatch.setattr(bench, name, getattr(bench, name))
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert message in str(e.value)


def test_variant_grid_is_the_table_entry_with_the_k_loop_plain_or_pipelined():
    plain = {"DOT": 0, "BLOCK_N": 8, "BLOCK_K": 512, "num_warps": 4, "num_stages": 1, "SPLIT_K": 16}
    grid = bench.variant_grid(plain)
    assert grid == {f"k{s}": {**plain, "K_STAGES": s} for s in (2, 3, 4)}
    # a table entry with K_STAGES 3: the plain loop, 2 and 4
    grid = bench.variant_grid({**plain, "K_STAGES": 3})
    assert grid == {"plain": plain, "k2": {**plain, "K_STAGES": 2}, "k4": {**plain, "K_STAGES": 4}}


def test_variant_grid_compiles_for_sm90_without_spills():
    assert not bench.SMOKE
    entry = launch_params.get_params("sm90")
    for _, n, k, silu in bench.SHAPES:
        for cfg in bench.variant_grid(launch_params.config_for("sm90", n, k, 1, silu, entry=entry)).values():
            launch_params.check_config(dict(cfg), "variant", rocm=False, rows=1, silu_mul=silu)
    rows = [r for r in compile_check_rows("gemv", "--target", "sm90", "--variants") if r["label"].startswith("variant")]
    assert len(rows) >= 6
    for r in rows:
        assert "error" not in r, r
        assert r["spills"] == 0 and r["shared"] <= 227 * 1024, r
        if "K_STAGES" in r["config"]:
            assert r["cp_async"] > 0, r  # W streamed by async copies (pipelined K loop, FMA path included)


def test_smoke_needs_the_interpreter(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "kernels.gemv.bench", "--smoke", "--out", str(tmp_path)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == \
        "error: --smoke needs TRITON_INTERPRET=1 in the environment (set before Triton is imported)"


@pytest.mark.parametrize("argv", [["--budget-s", "x"]])
def test_bad_arguments_exit(argv):
    with pytest.raises(SystemExit):
        bench.main(argv)
