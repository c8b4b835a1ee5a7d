"""The error surface of the commands (transformer_mt.errors): exit codes, one line, bugs as is."""

from __future__ import annotations

import pytest

from transformer_mt.errors import (
    EXIT_INTERRUPTED,
    EXIT_RUNTIME_ERROR,
    EXIT_USER_ERROR,
    NonFiniteLossError,
    TrainingInterrupted,
    UserError,
    exit_code_for,
    guarded,
    one_line,
)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ValueError("x"), EXIT_USER_ERROR),
        (FileNotFoundError("x"), EXIT_USER_ERROR),
        (ConnectionError("x"), EXIT_USER_ERROR),
        (PermissionError("x"), EXIT_USER_ERROR),
        (UserError("x"), EXIT_USER_ERROR),
        (NonFiniteLossError("x"), EXIT_RUNTIME_ERROR),
        (TrainingInterrupted("x"), EXIT_INTERRUPTED),
        (KeyboardInterrupt(), EXIT_INTERRUPTED),
        (RuntimeError("a bug"), None),
        (AttributeError("a bug"), None),
    ],
)
def test_exit_codes(exc: BaseException, code: int | None) -> None:
    assert exit_code_for(exc) == code


def test_instantiation_errors_are_unwrapped() -> None:
    from hydra.errors import InstantiationException

    try:
        try:
            raise ValueError("max_tokens=10 is too small;\n raise data.max_tokens")
        except ValueError as inner:
            raise InstantiationException("Error in call to target 'x':\nValueError(...)") from inner
    except InstantiationException as outer:
        assert exit_code_for(outer) == EXIT_USER_ERROR
        assert one_line(outer) == "max_tokens=10 is too small; raise data.max_tokens"


def test_a_trainer_setting_lightning_refuses_is_a_user_error() -> None:
    """trainer.* keys are Lightning's: its MisconfigurationException, raised while Hydra
    instantiates the Trainer, is the user's one line."""
    from hydra.errors import InstantiationException
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    try:
        try:
            raise MisconfigurationException("`gradient_clip_algorithm` banana is invalid.")
        except MisconfigurationException as inner:
            raise InstantiationException("Error in call to target 'Trainer'") from inner
    except InstantiationException as outer:
        assert exit_code_for(outer) == EXIT_USER_ERROR
        assert one_line(outer) == "`gradient_clip_algorithm` banana is invalid."


def test_bugs_keep_their_traceback() -> None:
    @guarded
    def buggy() -> None:
        raise RuntimeError("internal invariant broken")

    with pytest.raises(RuntimeError, match="internal invariant"):
        buggy()
