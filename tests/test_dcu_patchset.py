"""dcu/patchset.py (patch 0001): the build's patch-set record, read alone (no vLLM), and the shim patch 0001 adds
so that `python -m vllm.dcu_patchset` keeps working (in the patched tree)."""
from __future__ import annotations

import json
import subprocess
import sys

from dcu import patchset

RECORD = {
    "version": "0.18.1+dcu.2.abcdef12",
    "base": {"name": "vllm-0.18.1-cp38-abi3-manylinux_2_31_x86_64.whl", "version": "0.18.1", "sha256": "ab" * 32},
    "patches": [{"name": "0001-report-dcu-patchset.patch", "subject": "Report", "sha256": "1" * 64},
                {"name": "0003-dcu-triton-decode-attention.patch", "subject": "Decode", "sha256": "3" * 64}],
    "kernels": {"package": "vllm.dcu_kernels", "packages": ["vllm.dcu_kernels", "vllm.dcu"], "sha256": "cd" * 32},
}


def test_record_path_is_beside_the_vllm_package():
    assert patchset.PATH.endswith("/dcu_patchset.json")  # vllm/dcu/patchset.py -> vllm/dcu_patchset.json
    assert patchset.load("/nonexistent/dcu_patchset.json") is None


def test_summary_names_version_base_and_patch_numbers(tmp_path):
    path = tmp_path / "dcu_patchset.json"
    path.write_text(json.dumps(RECORD))
    assert patchset.summary(str(path)) == (
        "vllm-dcu 0.18.1+dcu.2.abcdef12 on vllm-0.18.1-cp38-abi3-manylinux_2_31_x86_64.whl: patches 0001, 0003")
    assert "not built by vllm-dcu's build.sh" in patchset.summary(str(tmp_path / "none.json"))
    path.write_text(json.dumps(dict(RECORD, patches=[])))
    assert patchset.summary(str(path)).endswith("patches none")


def test_main_prints_the_table_or_the_json_and_refuses_other_arguments(tmp_path, capsys):
    path = tmp_path / "dcu_patchset.json"
    path.write_text(json.dumps(RECORD))
    assert patchset.main([], str(path)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "version  0.18.1+dcu.2.abcdef12" and out[3] == "patches  2"
    assert out[4].split() == ["0001-report-dcu-patchset.patch", "Report"]
    assert patchset.main(["--json"], str(path)) == 0
    assert json.loads(capsys.readouterr().out) == RECORD
    assert patchset.main(["--yaml"], str(path)) == 2
    assert capsys.readouterr().err.strip() == patchset.USAGE
    assert patchset.main([], str(tmp_path / "none.json")) == 1
    assert "no dcu_patchset.json" in capsys.readouterr().err


def test_the_shim_keeps_python_m_vllm_dcu_patchset(vllm_tree):
    """In the patched tree (the tests' tree has a record written by the build tool)."""
    p = subprocess.run([sys.executable, "-m", "vllm.dcu_patchset", "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    rec = json.loads(p.stdout)
    assert rec == json.loads((vllm_tree / "vllm" / "dcu_patchset.json").read_text())
    assert "0001-report-dcu-patchset.patch" in [x["name"] for x in rec["patches"]]
    shim = (vllm_tree / "vllm" / "dcu_patchset.py").read_text()
    assert len(shim.splitlines()) <= 30 and "from vllm.dcu.patchset import" in shim
