"""The Optuna side of a sweep: search space, storage, sampler, pruner and the study itself.

Imported only once a sweep or trial runs, so a single training run never imports Optuna.
Search spaces use Hydra's sweep-override grammar (the Optuna plugin's ``params:``):
``choice(a, b)``, ``range(2, 6)`` (Python's), ``interval(1e-4, 1e-2)``, with
``tag(log, ...)`` for a log scale and ``int(interval(...))`` for integers (docs/scaling.md).
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
import optuna.distributions as dist
import optuna.samplers as samplers
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep
from omegaconf import DictConfig, OmegaConf

from transformer_mt.errors import UserError

log = logging.getLogger(__name__)

SAMPLERS = ("tpe", "random")


# ---------------------------------------------------------------------- search space


def _flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optimizer": {"lr": x}}`` and ``{"optimizer.lr": x}`` both become ``optimizer.lr``."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) or OmegaConf.is_dict(value):
            flat.update(_flatten(value, prefix=f"{name}."))
        else:
            flat[name] = value
    return flat


def _parse(key: str, text: Any) -> Override:
    """One ``key=value`` through Hydra's override parser."""
    try:
        return OverridesParser.create().parse_overrides([f"{key}={text}"])[0]
    except Exception as err:  # Hydra's parser raises its own types for bad syntax
        raise UserError(
            f"search space: cannot parse {key}={text}: {' '.join(str(err).split())}; use "
            "choice(a,b), range(2,6), interval(1e-4,1e-2) or tag(log, interval(...))"
        ) from None


def distribution(key: str, override: Override) -> dist.BaseDistribution:
    """The Optuna distribution of one parsed sweep override.

    Raises:
        UserError: an empty choice, an empty range or interval, a log scale over values <= 0.
    """
    value = override.value()
    if isinstance(value, ChoiceSweep):
        if not value.list:
            raise UserError(f"search space: {key}=choice() has no values; list at least one")
        return dist.CategoricalDistribution([_plain(v) for v in value.list])
    if isinstance(value, RangeSweep):
        values = list(override.sweep_iterator())
        if not values:
            raise UserError(f"search space: {key}: the range is empty; need start < stop")
        start, step = values[0], value.step
        if all(isinstance(v, int) for v in values) and isinstance(step, int):
            return dist.IntDistribution(int(start), int(values[-1]), step=int(step))
        return dist.CategoricalDistribution([float(v) for v in values])
    if isinstance(value, IntervalSweep):
        low, high = value.start, value.end
        log_scale = "log" in (value.tags or set())
        if low is None or high is None or not low < high:
            raise UserError(f"search space: {key}=interval({low}, {high}): need low < high")
        if log_scale and low <= 0:
            raise UserError(f"search space: {key}: a log interval needs low > 0, got {low}")
        if isinstance(low, int) and isinstance(high, int):  # int(interval(...))
            return dist.IntDistribution(int(low), int(high), log=log_scale)
        return dist.FloatDistribution(float(low), float(high), log=log_scale)
    raise UserError(
        f"search space: {key}={override.input_line.split('=', 1)[-1]} is not a distribution; "
        "use choice(...), range(...) or interval(...), or give it as a plain override"
    )


def _plain(value: Any) -> Any:
    """Categorical choices are stored in the study: keep them JSON-plain."""
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    return str(value)


def search_space(
    params: Mapping[str, Any] | None, arguments: list[str]
) -> tuple[dict[str, Any], list[str]]:
    """Distributions by key and the fixed overrides, from ``params:`` and the command line,
    which wins: a sweep there joins the space, a plain value fixes the key for every trial."""
    space: dict[str, Any] = {}
    for key, text in _flatten(params or {}).items():
        override = _parse(key, text)
        if override.is_sweep_override():
            space[key] = distribution(key, override)
        else:  # a plain value in params: fixed, not searched
            arguments = [*arguments, f"{key}={text}"]
    fixed: list[str] = []
    for argument in arguments:
        key, _, text = argument.partition("=")
        if not text or key.startswith("~"):  # a deletion, never a sweep
            fixed.append(argument)
            continue
        override = _parse(key, text)
        if override.is_sweep_override():
            space[key] = distribution(key, override)
        else:
            fixed.append(argument)
    # A plain value on the command line fixes a key that params would search.
    pinned = {argument.partition("=")[0].lstrip("+") for argument in fixed}
    return {k: v for k, v in space.items() if k.lstrip("+") not in pinned}, fixed


def check_keys(space: Mapping[str, Any], config: DictConfig) -> None:
    """Every searched key names a value of the config (``+key`` adds one, so it may not).

    Raises:
        UserError: a key the config does not have, with the nearest existing parent.
    """
    for key in space:
        name = key.lstrip("+~")
        if key.startswith("+") or OmegaConf.select(config, name, default=_MISSING) is not _MISSING:
            continue
        parent = name.rsplit(".", 1)[0] if "." in name else ""
        known = OmegaConf.select(config, parent) if parent else config
        keys = ", ".join(sorted(map(str, known.keys()))) if OmegaConf.is_dict(known) else ""
        raise UserError(
            f"search space: unknown parameter {name!r} (not in the composed config"
            + (f"; {parent or 'the top level'} has: {keys}" if keys else "")
            + f"); fix the name, or write +{name} to add a new key"
        )


_MISSING = object()


# ---------------------------------------------------------------------- storage and study


def storage_url(storage: str | None, sweep_dir: Path) -> str:
    """The storage: as given, or a SQLite file in the sweep directory (every sweep resumes)."""
    if storage:
        return str(storage)
    return f"sqlite:///{(sweep_dir / 'optuna.db').resolve()}"


def open_study(
    storage: Any, name: str, direction: str, *, sampler: Any = None, pruner: Any = None
) -> Any:
    """Create the study, or load it if it exists; refuse one stored with the other direction."""
    if direction not in ("maximize", "minimize"):
        raise UserError(f"hydra.sweeper.direction must be maximize or minimize, got {direction!r}")
    try:
        existing = optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    except KeyError:
        existing = None
    if existing is not None and existing.direction.name.lower() != direction:
        raise UserError(
            f"study {name!r} in this storage already exists with direction "
            f"{existing.direction.name.lower()}, not {direction}; choose another "
            "hydra.sweeper.study_name or the stored direction"
        )
    return optuna.create_study(
        study_name=name,
        storage=storage,
        sampler=sampler,
        pruner=pruner,
        direction=direction,
        load_if_exists=True,
    )


def check_same_space(study: Any, space: dict[str, dist.BaseDistribution]) -> None:
    """Refuse, before any trial is asked for, a search space the study's earlier trials drew
    from differently (Optuna's ``ask`` would leave a RUNNING trial behind).

    Raises:
        UserError: the key, both distributions and the fix.
    """
    for trial in study.get_trials(deepcopy=False):
        for key, old in trial.distributions.items():
            new = space.get(key)
            if new is None:
                continue
            try:
                dist.check_distribution_compatibility(old, new)
            except ValueError:
                raise UserError(
                    f"study {study.study_name!r} searched {key} as {old}, this sweep asks for "
                    f"{new}; choose another hydra.sweeper.study_name, or the stored space"
                ) from None


def enqueue_points(
    study: Any, space: Mapping[str, dist.BaseDistribution], points: list[Mapping[str, Any]]
) -> int:
    """Queue ``points`` (``hydra.sweeper.enqueue``) as the study's next trials; their count.

    A point fixes some searched keys (the sampler draws the rest), so a known recipe is
    measured under the study's protocol. A point the study holds is not queued again, and
    workers that start together queue the list once (an atomic marker study claims it).

    Raises:
        UserError: a point naming a key outside the search space, or a value outside its
            distribution.
    """
    checked: list[dict[str, Any]] = []
    for number, point in enumerate(points, 1):
        params = _flatten(point)
        for key, value in params.items():
            distribution = space.get(key)
            if distribution is None:
                raise UserError(
                    f"hydra.sweeper.enqueue point {number}: {key} is not searched (the space "
                    f"has: {', '.join(sorted(space))}); fix the name or drop it from the point"
                )
            if not _within(distribution, value):
                raise UserError(
                    f"hydra.sweeper.enqueue point {number}: {key}={value} is outside "
                    f"{_describe(distribution)}; use a value the search space holds"
                )
        checked.append(params)
    if not checked:
        return 0
    digest = hashlib.sha256(repr(checked).encode()).hexdigest()[:12]
    try:
        study._storage.create_new_study(
            study.directions, study_name=f"{study.study_name}.enqueue_{digest}"
        )
    except optuna.exceptions.DuplicatedStudyError:
        return 0  # another worker, or an earlier invocation, queued this list
    queued = 0
    for params in checked:
        before = len(study.get_trials(deepcopy=False))
        study.enqueue_trial(params, skip_if_exists=True)
        queued += len(study.get_trials(deepcopy=False)) - before
    return queued


def _within(distribution: dist.BaseDistribution, value: Any) -> bool:
    if isinstance(distribution, dist.CategoricalDistribution):
        return _plain(value) in distribution.choices
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    if isinstance(distribution, dist.IntDistribution) and number != int(number):
        return False
    return distribution.low <= number <= distribution.high  # type: ignore[attr-defined]


def _describe(distribution: dist.BaseDistribution) -> str:
    if isinstance(distribution, dist.CategoricalDistribution):
        return f"choice({', '.join(map(str, distribution.choices))})"
    return f"[{distribution.low}, {distribution.high}]"  # type: ignore[attr-defined]


# ---------------------------------------------------------------------- sampler and pruner


def trial_seed(seed: int | None, number: int) -> int | None:
    """A seed per (sweep seed, trial number): distinct for every trial, on every worker."""
    if seed is None:
        return None
    digest = hashlib.sha256(f"{seed}:{number}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def make_sampler(cfg: Mapping[str, Any]) -> Any:
    """The configured sampler, seeded per trial (:class:`TrialSeededSampler`)."""
    name = str(cfg.get("name", "tpe"))
    if name not in SAMPLERS:
        raise UserError(f"hydra.sweeper.sampler.name must be one of {SAMPLERS}, got {name!r}")
    options = {k: v for k, v in dict(cfg).items() if k not in ("name", "seed")}
    return TrialSeededSampler(name, cfg.get("seed"), options)


class TrialSeededSampler(samplers.BaseSampler):
    """A sampler re-seeded for each trial from (seed, trial number), so every worker and
    resumed invocation draws its own start-up parameters, reproducibly."""

    def __init__(self, name: str, seed: int | None, options: Mapping[str, Any]) -> None:
        self.name, self.seed, self.options = name, seed, dict(options)
        self._inner = self._build(seed)

    def _build(self, seed: int | None) -> samplers.BaseSampler:
        if self.name == "random":
            return samplers.RandomSampler(seed=seed)
        return samplers.TPESampler(seed=seed, **self.options)

    def before_trial(self, study: optuna.Study, trial: Any) -> None:
        self._inner = self._build(trial_seed(self.seed, trial.number))
        self._inner.before_trial(study, trial)

    def infer_relative_search_space(self, study: optuna.Study, trial: Any) -> Any:
        return self._inner.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: Any, search_space: Any) -> Any:
        return self._inner.sample_relative(study, trial, search_space)

    def sample_independent(
        self, study: optuna.Study, trial: Any, param_name: str, param_distribution: Any
    ) -> Any:
        return self._inner.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study: optuna.Study, trial: Any, state: Any, values: Any) -> None:
        self._inner.after_trial(study, trial, state, values)


def finite(value: Any) -> float | None:
    """A finite float, else ``None``."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
