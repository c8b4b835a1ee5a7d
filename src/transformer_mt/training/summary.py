"""The model table printed when training starts: each part's parameters, then the totals.

Without Lightning's FLOPs column, which needs an ``example_input_array`` and reads 0 here.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import ModelSummary
from lightning.pytorch.utilities.model_summary import get_human_readable_count

#: The columns of Lightning's summary data that mean something for this model.
COLUMNS = ("Name", "Type", "Params", "Mode")


class ModelSizes(ModelSummary):
    """:class:`~lightning.pytorch.callbacks.ModelSummary` as a rich table without FLOPs."""

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        *,
        total_flops: int = 0,
        **summarize_kwargs: Any,
    ) -> None:
        from rich import get_console
        from rich.table import Table

        columns = dict(summary_data)
        table = Table(header_style="bold")
        for name in COLUMNS:
            table.add_column(name, justify="right" if name == "Params" else "left")
        for row in zip(*(columns[name] for name in COLUMNS if name in columns)):
            table.add_row(*row)
        frozen = total_parameters - trainable_parameters
        table.caption = (
            f"{get_human_readable_count(trainable_parameters).strip()} trainable, "
            f"{get_human_readable_count(frozen).strip()} frozen, {model_size:.1f} MB of weights"
        )
        get_console().print(table)
