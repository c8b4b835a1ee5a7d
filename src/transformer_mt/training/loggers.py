"""Loggers that keep what earlier parts of a run wrote.

Lightning's ``CSVLogger`` deletes ``metrics.csv`` in a non-empty directory, so a resume lost
the first part's metrics. :class:`CSVLogger` here appends; a new column rewrites the file
atomically with the wider header. Steps logged after a killed part's last checkpoint appear
twice, the later row being the one the resumed weights continue from.
"""

from __future__ import annotations

import csv
import os
from typing import Any

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from transformer_mt.files import atomic_write


class AppendingExperimentWriter(ExperimentWriter):
    """Lightning's CSV writer, appending to an existing ``metrics.csv`` instead of deleting it."""

    def _check_log_dir_exists(self) -> None:
        # Continue the columns of the file an earlier part wrote, in its order, so that
        # appended rows line up with its header.
        if os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, newline="", encoding="utf-8") as handle:
                self.metrics_keys = list(next(csv.reader(handle), []))

    def _rewrite_with_new_header(self, fieldnames: list[str]) -> None:
        with open(self.metrics_file_path, newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        with atomic_write(self.metrics_file_path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=fieldnames)
            writer.writeheader()
            writer.writerows(rows)


class CSVLogger(LightningCSVLogger):
    """``lightning.pytorch.loggers.CSVLogger`` whose ``metrics.csv`` survives a resume."""

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = AppendingExperimentWriter(log_dir=self.log_dir)
        return self._experiment
