"""The layout of the package: the import rule of the wings holds and bites; functions stay short.

The rule (README "Layout") is a set of import-linter contracts in ``pyproject.toml``, the
same ones ``make lint`` checks. Here they run on this checkout, and on a copy of the package
with one forbidden import added, to prove that a wrong import fails the suite.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = ROOT / "src" / "transformer_mt"

#: The shape every function in the package keeps (DESIGN.md, "Style"): a function that reads on
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


def test_readme_layout_names_every_module() -> None:
    """The file map in README "Layout" stays true: a new module gets its line there."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "## Layout" in readme, "README.md has no '## Layout' section"
    layout = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    missing = [name for name in _modules() if Path(name).name != "__init__.py"]
    missing = [name for name in missing if Path(name).name not in layout]
    assert not missing, f"modules not in README 'Layout'; add a line for each: {missing}"
