"""The error catalogue (docs/errors.md), driven as a user would.

Each case runs an installed command (``transformer-mt-translate``, ``-export``, ``-evaluate``,
``-train``) as a subprocess on a tiny random checkpoint and asserts three things: the exit
status, exactly one ``error:`` line on stderr with the cause and the fix (no traceback), and
that every file that existed before the command is byte-identical afterwards (SHA-256 of the
whole sandbox: the checkpoints, the inputs, the exported models, the user's own files).

The checkpoints are built once per module without training: the format-v1 fixture's tokenizer
with a random model, and a second one with another tokenizer of the same size, whose
CTranslate2 export is the "model of another checkpoint".
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from transformer_mt.checkpoint import CHECKPOINT_KEY, load_checkpoint, save_checkpoint
from transformer_mt.data.tokenizer import Tokenizer
from transformer_mt.model.transformer import ModelConfig, Transformer

from conftest import FAST_TRAIN, FIXTURES

#: A subprocess per case (each imports torch): tens of seconds in all, so `make test-all` runs
#: it; tests/test_files.py, cli/test_translate.py and export/test_export.py hold in-process
#: checks of the same rules for the default suite.
pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
FIXTURE_V1 = FIXTURES / "format_v1" / "model.ckpt"
LATIN1 = "Zwei Männer stehen am Herd.\nEin Mädchen läuft.\n".encode("latin-1")


def random_checkpoint(path: Path, tokenizer: Tokenizer | None = None) -> Path:
    """The fixture's checkpoint with random weights (and ``tokenizer``, if given)."""
    checkpoint = load_checkpoint(FIXTURE_V1)
    meta = checkpoint[CHECKPOINT_KEY]
    values = dict(meta["model_config"])
    if tokenizer is not None:
        meta["tokenizer"] = tokenizer.to_json()
        values.update(
            src_vocab_size=tokenizer.src_vocab_size, tgt_vocab_size=tokenizer.tgt_vocab_size
        )
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**values))
    meta["model_config"] = model.config.to_dict()
    checkpoint["state_dict"] = {f"model.{k}": v for k, v in model.state_dict().items()}
    return save_checkpoint(checkpoint, path)


def other_tokenizer(like: Tokenizer) -> Tokenizer:
    """A tokenizer of the same size as ``like`` trained on other text: other subwords."""
    text = [[f"zebra {i} quokka {i * 7} xylophon" for i in range(400)]]
    return Tokenizer.train(
        text,
        text,
        vocab_size=like.src_vocab_size,
        joint=True,
        min_frequency=1,
        src_lang=like.src_lang,
        tgt_lang=like.tgt_lang,
    )


@dataclass
class Sandbox:
    root: Path
    run: Path  # a training run directory: checkpoints/best.ckpt and last.ckpt
    ckpt: Path
    other_ckpt: Path
    ct2: Path | None  # CTranslate2 export of ckpt
    other_ct2: Path | None  # CTranslate2 export of other_ckpt


def _ct2_export(ckpt: Path, out: Path) -> Path | None:
    try:
        import ctranslate2  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return None
    from transformer_mt.export.convert import export_ctranslate2, export_huggingface

    hf = export_huggingface(ckpt, out.with_name(out.name + "-hf"))
    return export_ctranslate2(hf, out)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Sandbox:
    if not (BIN / "transformer-mt-translate").exists():
        pytest.skip(f"the installed commands are not in {BIN}; run `make setup`")
    root = tmp_path_factory.mktemp("catalogue")
    run = root / "run"
    ckpt = random_checkpoint(run / "checkpoints" / "best.ckpt")
    shutil.copy2(ckpt, run / "checkpoints" / "last.ckpt")
    other = random_checkpoint(
        root / "other" / "model.ckpt", other_tokenizer(Tokenizer.from_json(_tokenizer_json(ckpt)))
    )
    (root / "in.en").write_text("Two men stand at the stove.\nA girl runs.\n", encoding="utf-8")
    (root / "ref.de").write_text("Zwei Männer stehen am Herd.\nEin Mädchen läuft.\n", "utf-8")
    (root / "latin1.de").write_bytes(LATIN1)
    (root / "empty.en").write_bytes(b"")
    (root / "mine").mkdir()
    (root / "mine" / "notes.txt").write_text("my own files\n")
    (root / "afile").write_text("a regular file\n")
    ct2 = _ct2_export(ckpt, root / "ct2")
    other_ct2 = _ct2_export(other, root / "other_ct2")
    return Sandbox(root, run, ckpt, other, ct2, other_ct2)


def _tokenizer_json(ckpt: Path) -> str:
    return load_checkpoint(ckpt)[CHECKPOINT_KEY]["tokenizer"]


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def run_command(
    box: Sandbox, argv: list[str], cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """Run an installed command in the sandbox; every file there must be unchanged after."""
    before = snapshot(box.root)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    env.pop("TRANSFORMER_MT_DEBUG", None)
    env.pop("HYDRA_FULL_ERROR", None)
    done = subprocess.run(
        [str(BIN / argv[0]), *argv[1:]],
        cwd=cwd or box.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    after = snapshot(box.root)
    changed = sorted(k for k in before if after.get(k) != before[k])
    assert not changed, f"files changed or removed: {changed}\n{done.stderr}"
    return done


def error_line(done: subprocess.CompletedProcess) -> str:
    """The one ``error:`` line; nothing that looks like a traceback around it."""
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    return errors[0]


def expect(
    box: Sandbox, argv: list[str], *parts: str, status: int = 2, cwd: Path | None = None
) -> str:
    done = run_command(box, argv, cwd)
    assert done.returncode == status, done.stderr
    line = error_line(done)
    for part in parts:
        assert part in line, line
    return line


def needs_ct2(box: Sandbox) -> None:
    if box.ct2 is None or box.other_ct2 is None:
        pytest.skip("needs the export extra (transformers, ctranslate2)")


# ----------------------------------------------------------------------------- export


def test_export_refuses_an_out_that_holds_the_checkpoint(sandbox: Sandbox) -> None:
    for out in (sandbox.run / "checkpoints", sandbox.run):
        line = expect(
            sandbox,
            ["transformer-mt-export", "--ckpt", str(sandbox.ckpt), "--out", str(out), "--force"],
            f"--out {out} contains the --ckpt {sandbox.ckpt}",
            "choose another --out",
        )
        assert line.startswith("error: --out ")


def test_export_force_replaces_only_a_previous_export(sandbox: Sandbox, tmp_path: Path) -> None:
    mine = sandbox.root / "mine"
    expect(
        sandbox,
        ["transformer-mt-export", "--ckpt", str(sandbox.ckpt), "--out", str(mine), "--force"],
        f"--out {mine} is not a previous export (it has no .transformer-mt-export file)",
    )
    # `--out .` from the user's directory: the same answer, no Python internals.
    expect(
        sandbox,
        ["transformer-mt-export", "--ckpt", str(sandbox.ckpt), "--out", ".", "--force"],
        "is not a previous export",
        cwd=mine,
    )
    expect(
        sandbox,
        ["transformer-mt-export", "--ckpt", str(sandbox.ckpt), "--out", str(mine)],
        "exists and is not empty; pass --force to replace a previous export",
    )


def test_export_out_below_a_file_or_on_a_file(sandbox: Sandbox) -> None:
    afile = sandbox.root / "afile"
    expect(
        sandbox,
        ["transformer-mt-export", "--ckpt", str(sandbox.ckpt), "--out", str(afile / "x")],
        f"lies below {afile}, which is a file, not a directory; choose another path",
    )
    expect(
        sandbox,
        ["transformer-mt-export", "--ckpt", str(sandbox.ckpt), "--out", str(afile)],
        f"--out {afile} is a file; pass a directory path",
    )


# ----------------------------------------------------------------------------- translate


def translate(box: Sandbox, *args: str) -> list[str]:
    return ["transformer-mt-translate", "--ckpt", str(box.ckpt), "-q", *args]


def test_translate_refuses_to_write_over_its_input_or_checkpoint(sandbox: Sandbox) -> None:
    src = sandbox.root / "in.en"
    expect(sandbox, translate(sandbox, "-i", str(src), "-o", str(src)), f"is the --input {src}")
    expect(
        sandbox,
        translate(sandbox, "-i", str(src), "-o", str(sandbox.ckpt)),
        f"is the --ckpt {sandbox.ckpt}",
    )
    mine = sandbox.root / "mine"
    expect(
        sandbox,
        translate(sandbox, "-i", str(src), "-o", str(mine)),
        f"--output {mine} is a directory",
    )


def test_translate_reads_utf8_strictly(sandbox: Sandbox, tmp_path: Path) -> None:
    latin1 = sandbox.root / "latin1.de"
    expect(
        sandbox,
        translate(sandbox, "-i", str(latin1)),
        f"{latin1}, line 1: not valid UTF-8",
        "--errors replace",
    )
    out = tmp_path / "out.txt"
    done = run_command(
        sandbox, translate(sandbox, "-i", str(latin1), "-o", str(out), "--errors", "replace")
    )
    assert done.returncode == 0, done.stderr
    assert len(out.read_text(encoding="utf-8").splitlines()) == 2


def test_translate_names_a_missing_input_and_flags_in_its_own_syntax(sandbox: Sandbox) -> None:
    missing = sandbox.root / "nope.en"
    expect(sandbox, translate(sandbox, "-i", str(missing)), f"--input {missing} does not exist")
    line = expect(sandbox, translate(sandbox, "--beam-size", "0"), "--beam-size 1")
    assert "decoding.beam_size" not in line


def test_translate_refuses_a_ct2_model_of_another_checkpoint(sandbox: Sandbox) -> None:
    needs_ct2(sandbox)
    expect(
        sandbox,
        translate(sandbox, "--engine", "ctranslate2", "--ct2-model", str(sandbox.other_ct2)),
        f"the CTranslate2 model {sandbox.other_ct2} was exported from a checkpoint with "
        "another tokenizer",
        "different source subwords",
    )
    expect(
        sandbox,
        translate(sandbox, "--engine", "ctranslate2", "--ct2-model", str(sandbox.root / "mine")),
        "is not a CTranslate2 model directory (no model.bin)",
    )
    expect(
        sandbox,
        translate(
            sandbox,
            "--engine",
            "ctranslate2",
            "--ct2-model",
            str(sandbox.ct2),
            "--compute-type",
            "int3",
        ),
        "unknown compute type 'int3'; on cpu CTranslate2 runs ",
        "float32",
    )


#: case -> (the command, given the sandbox; what its one error line says). Each is refused
#: before any work that the check does not need, naming the input the user gave.
REFUSALS = {
    "an unknown device": (
        lambda b: translate(b, "-i", str(b.root / "in.en"), "--device", "tpu"),
        ["device tpu is not a device this torch can use; use --device cpu"],
    ),
    "a text file as the checkpoint": (
        lambda b: [*translate(b, "-i", str(b.root / "in.en"))[:1], "--ckpt", str(b.root / "afile")],
        ["afile is not a PyTorch checkpoint (torch.load cannot read it as one)"],
    ),
    "a full device as the output": (
        lambda b: translate(b, "-i", str(b.root / "in.en"), "-o", "/dev/full"),
        ["cannot use /dev/full: No space left on device"],
    ),
    "a directory as the scores' output": (
        lambda b: [
            "transformer-mt-score", "--ckpt", str(b.ckpt), "--source", str(b.root / "in.en"),
            "--target", str(b.root / "ref.de"), "-o", str(b.root / "mine"),
        ],
        ["--output", "mine is a directory; give a file path"],
    ),
    "an export into /proc": (
        lambda b: ["transformer-mt-export", "--ckpt", str(b.ckpt), "--out", "/proc/foo"],
        ["--out /proc/foo cannot be written: /proc takes no new file"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refused_at_once_naming_the_input(sandbox: Sandbox, case: str) -> None:
    command, parts = REFUSALS[case]
    line = expect(sandbox, command(sandbox), *parts)
    assert ".tmp" not in line and ".partial" not in line and "Error:" not in line


# ----------------------------------------------------------------------------- evaluate


def evaluate(box: Sandbox, tmp_path: Path, *overrides: str) -> list[str]:
    return [
        "transformer-mt-evaluate",
        f"ckpt_path={box.ckpt}",
        f"hydra.run.dir={tmp_path / 'eval'}",
        "progress=false",
        *overrides,
    ]


def test_evaluate_reads_utf8_strictly(sandbox: Sandbox, tmp_path: Path) -> None:
    src, latin1 = sandbox.root / "in.en", sandbox.root / "latin1.de"
    expect(
        sandbox,
        evaluate(sandbox, tmp_path, f"source_file={src}", f"reference_file={latin1}"),
        f"{latin1}, line 1: not valid UTF-8",
        "errors=replace",
    )


def test_evaluate_refuses_outputs_over_inputs(sandbox: Sandbox, tmp_path: Path) -> None:
    src, ref = sandbox.root / "in.en", sandbox.root / "ref.de"
    files = (f"source_file={src}", f"reference_file={ref}")
    expect(
        sandbox,
        evaluate(sandbox, tmp_path, *files, f"hypotheses_path={ref}"),
        f"hypotheses_path {ref} is the reference_file {ref}",
    )
    expect(
        sandbox,
        evaluate(sandbox, tmp_path, *files, f"results_path={sandbox.ckpt}"),
        f"results_path {sandbox.ckpt} is the ckpt_path {sandbox.ckpt}",
    )


def test_evaluate_of_nothing_is_an_error(sandbox: Sandbox, tmp_path: Path) -> None:
    expect(
        sandbox,
        evaluate(sandbox, tmp_path, f"source_file={sandbox.root / 'empty.en'}"),
        "nothing to evaluate",
    )


def test_evaluate_names_a_checkpoint_file_for_a_directory(sandbox: Sandbox, tmp_path: Path) -> None:
    folder = sandbox.run / "checkpoints"
    line = expect(
        sandbox,
        [*evaluate(sandbox, tmp_path), f"ckpt_path={folder}"],
        f"checkpoint path {folder} is a directory",
        f"pass a file such as {folder / 'last.ckpt'}",
    )
    assert "checkpoints/checkpoints" not in line


def test_evaluate_refuses_a_ct2_model_of_another_checkpoint(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    needs_ct2(sandbox)
    src, ref = sandbox.root / "in.en", sandbox.root / "ref.de"
    expect(
        sandbox,
        evaluate(
            sandbox,
            tmp_path,
            f"source_file={src}",
            f"reference_file={ref}",
            "engine=ctranslate2",
            f"engine_model={sandbox.other_ct2}",
        ),
        "was exported from a checkpoint with another tokenizer",
    )


# ----------------------------------------------------------------------------- sweeps


def test_a_failed_multirun_job_exits_2_with_its_reason_once(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    done = run_command(
        sandbox,
        [
            "transformer-mt-train",
            "-m",
            *FAST_TRAIN,
            "model.d_model=30",
            "model.n_heads=4",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
        ],
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    reason = "model.d_model=30 is not divisible by model.n_heads=4"
    assert done.stderr.count(reason) == 1, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if reason in line]
    assert line.startswith("error: job #0 (")
    # That line alone: not Hydra's "Error executing job with overrides" before it.
    assert "Error executing job" not in done.stderr, done.stderr
