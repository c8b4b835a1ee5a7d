"""Every command of the package: its own syntax in, typed settings out, fixes in its syntax.

``train`` and ``evaluate`` speak Hydra (``key=value``), ``translate``, ``score``, ``export``
and ``serve`` speak flags (``--beam-size 4``). Each is one thin module whose ``main`` is the
installed command (``[project.scripts]`` in pyproject.toml); the library below never spells
a setting as a command line does.
"""
