"""The shim of this package's sweeper: Hydra discovers plugins in ``hydra_plugins`` only."""
