"""A non-editable install works outside the source tree: the wheel carries the Hydra configs,
and ``transformer-mt-train`` trains from an empty directory (issue 15, item 5)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import package_source


@pytest.mark.slow
def test_pip_install_then_train_from_a_temp_dir(tmp_path: Path) -> None:
    target = tmp_path / "site"
    source = package_source(tmp_path / "source")
    # --no-deps: the dependencies are this interpreter's; the package itself is a real copy.
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(source)],
        check=True,
        cwd=tmp_path,
    )  # fmt: skip
    assert (target / "transformer_mt" / "configs" / "train.yaml").is_file()
    assert not (target / "transformer_mt" / "configs").is_symlink()
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = subprocess.run(
        [sys.executable, "-c", "import transformer_mt; print(transformer_mt.__file__)"],
        env=env, cwd=work, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert where.stdout.startswith(str(target))  # not the source tree
    for name in ("transformer-mt-train", "transformer-mt-evaluate", "transformer-mt-translate",
                 "transformer-mt-export"):  # fmt: skip
        assert (target / "bin" / name).is_file(), name
    overrides = [
        "model=tiny", "model.d_model=16", "model.n_heads=2", "model.d_ff=32",
        "model.n_encoder_layers=1", "model.n_decoder_layers=1",
        "data.sizes.train=100", "data.sizes.validation=10", "data.sizes.test=10",
        "data.vocab_size=300", "data.cache_dir=null", "callbacks=none", "logger=csv",
        "trainer.max_epochs=1", "trainer.enable_progress_bar=false", "threads=1",
        "run_dir=run",
    ]  # fmt: skip
    result = subprocess.run(
        [sys.executable, str(target / "bin" / "transformer-mt-train"), *overrides],
        env=env, cwd=work, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert list((work / "run" / "checkpoints").glob("*.ckpt"))
    assert (work / "run" / "tokenizer.json").is_file()
