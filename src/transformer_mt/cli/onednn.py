"""How many compiled matrix-product kernels oneDNN keeps: importing this module sets it, and the
commands that train or evaluate import it before torch first multiplies, since oneDNN reads it
only then.

On a CPU with bf16 units (AMX, AVX-512 BF16) torch runs bf16 matrix products through oneDNN,
which compiles a kernel for every new problem shape and keeps the most recent ones in a cache
(``ONEDNN_PRIMITIVE_CACHE_CAPACITY``, 1024 by default). A token-budget batch has shapes of its
own (batch size, source and target lengths), a training step needs a few dozen kernels, and
one epoch of Multi30k asks for several thousand: with the default the cache forgets each
kernel before the next epoch needs it again, so every bf16 step compiles anew
(docs/benchmarks.md, "bf16 on an AMX Xeon"). A larger cache compiles each shape once per run.
fp32 products (MKL) compile nothing and are unaffected. Each kept kernel holds resident memory,
so the capacity is also what a bf16 run's memory can grow to on a corpus with more shapes than
it holds (validation decodes in fp32 and adds none: docs/training.md); a capacity already in
the environment wins. A smaller one compiles forgotten shapes again and has saved less memory
than its kernel count suggests (docs/benchmarks.md, "The cache's capacity against speed and
memory").
"""

from __future__ import annotations

import os

#: Kernels kept: more than an epoch of Multi30k's batch shapes needs.
PRIMITIVE_CACHE_CAPACITY = "16384"


def roomy_primitive_cache() -> None:
    """Set the larger kernel cache, unless the environment already sizes it."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", PRIMITIVE_CACHE_CAPACITY)


roomy_primitive_cache()
