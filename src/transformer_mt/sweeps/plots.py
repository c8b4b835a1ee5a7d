"""PNG plots of a study, with Optuna's matplotlib visualisation.

Written when a sweep ends, or by ``scripts/study_plots.py``. A plot the study is too young for
is skipped, with its reason in the log, instead of Optuna's empty figure.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: File name -> Optuna plot function name (optuna.visualization.matplotlib).
PLOTS = {
    "optimization_history.png": "plot_optimization_history",
    "intermediate_values.png": "plot_intermediate_values",
    "param_importances.png": "plot_param_importances",
    "parallel_coordinate.png": "plot_parallel_coordinate",
}


def missing(name: str, study: Any) -> str | None:
    """Why ``study`` cannot have the plot ``name`` yet (None: it can)."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    complete = sum(t.state == TrialState.COMPLETE for t in trials)
    if name == "intermediate_values.png":
        if not any(t.intermediate_values for t in trials):
            return "no trial has reported a value yet"
        return None
    needed = 2 if name == "param_importances.png" else 1
    if complete < needed:
        return f"{complete} completed trial(s); the plot needs {needed}"
    return None


def write_plots(study: Any, out_dir: Path) -> list[Path]:
    """Write the four plots of ``study`` into ``out_dir``; return the files written."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server or in a test
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as views

    written = []
    for name, function in PLOTS.items():
        if (reason := missing(name, study)) is not None:
            log.info("study plot %s skipped: %s", name, reason)
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "experimental feature" on every call
                axes = getattr(views, function)(study)
            figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
            figure.set_size_inches(9, 5.5)
            figure.tight_layout()
            figure.savefig(out_dir / name, dpi=110)
            plt.close(figure)
            written.append(out_dir / name)
        except Exception as err:  # a plot Optuna cannot draw; the others still come
            log.info("study plot %s skipped: %s", name, " ".join(str(err).split()))
    return written
