"""The machine's speed before each trial (``hydra.sweeper.host_check``), without training.

The waiting is decided by a scripted sequence of measurements and a sleep that only records
what it was asked; no test here depends on how fast this machine is.
"""

from __future__ import annotations

import json
import math

import pytest

from transformer_mt.errors import UserError
from transformer_mt.sweeps import host
from transformer_mt.sweeps.worker import _host_wait


class FakeTime:
    """Records the sleeps asked of it and returns at once."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)


def _wait(fake: FakeTime, min_ratio: float, max_wait_s: float = 1800.0) -> host.HostWait:
    return host.HostWait(min_ratio=min_ratio, max_wait_s=max_wait_s, sleep=fake.sleep)


def test_a_slow_machine_is_waited_for_until_it_is_back_to_speed() -> None:
    fake, readings = FakeTime(), iter([40.0, 55.0, 90.0, 10.0])
    gflops, waited = host.measure_until_fast(lambda: next(readings), 100.0, _wait(fake, 0.8))
    assert (gflops, waited) == (90.0, 120.0)  # two waits of a minute, then 0.9x: it runs
    assert fake.sleeps == [60.0, 60.0]


def test_the_wait_gives_up_and_the_trial_runs_on_the_slow_machine() -> None:
    fake = FakeTime()
    gflops, waited = host.measure_until_fast(lambda: 40.0, 100.0, _wait(fake, 0.8, 150.0))
    assert gflops == 40.0
    assert fake.sleeps == [60.0, 60.0, 60.0] and waited == 180.0  # the last wait overshoots


@pytest.mark.parametrize("min_ratio", [0.0, 0.5])
def test_a_fast_enough_machine_or_no_check_is_measured_once_and_never_waits(
    min_ratio: float,
) -> None:
    fake, calls = FakeTime(), []

    def measure() -> float:
        calls.append(1)
        return 60.0

    assert host.measure_until_fast(measure, 100.0, _wait(fake, min_ratio)) == (60.0, 0.0)
    assert calls == [1] and fake.sleeps == []


def test_the_measurement_is_a_positive_rate_and_the_cpu_has_a_name() -> None:
    gflops = host.matmul_gflops(size=64, repeats=3)
    assert math.isfinite(gflops) and gflops > 0
    assert host.cpu_model().strip()
    speed = host.HostSpeed(gflops, 0.91234, host.cpu_model(), waited_s=61.7)
    attr = json.loads(json.dumps(speed.attr()))  # a trial attribute must be JSON
    assert attr["ratio"] == 0.912 and attr["waited_s"] == 62 and attr["cpu"] == host.cpu_model()


def test_host_check_settings_are_read_and_bad_ones_refused() -> None:
    assert _host_wait(None).min_ratio == 0.0  # measured and stored, never waited for
    wait = _host_wait({"min_ratio": 0.8, "max_wait_minutes": 10})
    assert (wait.min_ratio, wait.max_wait_s) == (0.8, 600.0)
    with pytest.raises(UserError, match=r"min_ratio must be within \[0, 1\]"):
        _host_wait({"min_ratio": 1.5})
    with pytest.raises(UserError, match="max_wait_minutes must be >= 0"):
        _host_wait({"min_ratio": 0.8, "max_wait_minutes": -1})
