"""The Hydra plugin class of the Optuna sweeper: configuration and work live in the package.

Hydra instantiates plugin classes from the ``hydra_plugins`` namespace only. Importing this
module registers ``hydra/sweeper: optuna_study`` (transformer_mt.sweeps.sweeper); Optuna
itself loads only when a sweep runs.
"""

from __future__ import annotations

from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from transformer_mt.sweeps import sweeper


class OptunaStudySweeper(Sweeper):
    """One worker of an Optuna study (transformer_mt.sweeps.sweeper.sweep)."""

    def __init__(self, **settings: Any) -> None:
        self.settings = OmegaConf.create(settings)
        self.config: DictConfig | None = None
        self.launcher: Any = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None, "setup() comes first"
        return sweeper.sweep(self.settings, self.config, self.launcher, arguments)
