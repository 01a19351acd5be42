"""Memory settings of the long-running exporter process: the C allocator's arenas (glibc
only) and the cyclic garbage collector's pace.

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
import gc
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


#: Net container allocations between two passes of the garbage collector's youngest
#: generation while the exporter serves (CPython's default is 700).
GC_YOUNG_THRESHOLD = 20_000


def pace_garbage_collector() -> tuple[int, ...]:
    """Set the youngest generation's threshold to :data:`GC_YOUNG_THRESHOLD` (the older
    generations keep theirs); returns the former thresholds, for :func:`gc.set_threshold`.

    Why: what a poll publishes (a target's snapshot, its models and windows, the rendered
    lines) lives one poll interval and is never cyclic garbage: reference counting frees it
    when the next poll replaces it. With the default threshold, a fleet of targets sets off
    young passes several times a second, each walking the live snapshots, freeing nothing
    and promoting them to older generations that walk them again. Cyclic garbage, if a bug
    made any, waits longer: at most the threshold's worth of objects. The measurements are
    in docs/performance.md ("Garbage collector").
    """
    before = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *before[1:])
    return before
