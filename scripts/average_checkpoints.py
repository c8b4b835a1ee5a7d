"""Average the parameters of the last or best N checkpoints of a run into a new checkpoint.

    python scripts/average_checkpoints.py RUN_DIR --last 5 -o RUN_DIR/checkpoints/avg_last5.ckpt
    python scripts/average_checkpoints.py RUN_DIR --best 3 -o avg_best3.ckpt
    python scripts/average_checkpoints.py --inputs a.ckpt b.ckpt -o avg.ckpt

"Best" ranks by the val/bleu in the file name (or in the checkpoint's ModelCheckpoint state).
The result holds the model config and tokenizer, so evaluate.py and the translate command
accept it; it has no optimizer state (it cannot resume training: fine-tune from it with
``train.py init_from=``). ``-o`` never replaces a file it did not write: an existing output is
refused unless it is an average this script wrote, and then only with ``--force``.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any, NamedTuple

from transformer_mt.checkpoint import (
    CheckpointError,
    CheckpointNotFoundError,
    load_checkpoint,
    save_checkpoint,
)
from transformer_mt.errors import EXIT_USER_ERROR, one_line
from transformer_mt.files import check_outputs_apart
from transformer_mt.inference.averaging import average_checkpoints, is_average, stored_val_bleu

log = logging.getLogger("average_checkpoints")

STEP_RE = re.compile(r"step[=_-]?(\d+)")
BLEU_RE = re.compile(r"bleu[=_-]?(\d+(?:\.\d+)?)")


class CheckpointInfo(NamedTuple):
    """A checkpoint file of a run with its step and validation score (``None`` if unknown)."""

    path: Path
    step: int | None
    score: float | None


def run_checkpoints(run_dir: str | os.PathLike[str]) -> list[CheckpointInfo]:
    """The checkpoints of a run directory (``<run_dir>/checkpoints/*.ckpt`` or ``*.ckpt``).

    The step and val/bleu come from the file name (``...-step000120-bleu12.34.ckpt``); where
    the name lacks them, from the checkpoint itself (``global_step`` and the ModelCheckpoint
    callback state). ``last.ckpt`` is skipped when another file holds the same step.
    """
    run_dir = Path(run_dir)
    folder = run_dir / "checkpoints" if (run_dir / "checkpoints").is_dir() else run_dir
    if not folder.is_dir():
        raise CheckpointNotFoundError(
            f"run directory {run_dir} does not exist; pass the directory train.py wrote "
            "(it holds checkpoints/)"
        )
    infos: list[CheckpointInfo] = []
    for path in sorted(folder.glob("*.ckpt")):
        step_match, bleu_match = STEP_RE.search(path.name), BLEU_RE.search(path.name)
        step = int(step_match.group(1)) if step_match else None
        score = float(bleu_match.group(1)) if bleu_match else None
        if step is None or score is None:
            checkpoint = load_checkpoint(path)
            if step is None and checkpoint.get("global_step") is not None:
                step = int(checkpoint["global_step"])
            if score is None:
                score = stored_val_bleu(checkpoint)
        infos.append(CheckpointInfo(path, step, score))
    # One file per step: last.ckpt and the "best" and "recent" callbacks may save one step
    # twice; prefer a named file, and one whose score is known.
    unique: dict[Any, CheckpointInfo] = {}
    for info in sorted(infos, key=lambda i: (i.path.name == "last.ckpt", i.score is None)):
        unique.setdefault(info.step if info.step is not None else info.path, info)
    infos = sorted(unique.values(), key=lambda i: (i.step or 0, i.path.name))
    if not infos:
        raise CheckpointNotFoundError(
            f"no .ckpt files in {folder}; train first (python train.py) or pass another run"
        )
    return infos


#: The callback that keeps the checkpoints each mode reads: the best by val/bleu, the latest.
KEEP_OPTION = {
    "best": "callbacks.model_checkpoint.save_top_k",
    "last": "callbacks.recent_checkpoints.save_top_k",
}


def select_checkpoints(run_dir: str | os.PathLike[str], n: int, mode: str = "last") -> list[Path]:
    """The ``n`` latest (``mode="last"``, by step) or best (``"best"``, by val/bleu) checkpoints.

    Raises:
        CheckpointError: ``n`` < 1, an unknown mode, or fewer than ``n`` usable checkpoints.
    """
    if n < 1:
        raise CheckpointError(f"number of checkpoints to average must be >= 1, got {n}")
    if mode not in ("last", "best"):
        raise CheckpointError(f"mode must be 'last' or 'best', got {mode!r}")
    infos = run_checkpoints(run_dir)
    key_name = "step" if mode == "last" else "score"
    usable = [i for i in infos if getattr(i, key_name) is not None]
    if len(usable) < n:
        raise CheckpointError(
            f"{run_dir} has {len(usable)} checkpoints with a known {key_name} "
            f"({', '.join(i.path.name for i in usable) or 'none'}), fewer than the {n} asked "
            f"for; ask for fewer, or train with {KEEP_OPTION[mode]}=N"
        )
    usable.sort(key=lambda i: (getattr(i, key_name), i.step or 0), reverse=True)
    chosen = usable[:n]
    log.info("averaging the %s %d: %s", mode, n, ", ".join(f"{i.path.name}" for i in chosen))
    return [i.path for i in chosen]


def check_replaceable(output: Path, force: bool) -> None:
    """An existing ``output`` may be replaced only if it is an average (``--force``).

    Raises:
        ValueError: one line: a file this script did not write (a run's resumable
            checkpoint, say), or an earlier average without ``--force``.
    """
    if not output.exists():
        return
    if not is_average(output):
        raise ValueError(
            f"-o {output} exists and is not an average of checkpoints (a run's checkpoint, or "
            "another file); it would be replaced: give a new path"
        )
    if not force:
        raise ValueError(f"-o {output} holds an earlier average; pass --force to replace it")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", nargs="?", help="run directory of train.py (holds checkpoints/)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--last", type=int, metavar="N", help="average the N latest checkpoints")
    which.add_argument("--best", type=int, metavar="N", help="average the N best by val/bleu")
    which.add_argument("--inputs", nargs="+", metavar="CKPT", help="average these checkpoints")
    parser.add_argument("-o", "--output", required=True, help="where to write the average")
    parser.add_argument("--force", action="store_true", help="replace an average written before")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        if args.inputs:
            paths = list(args.inputs)
        elif args.run_dir and (args.last or args.best):
            mode, n = ("last", args.last) if args.last else ("best", args.best)
            paths = select_checkpoints(args.run_dir, n, mode)
        else:
            parser.error("give RUN_DIR with --last N or --best N, or --inputs CKPT ...")
        check_outputs_apart([("-o", args.output)], [("input", p) for p in paths])
        check_replaceable(Path(args.output), args.force)
        averaged = average_checkpoints(paths)
        out = save_checkpoint(averaged, args.output)
    except (CheckpointError, ValueError, OSError) as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        return EXIT_USER_ERROR
    log.info("averaged %d checkpoints into %s", len(paths), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
