"""The daemon's C heap: how many malloc arenas its threads share.

glibc gives each thread that allocates while the others hold theirs an arena of its
own, up to 8 a core, and keeps what a thread frees in its arena for that arena's next
allocations. The daemon's threads are many (a connection's thread runs the pass on
demand a phase's edge asks for, and builds answers), so five persons at their bounds
left 205-235 MiB of RSS at peak, of which malloc_trim handed back 30-70 MiB at a
time: freed memory kept apart in each thread's arena. Two arenas: 167-182 MiB
(docs/performance.md, "Memory").
"""

from __future__ import annotations

import ctypes

M_ARENA_MAX = -8  # glibc's malloc.h
ARENAS = 2


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Bound the process's malloc arenas to ``arenas`` before its threads start;
    whether the C library took it (False: not glibc, as musl's and macOS's have no
    such arenas)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_ARENA_MAX, arenas))
