"""Plots of a stored Optuna study, at any time, from any machine that reaches its storage.

    python scripts/study_plots.py sqlite:///outputs/.../optuna.db numbers --out plots/

Writes optimization_history.png, intermediate_values.png (pruned trials included),
param_importances.png and parallel_coordinate.png, as a sweep does when it ends.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from transformer_mt.errors import EXIT_USER_ERROR, UserError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("storage", help="the study's storage: a SQLAlchemy URL or journal:<file>")
    parser.add_argument("study_name", help="hydra.sweeper.study_name of the sweep")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for the PNG files")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    import optuna

    from transformer_mt.sweeps.plots import write_plots
    from transformer_mt.training.pruning import open_storage

    try:
        storage = open_storage(args.storage)
        study = optuna.load_study(study_name=args.study_name, storage=storage)
    except (UserError, KeyError) as err:
        names = ""
        if isinstance(err, KeyError):
            stored = [s.study_name for s in optuna.get_all_study_summaries(storage)]
            names = f"; the storage holds: {', '.join(stored) or 'no study'}"
        print(f"error: {' '.join(str(err).split())}{names}", file=sys.stderr)
        return EXIT_USER_ERROR
    args.out.mkdir(parents=True, exist_ok=True)
    for path in write_plots(study, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
