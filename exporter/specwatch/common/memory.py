"""Bounding the C allocator's memory in a many-threaded process (glibc only).

Why: the exporter polls every target from a worker thread of its own (a slow target must
not hold the others up), so a fleet of hundreds of targets runs hundreds of threads, and
glibc gives threads their own malloc arenas (up to 8 per core). Page bodies, parsed pages
and the exposition page are freed in one thread's arena and not reused by the next poll in
another, so the resident size grows well past what the process holds (bench/bench_fleet.py,
500 targets: docs/performance.md). Two arenas are what ``MALLOC_ARENA_MAX=2`` gives, the
usual setting for threaded servers; the exposition page (megabytes) is kept out of the
arenas by a fixed mmap threshold, so it is returned to the system when freed instead of
raising glibc's dynamic threshold and staying in the heap.

Best effort: nothing happens on a C library without ``mallopt`` (musl, macOS) or when the
operator set ``MALLOC_ARENA_MAX`` / ``MALLOC_MMAP_THRESHOLD_`` (theirs wins).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

#: mallopt parameters (glibc malloc.h).
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

#: Arenas for the whole process (glibc's default is 8 per core).
ARENA_MAX = 2
#: Allocations from this size up are mmapped and returned to the system when freed.
MMAP_THRESHOLD = 1 << 20


def bound_malloc_arenas() -> bool:
    """Apply :data:`ARENA_MAX` and :data:`MMAP_THRESHOLD` (glibc); True when applied.

    Call it early (before threads start): arenas made before stay."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = True
    if "MALLOC_ARENA_MAX" not in os.environ:
        ok = mallopt(M_ARENA_MAX, ARENA_MAX) == 1 and ok
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and ok
    return ok
