"""The wheel: built without a setuptools warning, it carries the Hydra configs and the page,
and its commands run from an empty directory (no checkout on the path)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT, package_source


def build_wheel(tmp_path: Path) -> tuple[Path, str]:
    """A wheel built from a copy of the tree (setuptools writes build/ into what it builds)."""
    source = package_source(tmp_path / "source")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True, text=True, check=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("transformer_mt-*.whl")
    return wheel, built.stdout + built.stderr


@pytest.mark.slow  # a wheel build from a copy of the tree
def test_the_wheel_builds_without_warnings_and_holds_the_configs(tmp_path: Path) -> None:
    wheel, output = build_wheel(tmp_path)
    assert "Package would be ignored" not in output and "Warning" not in output, output
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").rglob("*.yaml"))
    missing = [c for c in configs if f"transformer_mt/{c}" not in names]
    assert not missing, f"configs the wheel lacks: {missing}"
    assert "transformer_mt/serve/static/index.html" in names

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    # The wheel's copy is what runs, not the checkout an editable install points at.
    assert str(site) in subprocess.run(
        [sys.executable, "-c", "import transformer_mt; print(transformer_mt.__file__)"],
        cwd=empty, env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    composed = subprocess.run(
        [sys.executable, "-m", "transformer_mt.cli.train", "--cfg", "job", "--resolve",
         "run_dir=out"],
        cwd=empty, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert composed.returncode == 0, composed.stderr[-2000:]
    assert "task_name: numbers_en_de_tiny" in composed.stdout
    for command in ("evaluate", "translate", "score", "export", "serve"):
        shown = subprocess.run(
            [sys.executable, "-m", f"transformer_mt.cli.{command}", "--help"],
            cwd=empty, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert shown.returncode == 0, (command, shown.stderr[-2000:])
