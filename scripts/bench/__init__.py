"""The benchmarks of ``scripts/benchmark.py``, one module each, over ``bench.common``.

``benchmark.py`` finds every module here that defines ``NAME``: how to add one is in
``scripts/README.md``.
"""
