"""Hydra discovers plugins in the ``hydra_plugins`` namespace: the shim of this package's sweeper."""
