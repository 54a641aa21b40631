"""CPU tests of the GPU harness: bundle.py (CPU side), harness.py/run.sh (box side, run here on fake bundles),
the compiled-op stand-ins, and the dummy-model config writer."""
from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GPU = REPO / "ci" / "gpu"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bundle = _load("vllm_dcu_bundle_under_test", GPU / "bundle.py")
harness = _load("vllm_dcu_harness_under_test", GPU / "harness.py")
dummy_model = _load("vllm_dcu_dummy_model_under_test", GPU / "dummy_model.py")

CUSTOM_OPS_PY = textwrap.dedent('''
    import torch
    from torch.library import register_fake

    def rms_norm(out, x, w, eps):
        torch.ops._C.rms_norm(out, x, w, eps)

    def reshape_and_cache_flash(*a):
        torch.ops._C_cache_ops.reshape_and_cache_flash(*a)

    if hasattr(torch.ops._C, "scaled_fp4_quant"):
        @register_fake("_C::scaled_fp4_quant.out")
        def _fake(*a, **k):
            return None

    HAS_SHM = hasattr(
        torch.ops._C, "init_shm_manager"
    )
    FP8 = torch.ops._C.cutlass_scaled_mm_supports_fp8
    TOPK = torch.ops._moe_C.topk_softmax
    RMS_OP = torch.ops._C.rms_norm.default
''')


def make_wheel(path: Path, version: str, extra: dict[str, bytes] | None = None) -> Path:
    """A small vLLM-like wheel: Python files, a .so, swagger static files, helion configs, metadata."""
    files = {
        "vllm/__init__.py": b"__version__ = '%s'\n" % version.encode(),
        "vllm/_custom_ops.py": CUSTOM_OPS_PY.encode(),
        "vllm/_C.abi3.so": b"\x7fELF" + os.urandom(2048),
        "vllm/_moe_C.abi3.so": b"\x7fELF" + os.urandom(512),
        "vllm/vllm_flash_attn/__init__.py": b"raise ImportError('needs _vllm_fa2_C')\n",
        "vllm/vllm_flash_attn/flash_attn_interface.py": b"FA2_AVAILABLE = False\n",
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": b"\x7fELF" + os.urandom(256),
        "vllm/entrypoints/serve/instrumentator/static/swagger-ui.css": b"x" * 4096,
        "vllm/kernels/helion/configs/silu_mul_fp8/nvidia_h200.json": b"{}",
        "vllm/model.py": b"import torch\n\ndef f(x):\n    return torch.ops._C.silu_and_mul(x)\n",
        f"vllm-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n".encode(),
        f"vllm-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp38-abi3-x\n",
        f"vllm-{version}.dist-info/RECORD": b"vllm/_C.abi3.so,,\n",
    }
    files.update(extra or {})
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def make_dep_wheel(cache: Path, name: str = "tinydep", version: str = "1.0") -> Path:
    """A valid, installable pure-Python wheel."""
    cache.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": b"VALUE = 42\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for n, d in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode()
        record.append(f"{n},sha256={digest},{len(d)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = cache / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for n, d in files.items():
            zf.writestr(n, d)
    return path


@pytest.fixture
def env(tmp_path):
    """A fake wheel, a dependency cache with one wheel, and a deps list naming it."""
    make_dep_wheel(tmp_path / "cache")
    deps = tmp_path / "deps.txt"
    deps.write_text("# test deps\ntinydep==1.0\n")
    wheel = make_wheel(tmp_path / "vllm-0.18.1+dcu.7.deadbeef-cp38-abi3-manylinux_2_31_x86_64.whl",
                       "0.18.1+dcu.7.deadbeef")
    return {"tmp": tmp_path, "wheel": wheel, "deps": deps, "cache": tmp_path / "cache",
            "out": tmp_path / ".bundle"}


def run_bundle(e, *extra: str, wheels=None) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "ci.gpu.bundle"]
    for w in (wheels if wheels is not None else [e["wheel"]]):
        args += ["--wheel", str(w)]
    args += ["--out", str(e["out"]), "--deps", str(e["deps"]), "--cache", str(e["cache"]), "--offline", *extra]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=REPO)


def assert_one_line_error(p: subprocess.CompletedProcess, *words: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("bundle.py: error: "), p.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


def no_bundle_left(e) -> bool:
    leftovers = [p.name for p in e["out"].parent.iterdir() if p.name.startswith(".bundle")]
    return leftovers == []


# ------------------------------------------------------------------------------------------- bundle.py
def test_bundle_from_fake_wheel_has_python_files_only_deps_standins_and_a_right_manifest(env):
    p = run_bundle(env)
    assert p.returncode == 0, p.stderr
    out = env["out"]
    man = json.loads((out / "manifest.json").read_text())
    (v,) = man["variants"]
    assert v["name"] == "dcu.7.deadbeef" and v["version"] == "0.18.1+dcu.7.deadbeef"
    assert v["wheel"] == env["wheel"].name
    with tarfile.open(out / v["tarball"]) as tar:
        names = set(tar.getnames())
    assert "vllm/_custom_ops.py" in names and "vllm/vllm_flash_attn/flash_attn_interface.py" in names
    assert not any(n.endswith(".so") for n in names), names
    assert not any("/static/" in n or "helion/configs" in n for n in names), names
    assert "vllm-0.18.1+dcu.7.deadbeef.dist-info/METADATA" in names  # platform detection reads it
    assert not any(n.endswith("RECORD") for n in names)
    assert v["files"] == len(names) and v["excluded_files"] == 6
    assert v["bytes"] == (out / v["tarball"]).stat().st_size
    assert v["sha256"] == hashlib.sha256((out / v["tarball"]).read_bytes()).hexdigest()
    ops = v["compiled_ops"]
    assert {"rms_norm", "silu_and_mul", "scaled_fp4_quant", "init_shm_manager",
            "cutlass_scaled_mm_supports_fp8"} <= set(ops["_C"]["ops"])
    assert ops["_C"]["overloads"] == ["scaled_fp4_quant.out"]
    assert ops["_C_cache_ops"]["ops"] == ["reshape_and_cache_flash"] and ops["_moe_C"]["ops"] == ["topk_softmax"]
    assert [d["file"] for d in man["deps"]] == ["tinydep-1.0-py3-none-any.whl"]
    assert (out / "deps" / "tinydep-1.0-py3-none-any.whl").is_file()
    assert sorted(os.listdir(out / "standins")) == sorted(bundle.STANDINS)
    on_disk = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    assert abs(man["total_bytes"] - on_disk) < 256 and on_disk < 60 * 2**20
    assert [x.name for x in env["tmp"].iterdir() if x.name.startswith(".bundle-tmp")] == []


def test_bundle_names_variants_by_version_local_part_or_name_and_rejects_duplicates(env):
    up = make_wheel(env["tmp"] / "vllm-0.18.1-cp38-abi3-manylinux_2_31_x86_64.whl", "0.18.1")
    base = make_wheel(env["tmp"] / "vllm-0.18.1+base-cp38-abi3-manylinux_2_31_x86_64.whl", "0.18.1+base")
    p = run_bundle(env, wheels=[up, base, env["wheel"]])
    assert p.returncode == 0, p.stderr
    man = json.loads((env["out"] / "manifest.json").read_text())
    assert [v["name"] for v in man["variants"]] == ["upstream", "base", "dcu.7.deadbeef"]
    p = run_bundle(env, "--name", "a", "--name", "b", wheels=[up, base])
    assert p.returncode == 0, p.stderr
    assert [v["name"] for v in json.loads((env["out"] / "manifest.json").read_text())["variants"]] == ["a", "b"]
    assert_one_line_error(run_bundle(env, wheels=[base, base]), "two wheels give variant 'base'")
    assert_one_line_error(run_bundle(env, "--name", "x", wheels=[up, base]), "--name given 1 time(s) for 2")
    assert_one_line_error(run_bundle(env, "--name", "bad/name"), "must be letters")
    # a shell glob after one --wheel, as in `--wheel dist/*.whl`
    p = subprocess.run([sys.executable, "-m", "ci.gpu.bundle", "--wheel", str(up), str(base), "--out",
                        str(env["out"]), "--deps", str(env["deps"]), "--cache", str(env["cache"]), "--offline"],
                       capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0, p.stderr
    assert [v["name"] for v in json.loads((env["out"] / "manifest.json").read_text())["variants"]] == [
        "upstream", "base"]


def test_bundle_over_size_cap_fails_clearly_and_leaves_no_bundle(env):
    p = run_bundle(env, "--max-mib", "0.001")
    assert_one_line_error(p, "over the 0.001 MiB cap")
    assert no_bundle_left(env)


def test_bundle_bad_input_gives_one_clear_error_and_no_partial_bundle(env):
    txt = env["tmp"] / "notes.txt"
    txt.write_text("hello")
    fake = env["tmp"] / "vllm-0.18.1-cp38-abi3-manylinux_2_31_x86_64.whl"
    fake.write_text("not a zip")
    other = env["tmp"] / "other-1.0-py3-none-any.whl"
    with zipfile.ZipFile(other, "w") as zf:
        zf.writestr("other/__init__.py", "")
    cases = [([env["tmp"] / "missing.whl"], "wheel not found"),
             ([txt], "not a wheel file name"),
             ([fake], "not a zip archive"),
             ([other], "not a vLLM wheel"),
             ([env["wheel"], env["tmp"] / "missing.whl"], "wheel not found")]
    for wheels, words in cases:
        assert_one_line_error(run_bundle(env, wheels=wheels), words)
        assert no_bundle_left(env), wheels
    env["deps"].write_text("tinydep==1.0\nabsent==2.0\n")
    assert_one_line_error(run_bundle(env), "absent==2.0", "--offline")
    env["deps"].write_text("tinydep>=1\n")
    assert_one_line_error(run_bundle(env), "want NAME==VERSION")
    assert no_bundle_left(env)


def test_failed_bundle_keeps_the_previous_complete_bundle(env):
    assert run_bundle(env).returncode == 0
    before = (env["out"] / "manifest.json").read_text()
    assert_one_line_error(run_bundle(env, "--max-mib", "0.001"), "cap")
    assert (env["out"] / "manifest.json").read_text() == before


def test_the_same_wheel_under_two_names_shares_one_tarball_and_the_box_unpacks_both(env, tmp_path):
    # same resolved path (given as two spellings of one file), then the same bytes under another path
    twin = env["tmp"] / "elsewhere" / env["wheel"].name
    twin.parent.mkdir()
    twin.write_bytes(env["wheel"].read_bytes())
    other = make_wheel(env["tmp"] / "vllm-0.18.1+base-cp38-abi3-manylinux_2_31_x86_64.whl", "0.18.1+base")
    same_path = env["tmp"] / "elsewhere" / ".." / env["wheel"].name
    p = run_bundle(env, "--name", "full", "--name", "full8", "--name", "base", "--name", "copy",
                   wheels=[env["wheel"], same_path, other, twin])
    assert p.returncode == 0, p.stderr
    out = env["out"]
    man = json.loads((out / "manifest.json").read_text())
    by = {v["name"]: v for v in man["variants"]}
    assert list(by) == ["full", "full8", "base", "copy"]
    assert sorted(os.listdir(out / "variants")) == ["base.tar.gz", "full.tar.gz"]
    for name in ("full8", "copy"):
        assert by[name]["shares"] == "full"
        for key in ("tarball", "sha256", "bytes", "files", "compiled_ops"):
            assert by[name][key] == by["full"][key], (name, key)
    assert by["copy"]["wheel"] == twin.name and by["copy"]["version"] == "0.18.1+dcu.7.deadbeef"
    assert "shares" not in by["full"] and "shares" not in by["base"]
    on_disk = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    assert abs(man["total_bytes"] - on_disk) < 256  # the shared tarball counted once
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("bundle: variant ")]
    assert len(lines) == 4 and "same wheel as full: shares its tarball variants/full.tar.gz" in lines[1]
    assert "shares" in lines[3] and "shares" not in lines[0] + lines[2]
    assert sum(f.stat().st_size for f in (out / "variants").iterdir()) == by["full"]["bytes"] + by["base"]["bytes"]
    # the box unpacks every name from the tarball its entry points to
    e = dict(os.environ, VLLM_DCU_BUNDLE=str(out), VLLM_DCU_SITE=str(tmp_path / "site"),
             VLLM_DCU_VARIANTS=str(tmp_path / "variants"))
    e.pop("VARIANT", None)
    e.pop("PYTHONPATH", None)
    p = subprocess.run(["bash", str(GPU / "run.sh"), "prepare"], capture_output=True, text=True, timeout=300, env=e,
                       cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("unpacked variant") == 4
    for name in ("full", "full8", "copy"):
        tree = tmp_path / "variants" / name / "vllm"
        assert (tree / "_custom_ops.py").read_text() == CUSTOM_OPS_PY and (tree / "_C.py").is_file()


# ---------------------------------------------------------------------------------- run.sh / harness
@pytest.fixture
def box(env, tmp_path):
    """A bundle of two fake variants, and the box-side folders pointed into tmp_path."""
    up = make_wheel(env["tmp"] / "vllm-0.18.1-cp38-abi3-manylinux_2_31_x86_64.whl", "0.18.1")
    assert run_bundle(env, wheels=[up, env["wheel"]]).returncode == 0
    e = dict(os.environ, VLLM_DCU_BUNDLE=str(env["out"]), VLLM_DCU_SITE=str(tmp_path / "site"),
             VLLM_DCU_VARIANTS=str(tmp_path / "variants"))
    e.pop("VARIANT", None)
    e.pop("PYTHONPATH", None)
    return {"env": e, "tmp": tmp_path, "bundle": env["out"]}


def run_box(box, *args, env=None):
    return subprocess.run(["bash", str(GPU / "run.sh"), *args], capture_output=True, text=True, timeout=300,
                          env=env or box["env"], cwd=str(box["tmp"]))


def test_run_sh_installs_deps_and_variants_once_and_lists_the_default(box):
    p = run_box(box, "list")
    assert p.returncode == 0, p.stderr
    assert "installed 1 dependency wheels" in p.stdout and p.stdout.count("unpacked variant") == 2
    assert "  upstream " in p.stdout and "* dcu.7.deadbeef " in p.stdout  # default: the last one
    site, variants = box["tmp"] / "site", box["tmp"] / "variants"
    assert (site / "tinydep" / "__init__.py").is_file()
    for name in ("upstream", "dcu.7.deadbeef"):
        tree = variants / name / "vllm"
        assert (tree / "_C.py").read_text() == (GPU / "standins" / "vllm_C.py").read_text()
        ops = json.loads((tree / "_C_standin_ops.json").read_text())
        assert "rms_norm" in ops["_C"]["ops"]
        assert "CompiledOpUnavailable" in (tree / "vllm_flash_attn" / "__init__.py").read_text()
        assert not list(tree.rglob("*.so"))
    p = run_box(box, "list")  # second run: stamps say nothing changed
    assert p.returncode == 0 and "installed" not in p.stdout and "unpacked" not in p.stdout
    p = run_box(box, "list", env=dict(box["env"], VARIANT="upstream"))
    assert "* upstream " in p.stdout


def test_run_sh_python_target_runs_script_with_the_selected_variant_first_on_the_path(box):
    script = box["tmp"] / "probe.py"
    script.write_text("import json, os, sys, vllm, tinydep\n"
                      "print(json.dumps({'vllm': vllm.__file__, 'dep': tinydep.VALUE, 'argv': sys.argv[1:],"
                      " 'env': {k: os.environ.get(k) for k in ('VLLM_DCU_VARIANT', 'NCCL_NVLS_ENABLE',"
                      " 'VLLM_DCU_USE_INSTALLED', 'VLLM_ALLREDUCE_USE_SYMM_MEM')}}))\n")
    p = run_box(box, "python", str(script), "a", "b", env=dict(box["env"], VARIANT="upstream"))
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["vllm"] == str(box["tmp"] / "variants" / "upstream" / "vllm" / "__init__.py")
    assert res["dep"] == 42 and res["argv"] == ["a", "b"]
    assert res["env"] == {"VLLM_DCU_VARIANT": "upstream", "NCCL_NVLS_ENABLE": "0",
                          "VLLM_DCU_USE_INSTALLED": "1", "VLLM_ALLREDUCE_USE_SYMM_MEM": "0"}


def test_run_sh_bad_input_fails_with_one_clear_line(box, tmp_path):
    cases = [(dict(box["env"], VARIANT="nope"), ["python", "x.py"], "VARIANT='nope' is not in the bundle"),
             (box["env"], ["frobnicate"], "unknown target 'frobnicate'"),
             (box["env"], ["python"], "needs a script"),
             (dict(box["env"], VLLM_DCU_BUNDLE=str(tmp_path / "none")), ["list"], "no bundle at")]
    for env, args, words in cases:
        p = run_box(box, *args, env=env)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert p.returncode == 2 and len(lines) == 1 and words in lines[0], (args, p.stdout, p.stderr)


def test_engine_kwargs_and_serve_flags_avoid_compiled_paths(tmp_path):
    kw = harness.engine_kwargs()
    assert kw == {"attention_backend": "TRITON_ATTN", "gdn_prefill_backend": "triton",
                  "compilation_config": {"custom_ops": ["none"]}, "language_model_only": True,
                  "disable_custom_all_reduce": True}
    model = dummy_model.write_config(tmp_path / "m", 4)
    kw = harness.engine_kwargs(model, eager=True, compilation_config={"cudagraph_capture_sizes": [1, 2]},
                               max_model_len=2048)
    assert kw["model"] == str(model) and kw["load_format"] == "dummy" and kw["skip_tokenizer_init"] is True
    assert kw["enforce_eager"] is True and kw["max_model_len"] == 2048
    assert kw["compilation_config"] == {"custom_ops": ["none"], "cudagraph_capture_sizes": [1, 2]}
    flags = harness.serve_args()
    assert flags == ["--attention-backend", "TRITON_ATTN", "--gdn-prefill-backend", "triton",
                     "--compilation-config", '{"custom_ops":["none"]}', "--language-model-only",
                     "--disable-custom-all-reduce"]
    assert harness.serve_args(eager=True)[-1] == "--enforce-eager"
    assert "--no-enable-prefix-caching" in harness.serve_args(enable_prefix_caching=False)
    argv = harness.serve_command(str(model), port=8123, max_model_len=2048)
    assert argv[1:5] == ["-m", "vllm.entrypoints.cli.main", "serve", str(model)]
    assert argv[5:9] == ["--host", "127.0.0.1", "--port", "8123"] and "--skip-tokenizer-init" in argv
    (model / "tokenizer.json").write_text("{}")  # a folder with a tokenizer is served with it
    assert "--skip-tokenizer-init" not in harness.serve_command(str(model), port=1)


def test_engine_kwargs_are_real_vllm_engine_arguments(vllm_tree, tmp_path):
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    kw = harness.engine_kwargs(dummy_model.write_config(tmp_path / "m", 4), eager=True, max_model_len=4096,
                               tensor_parallel_size=2, enable_prefix_caching=False)
    names = {f.name for f in dataclasses.fields(EngineArgs)}
    assert set(kw) <= names, set(kw) - names
    args = EngineArgs(**kw)
    assert args.attention_backend == "TRITON_ATTN" and args.gdn_prefill_backend == "triton"


def test_variant_env_puts_variant_then_deps_then_repo_on_the_path(box):
    run_box(box, "list")
    old = dict(os.environ)
    try:
        os.environ.update({k: box["env"][k] for k in ("VLLM_DCU_BUNDLE", "VLLM_DCU_SITE", "VLLM_DCU_VARIANTS")})
        assert harness.variants() == ["upstream", "dcu.7.deadbeef"]
        e = harness.variant_env("upstream", base={"PYTHONPATH": "/x"}, inprocess=False)
        assert e["PYTHONPATH"].split(os.pathsep) == [str(box["tmp"] / "variants" / "upstream"),
                                                     str(box["tmp"] / "site"), str(REPO), "/x"]
        assert e["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1" and e["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
        assert harness.variant_env()["VLLM_DCU_VARIANT"] == "dcu.7.deadbeef"
        with pytest.raises(harness.HarnessError, match="not unpacked"):
            harness.variant_env("ghost")
    finally:
        os.environ.clear()
        os.environ.update(old)


# ---------------------------------------------------------------------------------------- stand-ins
STANDIN_CHECK = textwrap.dedent('''
    import json, sys, torch
    import vllm._C as C
    import vllm._custom_ops as ops          # registers a fake for "_C::scaled_fp4_quant.out"
    out = {}
    try:
        torch.ops._C.rms_norm(torch.zeros(2), torch.zeros(2), torch.ones(2), 1e-6)
    except C.CompiledOpUnavailable as e:
        out["call"] = str(e)
    out["overload"] = type(ops.RMS_OP).__name__
    out["undeclared"] = hasattr(torch.ops._C, "never_referenced_op")
    try:
        torch.ops._C.never_referenced_op
    except AttributeError as e:
        out["undeclared_msg"] = str(e)
    out["capability"] = ops.FP8(90)
    t = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)[1:]
    w = torch.ops._C.weak_ref_tensor(t)
    w[0, 0] = 100
    out["weak"] = [w.shape == t.shape, w.stride() == t.stride(), w.data_ptr() == t.data_ptr(),
                   float(t[0, 0]) == 100.0, w.dtype == t.dtype, w is not t]
    import vllm.vllm_flash_attn as fa
    try:
        fa.flash_attn_varlen_func()
    except NotImplementedError as e:
        out["fa"] = str(e)
    out["fa_supported"] = fa.is_fa_version_supported(3)
    import triton.runtime._allocation as alloc
    out["allocator"] = not isinstance(alloc._allocator.get(), alloc.NullAllocator)
    print(json.dumps(out))
''')


def test_standins_fail_loudly_with_the_op_name_and_support_import_and_capture(box):
    run_box(box, "list")
    tree = box["tmp"] / "variants" / "dcu.7.deadbeef"
    p = subprocess.run([sys.executable, "-c", STANDIN_CHECK], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(tree)))
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert "compiled op _C::rms_norm was called" in r["call"]
    assert r["overload"] == "OpOverload"
    assert r["undeclared"] is False and "_C::never_referenced_op" in r["undeclared_msg"]
    assert r["capability"] is False
    assert r["weak"] == [True] * 6
    assert "flash_attn_varlen_func" in r["fa"] and r["fa_supported"] is False
    assert r["allocator"] is True


def test_weak_ref_tensor_standin_does_not_keep_storage_alive(box):
    run_box(box, "list")
    tree = box["tmp"] / "variants" / "upstream"
    code = ("import torch, vllm._C\n"
            "t = torch.ones(1024)\n"
            "before = torch._C._storage_Use_Count(t.untyped_storage()._cdata)\n"
            "w = torch.ops._C.weak_ref_tensor(t)\n"
            "after = torch._C._storage_Use_Count(t.untyped_storage()._cdata)\n"
            "print(before, after, w is not t and w.untyped_storage().data_ptr() == t.untyped_storage().data_ptr())\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(tree)))
    assert p.returncode == 0, p.stderr
    before, after, same = p.stdout.split()
    assert before == after and same == "True"


def test_standin_lets_real_vllm_modules_that_register_compiled_ops_import(vllm_tree, tmp_path):
    """The patched tree's _custom_ops and fusion passes (register_fake, .default at import) import on CPU
    with the stand-in and the op list scanned from that tree's sources."""
    import vllm

    root = Path(vllm.__file__).parent
    sources = {str(p): p.read_text(errors="replace") for p in root.rglob("*.py")}
    ops = bundle.scan_compiled_ops(sources)
    assert len(ops["_C"]["ops"]) > 50 and "scaled_fp4_quant.out" in ops["_C"]["overloads"]
    shim = tmp_path / "_C.py"
    shim.write_text((GPU / "standins" / "vllm_C.py").read_text())
    (tmp_path / "_C_standin_ops.json").write_text(json.dumps(ops))
    code = textwrap.dedent(f'''
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("vllm._C", {str(shim)!r})
        mod = importlib.util.module_from_spec(spec); sys.modules["vllm._C"] = mod; spec.loader.exec_module(mod)
        import torch
        import vllm._custom_ops
        import vllm.compilation.passes.fusion.rms_quant_fusion as f
        print(type(f.RMS_OP).__name__, torch.ops._C.cutlass_scaled_mm_supports_fp8(90))
    ''')
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ))
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split()[-2:] == ["OpOverload", "False"]


# ------------------------------------------------------------------------------------- dummy model
def test_dummy_model_config_has_qwen35_27b_shapes_and_full_attention_every_4th_layer(vllm_tree, tmp_path):
    from vllm.transformers_utils.configs.qwen3_5 import Qwen3_5Config

    for layers in (4, 16, 64):
        out = dummy_model.write_config(tmp_path / f"m{layers}", layers)
        cfg = Qwen3_5Config(**json.loads((out / "config.json").read_text()))
        t = cfg.text_config
        assert t.num_hidden_layers == layers and len(t.layer_types) == layers
        full = [i for i, k in enumerate(t.layer_types) if k == "full_attention"]
        assert full == list(range(3, layers, 4))
        assert (t.hidden_size, t.num_attention_heads, t.num_key_value_heads, t.head_dim) == (5120, 24, 4, 256)
        assert (t.linear_num_key_heads, t.linear_num_value_heads, t.vocab_size) == (16, 48, 248320)
    assert not list((tmp_path / "m4").glob("tokenizer*"))


def test_dummy_model_cli_rejects_layer_counts_that_break_the_pattern(tmp_path):
    ok = subprocess.run([sys.executable, str(GPU / "dummy_model.py"), "--layers", "16", "--out", str(tmp_path / "a")],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and (tmp_path / "a" / "config.json").is_file()
    for bad in ("6", "0", "-4"):
        p = subprocess.run([sys.executable, str(GPU / "dummy_model.py"), "--layers", bad, "--out",
                            str(tmp_path / "b")], capture_output=True, text=True)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert p.returncode == 2 and len(lines) == 1 and "multiple of 4" in lines[0], (bad, p.stderr)
    assert not (tmp_path / "b").exists()
