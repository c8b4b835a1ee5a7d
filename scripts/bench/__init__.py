"""The benchmarks of ``scripts/benchmark.py``, one module each, over ``bench.common``."""
