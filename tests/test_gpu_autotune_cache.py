"""ci/gpu/autotune_cache.py: Triton autotuning results saved on one device machine and put back on the next."""
import json

from ci.gpu import autotune_cache


def _tuned(home, rel, best):
    path = home / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": [1], "configs_timings": [[{"num_warps": best}, [1.0]]]}))
    return path


def test_save_keeps_every_result_under_triton_and_vllm_caches_with_its_path(tmp_path):
    home = tmp_path / "home"
    a = _tuned(home, ".triton/cache/abc123/chunk_fwd_kernel_o.autotune.json", 4)
    b = _tuned(home, ".cache/vllm/torch_compile_cache/x/rank_0/triton_cache/def456/k.autotune.json", 8)
    (home / ".triton/cache/abc123/chunk_fwd_kernel_o.cubin").write_bytes(b"\0" * 64)  # compiled code: not saved
    _tuned(home, "elsewhere/zzz/k.autotune.json", 2)  # outside the caches: not saved
    dest = tmp_path / "saved"
    assert autotune_cache.save(dest, home) == 2
    saved = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert saved == sorted([a.relative_to(home).as_posix(), b.relative_to(home).as_posix()])


def test_restore_puts_results_back_and_never_replaces_one_that_is_there(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    _tuned(first, ".triton/cache/abc123/k1.autotune.json", 4)
    _tuned(first, ".triton/cache/abc124/k2.autotune.json", 4)
    saved = tmp_path / "saved"
    autotune_cache.save(saved, first)
    kept = _tuned(second, ".triton/cache/abc124/k2.autotune.json", 16)  # this machine's own result
    assert autotune_cache.restore(saved, second) == 1
    assert (second / ".triton/cache/abc123/k1.autotune.json").read_text() == \
        (first / ".triton/cache/abc123/k1.autotune.json").read_text()
    assert json.loads(kept.read_text())["configs_timings"][0][0]["num_warps"] == 16
    assert not list(second.rglob("*.tmp"))


def test_restore_of_nothing_is_nothing(tmp_path):
    assert autotune_cache.restore(tmp_path / "missing", tmp_path / "home") == 0
    stray = tmp_path / "saved" / "other" / "x.autotune.json"  # not under a known cache root: ignored
    stray.parent.mkdir(parents=True)
    stray.write_text("{}")
    assert autotune_cache.restore(tmp_path / "saved", tmp_path / "home") == 0


def test_a_jobs_run_packs_the_results_a_job_tuned(tmp_path, monkeypatch, capsys):
    # jobs.py (on the device, after the plan): the results the jobs' processes wrote under $HOME go into results.tgz
    import tarfile

    from ci.gpu import jobs

    home, out = tmp_path / "home", tmp_path / "out"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("OUT", str(out))
    plan = tmp_path / "plan"
    plan.write_text("0  tune  mkdir -p $HOME/.triton/cache/h1 && echo '{}' > $HOME/.triton/cache/h1/k.autotune.json\n")
    assert jobs.main([str(plan), "--res", str(tmp_path / "res"), "--deadline-s", "60"]) == 0
    with tarfile.open(out / "results.tgz") as tar:
        assert "triton-autotune/.triton/cache/h1/k.autotune.json" in tar.getnames()
    assert "Triton autotuning results saved: 1" in capsys.readouterr().out


def test_the_command_line_refuses_what_it_does_not_know(capsys):
    assert autotune_cache.main(["bogus", "x"]) == 2
    assert "usage: autotune_cache.py" in capsys.readouterr().err
