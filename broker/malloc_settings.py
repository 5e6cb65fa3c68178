"""glibc malloc settings for the broker process: freed request-sized memory is kept for reuse.

A produce request of 1 KB records carries batches of about 1 MB, and each one passes
through buffers of that size (the request frame, the Arrow value buffer of the converted
batch). With glibc's defaults, such a buffer freed at the top of an arena's heap is given
back to the kernel once more than twice the (adaptive) mmap threshold is free there, and
the next one is faulted in and zeroed page by page again. The broker sets the two
thresholds once at start: allocations below 32 MB come from the arenas, and an arena
returns its free top only past 256 MB, so request-sized buffers land on pages already
mapped. Settings given in the environment (``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_``) are left as they are.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform

# mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's largest on 64-bit
TRIM_THRESHOLD_BYTES = 256 * 1024 * 1024

log = logging.getLogger("fluvial.broker")


def keep_freed_memory() -> bool:
    """Set the thresholds (True), or do nothing where glibc is not the allocator or the
    environment already sets them (False)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # Both are set: setting either one turns glibc's adaptive thresholds off.
    done = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    done = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and done
    if not done:
        log.warning("could not set glibc malloc thresholds; request buffers are faulted in afresh")
    return done
