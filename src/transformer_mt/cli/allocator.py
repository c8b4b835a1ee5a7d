"""Where freed memory goes: kept in the process's heap for the next step, not given back.

glibc maps every block above its mmap threshold anew and unmaps it when freed, so each training
step's large (tokens x vocabulary) tensors fault in fresh zeroed pages: time in the kernel, not
the model (docs/benchmarks.md). :func:`keep_freed_memory` (``mallopt``) serves every block from
the heap and keeps freed memory there; train and evaluate call it at start-up. Resident memory
then stays near its peak. ``TRANSFORMER_MT_MALLOC=default``, or a malloc setting glibc already
read from the environment, leaves glibc as it is; other C libraries are left alone.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

log = logging.getLogger(__name__)

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
    """Serve every block from the heap and keep freed memory there; True when it applied
    (not on another C library, nor where the environment sets malloc). Idempotent."""
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
    return applied
