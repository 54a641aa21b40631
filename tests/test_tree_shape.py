"""The shape of our Python packages (issue #47): every file of kernels/, dcu/, bench/, tools/ and ci/ is at most
MAX_LINES lines, and no module of ours imports itself back through others (no import circle).

The import graph is read from the source with ast, every import statement counted (those inside functions too: a
lazy import still makes a circle for a reader, and runs one at call time). Relative imports are resolved against the
module's package; the names a build installs our packages under (vllm.dcu_kernels, vllm.dcu: tools/dcubuild/tree.py
PACKAGES) map back to the folders. ``from pkg import name`` is an edge to pkg.name where that is a module of ours,
else to pkg (its __init__). A package's __init__ importing its own modules is an edge like any other; the implicit
"a submodule's import runs its package's __init__ first" is not (every submodule would close a circle with it).
"""
from __future__ import annotations

import ast
from pathlib import Path

from tools.dcubuild.tree import PACKAGES

REPO = Path(__file__).resolve().parent.parent
FOLDERS = ("kernels", "dcu", "bench", "tools", "ci")
MAX_LINES = 450
# installed name -> the folder's name in the checkout (vllm.dcu_kernels -> kernels, vllm.dcu -> dcu)
INSTALLED = {f"vllm.{installed}": folder for folder, installed in PACKAGES}


def python_files(root: Path, folders=FOLDERS) -> list[Path]:
    return sorted(p for folder in folders for p in (root / folder).rglob("*.py") if "__pycache__" not in p.parts)


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _checkout_name(name: str) -> str:
    for installed, folder in INSTALLED.items():
        if name == installed or name.startswith(installed + "."):
            return folder + name[len(installed):]
    return name


def imports_of(root: Path, path: Path, modules: set[str]) -> set[str]:
    """The modules of ours (names in ``modules``) that the file at ``path`` imports anywhere in its body."""
    name = module_name(root, path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()

    def add(target: str):
        target = _checkout_name(target)
        while target and target not in modules:  # a.b.c where only a.b is ours as a file: a.b
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                if node.level - 1 > len(package.split(".")) - 1:
                    continue  # beyond the top-level package (never valid in the checkout)
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = _checkout_name(node.module or "")
            for alias in node.names:
                sub = f"{mod}.{alias.name}"
                add(sub if _checkout_name(sub) in modules else mod)
    return found


def import_graph(root: Path, folders=FOLDERS) -> dict[str, set[str]]:
    files = python_files(root, folders)
    modules = {module_name(root, p) for p in files}
    return {module_name(root, p): imports_of(root, p, modules) for p in files}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: every import circle."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_every_python_file_of_ours_is_at_most_450_lines():
    files = python_files(REPO)
    assert len(files) > 100  # the folders were found
    long = {str(p.relative_to(REPO)): n for p in files if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines (split them by what they hold): {long}"


def test_no_import_circle_among_our_modules():
    graph = import_graph(REPO)
    # the graph is real: the edges this layout is built on are seen (relative, installed name, lazy import)
    assert "kernels.decode_attention.splits" in graph["kernels.decode_attention.gluon_stage1"]
    assert "kernels.decode_attention.codes" in graph["kernels.prefill_attention.prefill_kernel"]
    assert "kernels.decode_attention.gluon_stage1" in graph["kernels.decode_attention.planning"]  # inside a function
    assert "bench.sched_sim_scenarios" in graph["bench.sched_sim_engine"]
    assert circles(graph) == []


def _write(root: Path, files: dict[str, str]):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_the_circle_finder_finds_a_synthetic_circle(tmp_path):
    # kernels/a -> kernels/sub/b (relative, in a function) -> kernels/c (parent-relative) -> kernels/a (absolute, by
    # the installed name); dcu/d -> kernels/a only: not in the circle
    _write(tmp_path, {
        "kernels/__init__.py": "",
        "kernels/a.py": "def f():\n    from .sub import b\n",
        "kernels/sub/__init__.py": "",
        "kernels/sub/b.py": "from ..c import thing\n",
        "kernels/c.py": "import vllm.dcu_kernels.a\nthing = 1\n",
        "dcu/__init__.py": "",
        "dcu/d.py": "from kernels import a\n",
    })
    graph = import_graph(tmp_path, ("kernels", "dcu"))
    assert graph["kernels.a"] == {"kernels.sub.b"}
    assert graph["kernels.sub.b"] == {"kernels.c"}
    assert graph["kernels.c"] == {"kernels.a"}
    assert graph["dcu.d"] == {"kernels.a"}
    assert circles(graph) == [["kernels.a", "kernels.c", "kernels.sub.b"]]
    # cut one edge: no circle
    (tmp_path / "kernels/c.py").write_text("thing = 1\n")
    assert circles(import_graph(tmp_path, ("kernels", "dcu"))) == []


def test_the_line_bound_sees_a_long_file(tmp_path):
    _write(tmp_path, {"bench/long.py": "x = 1\n" * (MAX_LINES + 1), "bench/short.py": "x = 1\n" * MAX_LINES})
    long = [p.name for p in python_files(tmp_path, ("bench",)) if len(p.read_text().splitlines()) > MAX_LINES]
    assert long == ["long.py"]


# --- one import path: dcu/ takes the kernels from dcu/_kernels.py only ------------------------------------------

def _type_checking_imports(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """What _kernels.py's TYPE_CHECKING block imports: name -> (module of the checkout, the name imported from it)."""
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    names = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.module.split(".")[0] == "kernels", ast.dump(node)
        for alias in node.names:
            names[alias.asname or alias.name] = (node.module, alias.name)
    return names


def test_dcu_names_the_kernels_package_in_one_module_only_and_itself_relatively():
    import importlib

    from dcu import _kernels

    static = _type_checking_imports(ast.parse((REPO / "dcu" / "_kernels.py").read_text()))
    assert set(static) == set(_kernels.NAMES)
    for name, (module, attr) in static.items():  # what an editor follows is what runs
        mod = importlib.import_module(module)  # `from module import attr`: its attribute, else its submodule
        want = getattr(mod, attr) if hasattr(mod, attr) else importlib.import_module(f"{module}.{attr}")
        assert getattr(_kernels, name) is want, name
    others = []
    for path in python_files(REPO, ("dcu",)):
        if path.name == "_kernels.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            # the kernels by either name, or dcu/ itself by its installed name (a sibling is a relative import)
            others += [f"{path.relative_to(REPO)}:{node.lineno} {m}" for m in mods
                       if m.split(".")[0] == "kernels" or m.startswith("vllm.dcu_kernels")
                       or m == "vllm.dcu" or m.startswith("vllm.dcu.")]
    assert not others, others


def test_dcu_kernels_resolve_by_the_name_dcu_was_imported_under(vllm_tree):
    import importlib

    from dcu import _kernels

    assert _kernels.PACKAGE == "kernels"
    for name, (module, attr) in _kernels.NAMES.items():
        mod = importlib.import_module(f"kernels.{module}")
        assert getattr(_kernels, name) is (mod if attr is None else getattr(mod, attr)), name
    try:
        _kernels.no_such_name
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("an unknown name must raise AttributeError")
    if vllm_tree is not None:  # the tests' tree: the same file as vllm.dcu._kernels resolves the installed name
        installed = importlib.import_module("vllm.dcu._kernels")
        assert installed.PACKAGE == "vllm.dcu_kernels"
        assert installed.decisions.__name__ == "vllm.dcu_kernels.tuning.decisions"
