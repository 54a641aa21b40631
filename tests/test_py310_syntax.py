"""Every Python file of ours parses as Python 3.10, the contest container's Python (3.10.12); CI runs 3.11.

Checked: dcu/, kernels/, tools/, bench/, ci/, and every Python file the patches touch, as patched in the tree under
test (a patch's added lines are fragments; upstream 0.18.1 itself supports 3.10, so the whole patched file in
3.10's grammar checks what we added). With a Python 3.10 interpreter on the machine (on PATH as python3.10, or a
pyenv 3.10.x) each file is compiled by it: that catches everything, f-strings of 3.12's grammar included. Without
one, `ast.parse(..., feature_version=(3, 10))` in this Python does, which catches most newer syntax (match is 3.10,
`except*` 3.11, type parameters 3.12) but not 3.12's f-string grammar; the test prints which checker ran.
"""
from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FOLDERS = ("dcu", "kernels", "tools", "bench", "ci")
CHECK = """import sys
for path in sys.stdin.read().splitlines():
    try:
        compile(open(path, "rb").read(), path, "exec", dont_inherit=True)
    except SyntaxError as e:
        print(f"{path}:{e.lineno}: {e.msg}")
"""
NEWER = {  # syntax 3.10 rejects, and that the checker must reject
    "except_star.py": "try:\n    pass\nexcept* ValueError:\n    pass\n",
    "type_params.py": "def first[T](xs: list[T]) -> T:\n    return xs[0]\n",
}
NEWER_FSTRING = {"fstring_312.py": "names = ['a']\nprint(f\"{', '.join(names)}\")\nx = f\"{f\"{1}\"}\"\n"}


def python310() -> str | None:
    """A Python 3.10 interpreter here, if any (python3.10 on PATH, else pyenv's 3.10.x)."""
    candidates = [shutil.which("python3.10")]
    pyenv = shutil.which("pyenv")
    if pyenv:
        listed = subprocess.run([pyenv, "versions", "--bare"], capture_output=True, text=True).stdout.split()
        for v in (v for v in listed if re.fullmatch(r"3\.10\.\d+", v)):
            prefix = subprocess.run([pyenv, "prefix", v], capture_output=True, text=True).stdout.strip()
            candidates.append(str(Path(prefix) / "bin" / "python3.10") if prefix else None)
    for exe in filter(None, candidates):
        p = subprocess.run([exe, "-c", "import sys; print(sys.version_info[:2] == (3, 10))"], capture_output=True,
                           text=True)
        if p.returncode == 0 and p.stdout.strip() == "True":
            return exe
    return None


def syntax_errors(files: list[Path], exe: str | None) -> list[str]:
    if exe:
        p = subprocess.run([exe, "-c", CHECK], input="\n".join(map(str, files)), capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        return p.stdout.splitlines()
    bad = []
    for f in files:
        try:
            ast.parse(f.read_bytes(), str(f), feature_version=(3, 10))
        except SyntaxError as e:
            bad.append(f"{f}:{e.lineno}: {e.msg}")
    return bad


def patched_files(tree: Path) -> list[Path]:
    names = set()
    for p in sorted((REPO / "patches").glob("*.patch")):
        names.update(re.findall(r"^\+\+\+ b/(\S+\.py)$", p.read_text(), re.M))
    missing = sorted(n for n in names if not (tree / n).is_file())
    assert not missing, f"files the patches write are not in {tree}: {missing}"
    return [tree / n for n in sorted(names)]


@pytest.fixture(scope="module")
def checker():
    exe = python310()
    print(f"python 3.10 syntax check with {'the interpreter ' + exe if exe else 'ast feature_version=(3, 10)'}")
    return exe


def test_the_checker_rejects_newer_syntax(checker, tmp_path):
    cases = dict(NEWER, **(NEWER_FSTRING if checker else {}))
    for name, src in cases.items():
        (tmp_path / name).write_text(src)
    (tmp_path / "ok.py").write_text("match 1:\n    case 1:\n        pass\n")  # 3.10's own syntax passes
    bad = syntax_errors([tmp_path / n for n in [*cases, "ok.py"]], checker)
    assert sorted(l.split(":")[0] for l in bad) == sorted(str(tmp_path / n) for n in cases), bad


def test_our_python_parses_as_python_310(checker, vllm_tree):
    files = sorted(f for d in FOLDERS for f in (REPO / d).rglob("*.py") if "__pycache__" not in f.parts)
    assert len(files) > 100 and REPO / "tools" / "dcubuild" / "installed.py" in files
    tree = vllm_tree
    if tree is None:
        tree = Path(importlib.util.find_spec("vllm").submodule_search_locations[0]).parent
    files += patched_files(tree)
    assert syntax_errors(files, checker) == []
