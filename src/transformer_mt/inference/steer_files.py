"""The files that steer decoding, one line per input line: target prefixes and constraints.

``--prefix-file`` / ``prefix_file=``: a line of text per input line, the start its output must
have (an empty line: none). ``--constraints-file`` / ``constraints_file=``: a JSON list of
target phrases per input line that its output must contain, e.g. ``["Katzen", "im Garten"]``
(an empty line or ``[]``: none). translate and evaluate read them here; the service takes the
same values as request fields.
"""

from __future__ import annotations

import json

from transformer_mt.files import read_text_lines


def parse_constraints(text: str, where: str) -> list[str]:
    """One line of a constraints file: a JSON list of non-empty strings (empty = none).

    Raises:
        ValueError: one line naming ``where`` (file and line) and the expected form.
    """
    if not text.strip():
        return []
    try:
        phrases = json.loads(text)
    except ValueError:
        phrases = None
    if not isinstance(phrases, list) or not all(isinstance(p, str) and p.strip() for p in phrases):
        raise ValueError(
            f"{where} is not a JSON list of non-empty phrases ({text.strip()[:60]!r}); write one "
            'list per line, e.g. ["Katzen", "im Garten"], or an empty line for none'
        )
    return phrases


def read_steering(
    prefix_file: str | None,
    constraints_file: str | None,
    count: int,
    *,
    errors: str,
    flags: tuple[str, str],
) -> tuple[list[str] | None, list[list[str]] | None]:
    """The prefixes and constraints of ``count`` input lines (``None`` where no file is given).

    ``flags``: how the command names the two files, for its messages.

    Raises:
        ValueError: a file without one line per input line, or a bad constraints line.
    """
    prefixes = constraints = None
    if prefix_file:
        prefixes = read_text_lines(prefix_file, flags[0], errors=errors)
        _check_lines(flags[0], prefix_file, len(prefixes), count)
    if constraints_file:
        lines = read_text_lines(constraints_file, flags[1], errors=errors)
        _check_lines(flags[1], constraints_file, len(lines), count)
        constraints = [
            parse_constraints(line, f"{flags[1]} {constraints_file} line {n}")
            for n, line in enumerate(lines, start=1)
        ]
    return prefixes, constraints


def _check_lines(flag: str, path: str, found: int, count: int) -> None:
    if found != count:
        raise ValueError(
            f"{flag} {path} has {found} lines but the input has {count}; give one line per "
            "input line (an empty line where a sentence has none)"
        )
