"""One setting, three spellings: the library names it, each command writes the fix its way."""

from __future__ import annotations

import pytest

from transformer_mt.cli.hydra_app import search_keys, spelled
from transformer_mt.cli.options import flag, in_flags
from transformer_mt.errors import SettingError
from transformer_mt.inference.search import SearchConfig


def bad_beam() -> SettingError:
    with pytest.raises(SettingError) as caught:
        SearchConfig(beam_size=0)
    return caught.value


def test_the_library_names_the_setting_not_a_command_line() -> None:
    assert str(bad_beam()) == "beam_size must be >= 1, got 0; set beam_size=1 (greedy) or more"


def test_the_flag_commands_write_the_fix_as_flags() -> None:
    assert str(in_flags(bad_beam())) == (
        "beam_size must be >= 1, got 0; set --beam-size 1 (greedy) or more"
    )
    assert flag("max_sentences", 1) == "--batch-size 1"
    assert flag("truncate", True) == "--truncate"


@pytest.mark.parametrize(
    ("prefix", "spelt"),
    [("decoding", "decoding.beam_size=1"), ("module.decoding", "module.decoding.beam_size=1")],
)
def test_the_hydra_commands_write_the_fix_as_their_override(prefix: str, spelt: str) -> None:
    @spelled(search_keys(prefix))
    def command() -> None:
        SearchConfig(beam_size=0)

    with pytest.raises(ValueError, match="set " + spelt.replace(".", r"\.") + r" \(greedy\)"):
        command()
