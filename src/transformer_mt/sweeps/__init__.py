"""Hyperparameter sweeps: the Optuna study, its workers, the Hydra sweeper, summaries and plots.

A wing of its own beside training: it runs training jobs through Hydra and reads their
results; training's only part in a sweep is the trial side of pruning
(:mod:`transformer_mt.training.pruning`).
"""
