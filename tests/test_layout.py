"""The layout of the package: the import rule of the wings holds and bites; files stay short.

The rule (README "Layout") is a set of import-linter contracts in ``pyproject.toml``, the
same ones ``make lint`` checks. Here they run on this checkout, and on a copy of the package
with one forbidden import added, to prove that a wrong import fails the suite.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "transformer_mt"

#: About 300 lines, with a little slack so that a docstring edit does not fail the suite.
MAX_LINES = 320
#: Files allowed to be longer, relative to the package, and why.
LONG_FILES = {
    "data/tokenizer.py": (
        "one class, the Tokenizer, with all three of its on-disk formats (standard "
        "tokenizer.json files, the checkpoint string, the legacy one-file format) side by side"
    ),
}


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


def _line_counts() -> dict[str, int]:
    return {
        path.relative_to(PACKAGE).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_source_files_are_short_or_listed_with_a_reason() -> None:
    counts = _line_counts()
    too_long = [f"{name} ({n} lines)" for name, n in counts.items() if n > MAX_LINES]
    unexplained = [entry for entry in too_long if entry.split(" ")[0] not in LONG_FILES]
    assert not unexplained, (
        f"files over {MAX_LINES} lines: split them by concept, or add them to LONG_FILES in "
        f"tests/test_layout.py with the reason they stay long: {', '.join(unexplained)}"
    )
    # The allow-list cannot rot: every entry is still a file, and still long.
    stale = [name for name in LONG_FILES if counts.get(name, 0) <= MAX_LINES]
    assert not stale, f"LONG_FILES entries that are gone or short now; remove them: {stale}"


def test_readme_layout_names_every_module() -> None:
    """The file map in README "Layout" stays true: a new module gets its line there."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "## Layout" in readme, "README.md has no '## Layout' section"
    layout = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    missing = [name for name in _line_counts() if Path(name).name != "__init__.py"]
    missing = [name for name in missing if Path(name).name not in layout]
    assert not missing, f"modules not in README 'Layout'; add a line for each: {missing}"
