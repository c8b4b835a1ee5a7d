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
import sys
from pathlib import Path

from transformer_mt.checkpoint import (
    CheckpointError,
    save_checkpoint,
)
from transformer_mt.errors import EXIT_USER_ERROR, one_line
from transformer_mt.files import check_outputs_apart
from transformer_mt.inference.averaging import (
    average_checkpoints,
    is_average,
    select_checkpoints,
)

log = logging.getLogger("average_checkpoints")


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
