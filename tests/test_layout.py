"""The layout of the package: the import rule of the wings bites.

The rule (README "Layout") is a set of import-linter contracts in ``pyproject.toml``, the
same ones ``make lint`` checks. Here they run on a copy of the package with one forbidden
import added, to prove that a wrong import fails them.
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
