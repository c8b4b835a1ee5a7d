"""The layout of the package: the import rule of the wings holds and bites; functions stay short.

The rule (README "Layout") is a set of import-linter contracts in ``pyproject.toml``, the
same ones ``make lint`` checks. Here they run on this checkout, and on a copy of the package
with one forbidden import added, to prove that a wrong import fails the suite.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = ROOT / "src" / "transformer_mt"

#: The shape every function in the package keeps (DESIGN.md): a function that reads on
#: one screen, and calls that name their options. Lines run from ``def`` to the end.
MAX_FUNCTION_LINES = 60
MAX_POSITIONAL = 5


def lint_imports(root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with the contracts of ``root/pyproject.toml`` over ``root/src``."""
    executable = Path(sys.executable).with_name("lint-imports")
    command = [str(executable)] if executable.exists() else [shutil.which("lint-imports") or ""]
    # PYTHONPATH first: analyse this tree, not wherever an editable install points.
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    return subprocess.run(
        [*command, "--no-logo", *extra],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_import_contracts_hold() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout and "KEPT" in result.stdout


@pytest.mark.parametrize(
    ("wing", "forbidden", "contract"),
    [
        ("model", "import lightning", "The model is plain PyTorch"),
        ("inference", "import transformer_mt.training.module", "Wings depend downwards"),
        ("training", "import transformer_mt.sweeps.study", "Wings depend downwards"),
        ("inference", "import transformer_mt.export.convert", "Wings depend downwards"),
        ("export", "import lightning", "Inference, export and the service run without Lightning"),
    ],
)
def test_a_forbidden_import_breaks_a_contract(
    tmp_path: Path, wing: str, forbidden: str, contract: str
) -> None:
    shutil.copytree(PACKAGE, tmp_path / "src" / "transformer_mt")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    culprit = tmp_path / "src" / "transformer_mt" / wing / "culprit.py"
    culprit.write_text(f'"""A file that breaks the rule of the wings."""\n\n{forbidden}\n')

    result = lint_imports(tmp_path, "--no-cache")
    assert result.returncode != 0, result.stdout
    broken = result.stdout.split("Broken contracts", 1)[-1]
    # The contract is reported broken, and the report names the importing module.
    assert f"{contract}" in broken, result.stdout
    assert f"transformer_mt.{wing}.culprit" in broken, result.stdout


def module_imports(package: Path) -> tuple[dict[str, set[str]], list[str]]:
    """Every file-level import inside ``package`` (imports inside functions and under
    ``TYPE_CHECKING`` count) as ``module -> modules it imports``, and each import of another
    file's private ``_name`` as ``"importer: module._name"``."""
    root = package.parent
    files = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def owner(name: str) -> str | None:  # the file that defines module ``name``
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in files}
    private: list[str] = []
    for name, path in files.items():
        package_name = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [(a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package_name.split(".")[: len(package_name.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                targets = [(base, a.name) for a in node.names]
            else:
                continue
            for module, attr in targets:
                full = f"{module}.{attr}" if attr else module
                target = owner(full) if full in files else owner(module)
                if target is None or target == name:
                    continue
                graph[name].add(target)
                if attr and attr.startswith("_") and full not in files:
                    private.append(f"{name}: {target}.{attr}")
    return graph, private


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan): the circles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_and_no_private_import_across_files() -> None:
    graph, private = module_imports(PACKAGE)
    assert "transformer_mt.cli.translate" in graph  # the walk found the package
    assert not import_cycles(graph), f"import cycles between files: {import_cycles(graph)}"
    assert not private, f"imports of another file's private name: {private}"


def test_the_cycle_and_private_import_check_bites(tmp_path: Path) -> None:
    package = tmp_path / "transformer_mt"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    # A circle closed only inside a function, and a private name taken from another file.
    (package / "model" / "culprit_a.py").write_text("from . import culprit_b\n")
    (package / "model" / "culprit_b.py").write_text(
        "def late():\n    from transformer_mt.model.culprit_a import _hidden\n"
    )
    graph, private = module_imports(package)
    assert import_cycles(graph) == [
        ["transformer_mt.model.culprit_a", "transformer_mt.model.culprit_b"]
    ]
    assert private == ["transformer_mt.model.culprit_b: transformer_mt.model.culprit_a._hidden"]


def _modules() -> list[str]:
    return [path.relative_to(PACKAGE).as_posix() for path in sorted(PACKAGE.rglob("*.py"))]


def function_shapes(package: Path) -> dict[str, tuple[int, int]]:
    """``"module.py:name"`` -> (lines, positional parameters other than self/cls)."""
    shapes: dict[str, tuple[int, int]] = {}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = node.args.posonlyargs + node.args.args
                positional = [a for a in args if a.arg not in ("self", "cls")]
                key = f"{path.relative_to(package).as_posix()}:{node.name}"
                worst = shapes.get(key, (0, 0))
                shape = (node.end_lineno - node.lineno + 1, len(positional))  # type: ignore[operator]
                shapes[key] = (max(worst[0], shape[0]), max(worst[1], shape[1]))
    return shapes


def _breaks_shape(shape: tuple[int, int]) -> bool:
    return shape[0] > MAX_FUNCTION_LINES or shape[1] > MAX_POSITIONAL


def test_functions_are_short_with_few_positional_parameters() -> None:
    shapes = function_shapes(PACKAGE)
    bad = [
        f"{key} ({lines} lines, {pos} positional)"
        for key, (lines, pos) in shapes.items()
        if _breaks_shape((lines, pos))
    ]
    assert not bad, (
        f"functions over {MAX_FUNCTION_LINES} lines or with more than {MAX_POSITIONAL} "
        f"positional parameters: split them into named steps, make options keyword-only "
        f"(after *): {', '.join(bad)}"
    )


def test_the_shape_check_bites(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES + 1))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n", encoding="utf-8")
    (tmp_path / "wide.py").write_text("def wide(a, b, c, d, e, f, *, g=1):\n    pass\n")
    (tmp_path / "fine.py").write_text(
        'def fine(self, a, b, c, d, e, *, f=1):\n    """Doc."""\n    return a\n'
    )
    shapes = function_shapes(tmp_path)
    assert shapes["long.py:long"] == (MAX_FUNCTION_LINES + 2, 0)
    assert shapes["wide.py:wide"] == (2, 6)
    assert [key for key, shape in shapes.items() if _breaks_shape(shape)] == [
        "long.py:long",
        "wide.py:wide",
    ]


def test_the_layout_names_every_module_and_the_readme_every_wing() -> None:
    """docs/layout.md's file map stays true (a new module gets its line there), and README
    "Layout" names every wing."""
    layout = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    missing = [name for name in _modules() if Path(name).name != "__init__.py"]
    missing = [name for name in missing if Path(name).name not in layout]
    assert not missing, f"modules not in docs/layout.md; add a line for each: {missing}"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "## Layout" in readme, "README.md has no '## Layout' section"
    section = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    wings = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    assert [w for w in wings if f"{w}/" not in section] == [], wings
    assert len(readme.splitlines()) <= 250, "README.md is the front door: 250 lines at most"


#: Imports every module of the package named by argv[1] (found on sys.path) and prints those
#: whose own code wrote to ``os.environ`` while they were imported (a library's writes are not
#: counted: the writer is the frame that called ``os.environ``'s setter).
ENVIRON_PROBE = """
import importlib, json, os, pkgutil, sys
package = importlib.import_module(sys.argv[1])
root = os.path.dirname(package.__file__)
stdlib = os.path.dirname(os.__file__)
writers = set()
environ_type = type(os.environ)
for method in ("__setitem__", "__delitem__"):
    def spy(self, *args, _original=getattr(environ_type, method)):
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith(("<frozen", stdlib)):
            frame = frame.f_back  # os.environ.setdefault/update call the setter themselves
        if frame is not None and frame.f_code.co_filename.startswith(root):
            writers.add(frame.f_globals.get("__name__"))
        return _original(self, *args)
    setattr(environ_type, method, spy)
for info in pkgutil.walk_packages(package.__path__, sys.argv[1] + "."):
    importlib.import_module(info.name)
print(json.dumps(sorted(writers)))
"""


def modules_setting_the_environment(package: str, path: Path) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(path)}
    for name in ("GOMP_SPINCOUNT", "ONEDNN_PRIMITIVE_CACHE_CAPACITY", "OMP_WAIT_POLICY"):
        env.pop(name, None)  # so that a module setting one of them is seen to
    out = subprocess.run(
        [sys.executable, "-c", ENVIRON_PROBE, package],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return json.loads(out.stdout.splitlines()[-1])


def test_no_module_changes_the_environment_at_import() -> None:
    """Thread, allocator and oneDNN settings are applied by one call at a command's start
    (cli/entry.py), never by importing a module."""
    assert modules_setting_the_environment("transformer_mt", ROOT / "src") == []


def test_the_environment_check_bites(tmp_path: Path) -> None:
    package = tmp_path / "culprits"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "quiet.py").write_text("import os\nSPIN = os.environ.get('X')\n")
    (package / "loud.py").write_text("import os\nos.environ.setdefault('GOMP_SPINCOUNT', '1')\n")
    assert modules_setting_the_environment("culprits", tmp_path) == ["culprits.loud"]


def reading_path(readme: str) -> tuple[int, list[Path]]:
    """The README's reading path: the length it states and the files it lists, in order."""
    import re

    paragraph = readme.split("**Reading the paper's implementation**", 1)[1].split("\n\n", 1)[0]
    stated = re.search(r"about ([\d,]+) lines", paragraph)
    assert stated, "the reading path states no length ('about N lines')"
    names = re.findall(r"`([\w/]+\.py)`", paragraph)
    return int(stated.group(1).replace(",", "")), [PACKAGE / name for name in names]


def test_the_reading_path_is_as_long_as_it_says() -> None:
    stated, files = reading_path((ROOT / "README.md").read_text(encoding="utf-8"))
    assert files and all(f.is_file() for f in files), files
    actual = sum(len(f.read_text(encoding="utf-8").splitlines()) for f in files)
    assert abs(stated - actual) <= 0.1 * actual, (
        f"the README says {stated} lines, they are {actual}"
    )
    assert actual <= 1600, f"the reading path is {actual} lines; keep it at most 1,600"
