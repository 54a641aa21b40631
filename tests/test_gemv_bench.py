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
    entry = doc["meta"]["suggested_launch_params_entry"]
    assert entry["measured"] is True
    text = json.dumps({k: entry[k] for k in ("rows", "silu_rows", "shapes")})
    launch_params.get_params("interpreter", override=text)  # valid as a table entry
    out = capsys.readouterr().out.rstrip().splitlines()
    assert out[0].startswith("Suggested launch_params.PARAMS['interpreter']")
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
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "kernels.gemv.compile_check", "--json"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)
    assert {r["target"] for r in rows} == {"sm90", "gfx936"}
    for r in rows:
        assert "error" not in r, r
        assert r["spills"] == 0, r
        limit = 227 * 1024 if r["target"] == "sm90" else 64 * 1024
        assert r["shared"] <= limit, r
        if r["target"] == "sm90" and r["config"]["DOT"]:
            assert r["cp_async"] > 0, r  # W streamed by async copies (the pipeliner ran)
        if r["target"] == "sm90" and not r["config"]["DOT"]:
            assert r["ld_v4"] > 0, r  # 16-byte loads along K


def test_smoke_variants_times_every_variant_against_the_table_and_the_platform(tmp_path, monkeypatch, capsys):
    for name in ("SHAPES", "ROWS", "DEV", "SMOKE"):
        monkeypatch.setattr(bench, name, getattr(bench, name))
    base = bench.main(["--smoke", "--variants", "--out", str(tmp_path)])
    assert os.path.basename(base).endswith("-cpu-smoke-gemv-variants")
    with open(base + ".json") as f:
        doc = json.load(f)
    sides = {(r["op"], r["rows"], r["side"]) for r in doc["rows"]}
    want = {(name, r, side) for name, _, _, silu in bench.SHAPES if not silu for r in bench.ROWS
            for side in ("platform", "table", *bench.variant_grid(launch_params.row_bucket(r)))}
    assert sides == want
    for r in doc["rows"]:
        assert r["us"] > 0 and r["err"] < 1e-2
    assert sum(r["best"] for r in doc["rows"]) == len({(r["op"], r["rows"]) for r in doc["rows"]})
    assert "| best |" in capsys.readouterr().out


def test_variant_grid_is_valid_and_compiles_for_sm90_without_spills():
    assert not bench.SMOKE
    for b in launch_params.ROW_BUCKETS:
        grid = bench.variant_grid(b)
        assert 4 <= len(grid) <= 5
        for cfg in grid.values():
            launch_params.check_config(dict(cfg), "variant", rocm=False, rows=b)
            assert "PERSIST" in cfg or "K_STAGES" in cfg
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "kernels.gemv.compile_check", "--target", "sm90", "--variants",
                           "--json"], check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [r for r in json.loads(proc.stdout) if r["label"].startswith("variant")]
    assert len(rows) >= 10
    for r in rows:
        assert "error" not in r, r
        assert r["spills"] == 0 and r["shared"] <= 227 * 1024, r
        assert r["cp_async"] > 0, r  # W streamed by async copies (pipelined K loop)
        if "PERSIST" in r["config"]:
            # every program resident at once: PERSIST blocks fit one SM's registers (64K) and shared memory
            threads = 32 * r["config"]["num_warps"]
            regs = -(-r["regs"] // 8) * 8
            assert r["config"]["PERSIST"] <= 65536 // (regs * threads), r
            assert r["config"]["PERSIST"] * r["shared"] <= 228 * 1024, r


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
