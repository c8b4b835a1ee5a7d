"""The Optuna side of sweeps, without training: search spaces, storage, seeding, pruning.

Everything runs in this process on a SQLite file in ``tmp_path`` (a few seconds in all); the
sweeps that train are in tests/test_sweeps.py.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from omegaconf import OmegaConf
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from transformer_mt.errors import UserError
from transformer_mt.sweeps import study as st
from transformer_mt.training import pruning as tp
from transformer_mt.training.pruning import StudyTrial

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = {
    "optimizer.lr": "tag(log, interval(1e-4, 1e-2))",
    "model": {"dropout": "choice(0.0, 0.1, 0.2)"},  # nested keys read as model.dropout
    "model.n_encoder_layers": "range(2, 6)",
    "model.d_ff": "int(interval(16, 64))",
    "seed": "7",  # a plain value: fixed, not searched
}


def test_the_params_syntax_becomes_optuna_distributions() -> None:
    space, fixed = st.search_space(SPACE, ["data=numbers", "model.n_heads=choice(2,4)"])
    assert space == {
        "optimizer.lr": FloatDistribution(1e-4, 1e-2, log=True),
        "model.dropout": CategoricalDistribution([0.0, 0.1, 0.2]),
        "model.n_encoder_layers": IntDistribution(2, 5),  # Python's range: 6 excluded
        "model.d_ff": IntDistribution(16, 64),
        "model.n_heads": CategoricalDistribution([2, 4]),  # a sweep on the command line joins
    }
    assert fixed == ["data=numbers", "seed=7"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("interval(1e-2, 1e-4)", r"need low < high"),
        ("tag(log, interval(0, 1))", r"a log interval needs low > 0"),
        ("range(5, 2)", r"the range is empty"),
        ("choice(0.1, ", r"cannot parse optimizer\.lr=choice\(0\.1, "),
    ],
)
def test_an_invalid_distribution_is_a_user_error(text: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        st.search_space({"optimizer.lr": text}, [])


def test_an_unknown_parameter_is_named_with_its_siblings() -> None:
    config = OmegaConf.create({"optimizer": {"lr": 1e-3, "eps": 1e-9}, "seed": 1})
    st.check_keys({"optimizer.lr": None, "+optimizer.new": None}, config)  # both fine
    with pytest.raises(UserError, match=r"unknown parameter 'optimizer\.lrr'.*has: eps, lr"):
        st.check_keys({"optimizer.lrr": None}, config)


def test_a_storage_that_cannot_be_opened_is_a_user_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/missing/dir/optuna.db"
    with pytest.raises(UserError, match=r"cannot open the study storage sqlite:///"):
        tp.open_storage(url)
    assert tp.redact("postgresql://me:secret@db:5432/x") == "postgresql://me:***@db:5432/x"


def test_a_study_stored_with_the_other_direction_is_refused(tmp_path: Path) -> None:
    storage = tp.open_storage(f"sqlite:///{tmp_path}/optuna.db")
    st.open_study(storage, "s", "maximize")
    with pytest.raises(UserError, match=r"already exists with direction maximize, not minimize"):
        st.open_study(storage, "s", "minimize")


def _ask(study: optuna.Study, space: dict) -> optuna.Trial:
    trial = study.ask(space)
    study.tell(trial, trial.params["x"])
    return trial


def test_workers_and_resumes_never_draw_the_same_parameters(tmp_path: Path) -> None:
    """Two workers with the same seed on one storage, then a resumed third: all distinct.

    A sampler seeded once per process would give both workers the same start-up draws (and the
    resumed invocation the first ones again); seeds per trial number cannot collide.
    """
    url = f"sqlite:///{tmp_path}/optuna.db"
    space = {"x": FloatDistribution(0.0, 1.0), "y": FloatDistribution(0.0, 1.0)}

    def worker() -> optuna.Study:
        sampler = st.make_sampler({"name": "tpe", "seed": 42, "n_startup_trials": 10})
        return st.open_study(tp.open_storage(url), "shared", "maximize", sampler=sampler)

    first, second = worker(), worker()
    drawn = [_ask(study, space).params for _ in range(3) for study in (first, second)]
    drawn += [_ask(worker(), space).params for _ in range(2)]  # a resumed invocation
    assert len({(p["x"], p["y"]) for p in drawn}) == 8
    # Reproducible: the same seed and trial number give the same draw in a fresh study.
    again = st.open_study(
        tp.open_storage(f"sqlite:///{tmp_path}/again.db"),
        "shared",
        "maximize",
        sampler=st.make_sampler({"name": "tpe", "seed": 42}),
    )
    assert _ask(again, space).params == drawn[0]


def test_given_points_run_first_once_and_bad_ones_are_refused(tmp_path: Path) -> None:
    """``hydra.sweeper.enqueue``: the given points are the first trials, in order, partial
    points are completed by the sampler, and neither a resumed worker nor a second one started
    beside it queues them again."""
    url = f"sqlite:///{tmp_path}/optuna.db"
    space, _ = st.search_space(SPACE, [])
    points = [{"model.dropout": 0.1, "optimizer.lr": 2.1e-3}, {"model": {"dropout": 0.2}}]

    def worker() -> optuna.Study:
        sampler = st.make_sampler({"name": "tpe", "seed": 3})
        return st.open_study(tp.open_storage(url), "s", "maximize", sampler=sampler)

    first, second = worker(), worker()
    assert st.enqueue_points(first, space, points) == 2
    assert st.enqueue_points(second, space, points) == 0  # the list is claimed once
    asked = []
    for study in (second, first, first):
        trial = study.ask(space)
        study.tell(trial, 1.0)
        asked.append(trial.params)
    assert (asked[0]["model.dropout"], asked[0]["optimizer.lr"]) == (0.1, 2.1e-3)
    assert asked[1]["model.dropout"] == 0.2 and set(asked[1]) == set(space)
    # A resumed sweep with one more point queues only the new one.
    assert st.enqueue_points(worker(), space, [*points, {"model.dropout": 0.0}]) == 1
    with pytest.raises(UserError, match=r"point 1: model\.dropou is not searched.*has: "):
        st.enqueue_points(worker(), space, [{"model.dropou": 0.1}])
    with pytest.raises(UserError, match=r"point 2: model\.dropout=0\.3 is outside choice"):
        st.enqueue_points(worker(), space, [{}, {"model.dropout": 0.3}])
    with pytest.raises(UserError, match=r"optimizer\.lr=0\.5 is outside \[0\.0001, 0\.01\]"):
        st.enqueue_points(worker(), space, [{"optimizer.lr": 0.5}])
    with pytest.raises(UserError, match=r"model\.n_encoder_layers=2\.5 is outside"):
        st.enqueue_points(worker(), space, [{"model.n_encoder_layers": 2.5}])


def test_a_trial_below_the_median_is_pruned_at_the_same_budget(tmp_path: Path) -> None:
    """Reports fill a 5% grid since the last validation, so trials compare step by step."""
    url = f"sqlite:///{tmp_path}/optuna.db"
    pruner_cfg = {"name": "median", "n_startup_trials": 2, "n_warmup_steps": 10}
    study = st.open_study(tp.open_storage(url), "p", "maximize", pruner=tp.make_pruner(pruner_cfg))
    for curve in ([(30, 10.0), (70, 20.0)], [(40, 12.0), (80, 22.0)]):  # two finished trials
        trial = study.ask({"x": FloatDistribution(0, 1)})
        reporter = StudyTrial(url, "p", trial._trial_id, pruner_cfg)
        assert not any(reporter.report(value, percent) for percent, value in curve)
        study.tell(trial, curve[-1][1])
    values = study.trials[0].intermediate_values
    assert 25 not in values  # nothing is known before the first validation
    assert values[50] == 10.0  # between validations: the value known then
    assert study.trials[0].intermediate_values[70] == 20.0

    good = StudyTrial(url, "p", study.ask()._trial_id, pruner_cfg)
    assert good.report(15.0, 35) is False  # above the others' 10.0 at 35%
    bad = StudyTrial(url, "p", study.ask()._trial_id, pruner_cfg)
    assert bad.report(5.0, 35) is True  # below: pruned, and the trial says where
    assert study.trials[3].user_attrs == {tp.PRUNED_AT: 35}
    assert study.trials[3].state == TrialState.RUNNING  # the sweeper tells the state


def test_a_given_point_runs_its_whole_budget_and_still_sets_the_bar(tmp_path: Path) -> None:
    """hydra.sweeper.enqueue's points are references: a pruner that would stop a drawn trial
    with the same values lets them run, and their values still prune the trials after them."""
    url = f"sqlite:///{tmp_path}/optuna.db"
    pruner_cfg = {"name": "successive_halving", "min_resource": 40, "reduction_factor": 2}
    space = {"x": FloatDistribution(0, 1)}
    study = st.open_study(tp.open_storage(url), "g", "maximize", pruner=tp.make_pruner(pruner_cfg))
    fast = study.ask(space)  # a fast starter sets the bar at 40%
    assert StudyTrial(url, "g", fast._trial_id, pruner_cfg).report(37.5, 40) is False
    study.tell(fast, 39.5)

    study.enqueue_trial({"x": 0.5})
    given = study.ask(space)
    reporter = StudyTrial(url, "g", given._trial_id, pruner_cfg)
    assert reporter.report(35.3, 40) is False  # behind the bar, yet it goes on
    assert reporter.report(38.0, 80) is False
    study.tell(given, 39.6)
    assert tp.PRUNED_AT not in study.trials[1].user_attrs

    drawn = study.ask(space)  # the same values, drawn: stopped at the first rung
    assert StudyTrial(url, "g", drawn._trial_id, pruner_cfg).report(35.3, 40) is True
    assert study.trials[2].user_attrs == {tp.PRUNED_AT: 40}
    # The pruner saw the given point too: its value at the rung is among those later trials
    # are ranked against (successive halving keeps them as the trials' rung attributes).
    assert study.trials[1].system_attrs["completed_rung_0"] == 35.3


@pytest.mark.parametrize("name", ["successive_halving", "hyperband", "median", "none"])
def test_every_pruner_is_built_from_its_config(name: str) -> None:
    pruner = tp.make_pruner({"name": name, "min_resource": 20, "reduction_factor": 3})
    assert (
        type(pruner).__name__
        == {
            "successive_halving": "SuccessiveHalvingPruner",
            "hyperband": "HyperbandPruner",
            "median": "MedianPruner",
            "none": "NopPruner",
        }[name]
    )
    with pytest.raises(UserError, match=r"pruner\.name must be one of"):
        tp.make_pruner({"name": "asha"})


# ----------------------------------------------------------------------- PostgreSQL


def _postgres_bin() -> Path | None:
    found = shutil.which("initdb")
    candidates = [Path(found).resolve().parent] if found else []
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    return next(
        (c for c in candidates if (c / "initdb").exists() and (c / "pg_ctl").exists()), None
    )


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL server of its own on 127.0.0.1 in a temporary directory, for this module.

    PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` user.
    Skips where no server can be started (no binaries, no driver, no such user).
    """
    pytest.importorskip("psycopg", reason="no PostgreSQL driver: pip install -e '.[postgres]'")
    bin_dir = _postgres_bin()
    if bin_dir is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl); apt-get install postgresql")
    as_user: list[str] = []
    data = Path(tempfile.mkdtemp(prefix="transformer-mt-pg-"))
    if os.geteuid() == 0:
        if (
            shutil.which("runuser") is None
            or subprocess.run(["id", "postgres"], capture_output=True).returncode
        ):
            pytest.skip("running as root without a postgres user to start the server as")
        shutil.chown(data, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as probe:  # a free port, chosen by the kernel
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    pgdata = data / "db"
    steps = [
        [str(bin_dir / "initdb"), "-D", str(pgdata), "-U", "postgres", "--auth=trust"],
        [
            str(bin_dir / "pg_ctl"),
            "-D",
            str(pgdata),
            "-l",
            str(data / "server.log"),
            "-w",
            "-o",
            f"-p {port} -k {data} -c listen_addresses=127.0.0.1",
            "start",
        ],
    ]
    for step in steps:
        done = subprocess.run([*as_user, *step], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            shutil.rmtree(data, ignore_errors=True)
            pytest.skip(f"cannot start a PostgreSQL server: {done.stderr.strip()[-300:]}")
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        stop = [str(bin_dir / "pg_ctl"), "-D", str(pgdata), "-m", "immediate", "stop"]
        subprocess.run([*as_user, *stop], capture_output=True, timeout=60)
        shutil.rmtree(data, ignore_errors=True)


def test_workers_share_a_study_on_a_real_postgresql_server(postgres_url: str) -> None:
    space = {"x": FloatDistribution(0.0, 1.0)}

    def worker() -> optuna.Study:
        sampler = st.make_sampler({"name": "tpe", "seed": 1})
        storage = tp.open_storage(postgres_url, heartbeat_interval=5)
        return st.open_study(storage, "pg", "maximize", sampler=sampler)

    first, second = worker(), worker()
    trials = [_ask(study, space) for _ in range(2) for study in (first, second)]
    assert [t.number for t in trials] == [0, 1, 2, 3]  # one numbering for both workers
    assert len({t.params["x"] for t in trials}) == 4
    assert len(worker().trials) == 4 and all(
        t.state == TrialState.COMPLETE for t in worker().trials
    )
    with pytest.raises(UserError, match="already exists with direction maximize"):
        st.open_study(tp.open_storage(postgres_url), "pg", "minimize")


@pytest.mark.parametrize(
    ("search", "base"),
    [
        ("numbers_optuna", []),
        ("multi30k_optuna", ["experiment=multi30k_de_en", "data.source=files"]),
        ("multi30k_long_optuna", ["experiment=multi30k_de_en", "data.source=files"]),
    ],
)
def test_every_shipped_search_space_parses_and_names_real_keys(
    search: str, base: list[str]
) -> None:
    """What `python train.py -m hparams_search=NAME` checks before its first trial."""
    from hydra import compose, initialize_config_dir

    from transformer_mt.cli.hydra_app import register_configs

    from conftest import ROOT

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", [*base, f"hparams_search={search}"], return_hydra_config=True)
    params = OmegaConf.to_container(cfg.hydra.sweeper.params)
    space, _ = st.search_space(params, [])
    assert len(space) >= 2
    st.check_keys(space, cfg)
    assert cfg.hydra.sweeper.direction == "maximize" and cfg.optimized_metric == "val/bleu"
    # Its given points lie in its space, and one of them is the preset as composed (apart from
    # average_last: the long study gave Wu's point with an average the preset does without).
    points = OmegaConf.to_container(cfg.hydra.sweeper.enqueue)
    study = optuna.create_study(direction="maximize")
    assert st.enqueue_points(study, space, points) == len(points)
    if points:
        # What the preset means: activation dropout null is the dropout.
        keys = [k for k in points[0] if k != "average_last"]
        shipped = {k: OmegaConf.select(cfg, k) for k in keys}
        if shipped.get("model.activation_dropout", 0) is None:
            shipped["model.activation_dropout"] = shipped["model.dropout"]
        assert any(shipped == {k: point[k] for k in keys} for point in points)


def test_a_worker_that_loses_the_race_to_create_the_tables_opens_the_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers starting on a new database: the one whose CREATE TABLE meets the other's
    tables opens again and gets the storage, instead of an error line."""
    real = optuna.storages.RDBStorage
    calls: list[str] = []

    def racing(url: str, **kwargs: object) -> object:
        calls.append(url)
        if len(calls) == 1:
            raise RuntimeError("(sqlite3.OperationalError) table studies already exists")
        return real(url, **kwargs)

    monkeypatch.setattr(optuna.storages, "RDBStorage", racing)
    url = f"sqlite:///{tmp_path}/optuna.db"
    storage = tp.open_storage(url)
    assert len(calls) == 2 and storage.get_all_studies() == []
    calls.clear()

    def broken(url: str, **kwargs: object) -> object:
        calls.append(url)
        raise RuntimeError("unable to open database file")

    monkeypatch.setattr(optuna.storages, "RDBStorage", broken)
    with pytest.raises(UserError, match="cannot open the study storage"):
        tp.open_storage(url)
    assert len(calls) == 1  # any other failure is not retried
