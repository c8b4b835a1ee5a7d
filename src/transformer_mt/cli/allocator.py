"""Where freed memory goes: kept in the process's heap for the next step, not given back.

glibc's malloc serves every block above its mmap threshold (a few MiB, 32 MiB at most) with a
fresh ``mmap`` and hands it back to the kernel with ``munmap`` the moment it is freed. A
training step allocates and frees several tensors of (target tokens x vocabulary) floats (the
logits, their log-probabilities and both gradients) that are far above it, so every step maps
them anew, and the kernel zeroes and faults in each of their pages on first touch: tens of
thousands of page faults a step, spent in the kernel rather than in the model
(docs/benchmarks.md, "The heap keeps freed memory").

:func:`keep_freed_memory` asks glibc (``mallopt``) to serve every block from the heap and to
keep freed memory there, so that the next step reuses pages that are already mapped. The
process's resident memory then stays near its peak instead of following each step down and
up, which is what a training or evaluation process wants. The commands that train or
evaluate (train, evaluate, and the benchmarks that measure them) call it at start-up.

``TRANSFORMER_MT_MALLOC=default`` in the environment leaves glibc's default as it is. A malloc
setting already there (``MALLOC_MMAP_MAX_``, ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``,
``MALLOC_MMAP_THRESHOLD_``, or ``glibc.malloc`` in ``GLIBC_TUNABLES``) wins too: glibc has read
it, and this leaves it alone. (Setting any of those also stops glibc's default from raising its
mmap threshold as it sees large blocks freed, so none of them restores the default.) Other C
libraries (musl, macOS) are left as they are.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

log = logging.getLogger(__name__)

#: Whether :func:`keep_freed_memory` has applied its settings in this process.
_kept = False

#: mallopt's parameter numbers, from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_MAX = -4

#: Free memory at the heap's top below this stays mapped (glibc's default is 128 KiB).
TRIM_THRESHOLD = 1 << 30
#: Each growth of the heap asks the kernel for at least this much more, so that a step's
#: large tensors do not grow the heap one system call at a time.
TOP_PAD = 64 << 20
#: The environment variables through which glibc takes malloc settings at start-up.
USER_SETTINGS = (
    "MALLOC_MMAP_MAX_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_THRESHOLD_",
)


#: Our own switch: ``default`` keeps the C library's behaviour.
SWITCH = "TRANSFORMER_MT_MALLOC"


def user_chose() -> bool:
    """Whether the environment already says what glibc's malloc should do."""
    if os.environ.get(SWITCH, "").strip().lower() == "default":
        return True
    return any(name in os.environ for name in USER_SETTINGS) or "glibc.malloc" in os.environ.get(
        "GLIBC_TUNABLES", ""
    )


def glibc() -> ctypes.CDLL | None:
    """The running process's C library, when it is glibc (the only one with these knobs)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None)
    # gnu_get_libc_version exists in glibc alone: musl has mallopt as a stub that does nothing.
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    return libc


def keep_freed_memory() -> bool:
    """Serve every block from the heap and keep freed memory there; True when it applied.

    Does nothing (False) on a C library other than glibc or where the environment already
    sets malloc's behaviour. Safe to call more than once.
    """
    if user_chose():
        return False
    libc = glibc()
    if libc is None:
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    # The trim threshold and top pad first: setting either stops glibc from adjusting its
    # mmap threshold by itself, and with mmap off (last) it would have nothing to adjust.
    settings = ((M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD), (M_MMAP_MAX, 0))
    applied = all(libc.mallopt(param, value) == 1 for param, value in settings)
    if not applied:  # pragma: no cover - glibc accepts these values on every version we know
        log.warning("glibc refused a malloc setting; freed memory may go back to the kernel")
    global _kept
    _kept = _kept or applied
    return applied


def describe() -> str:
    """How this process's malloc treats freed memory, for benchmark records."""
    if _kept:
        return "kept in the heap"
    return "as the environment sets it" if user_chose() else "the C library's default"
