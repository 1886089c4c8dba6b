"""Memory a burst used, given back once it is over.

Python frees its objects after a burst (a re-list's pages, 200 jobs' plans), but glibc's malloc
keeps the freed pages of its heap and arenas mapped: the process's RSS stays at the burst's
high-water mark for good. `malloc_trim(0)` returns whole free pages to the kernel (madvise), as
Go's scavenger does on its own. It is called once the operator has been quiet for a while after
work, never during it (it walks the heap: milliseconds). Measured in `make bench`: the RSS after
the burst rounds, with and without it (issue 25's note). A libc without it (musl) is left alone.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)
QUIET_SECONDS = 20.0


def _trimmer() -> Callable[[], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: int(trim(0))


async def trim_when_quiet(work_done: Callable[[], int], quiet: float = QUIET_SECONDS) -> None:
    """Forever: after work (`work_done()` moved on) and then `quiet` seconds without more, trim once."""
    trim = _trimmer()
    if trim is None:
        return
    seen, trimmed_at = work_done(), work_done()
    while True:
        await asyncio.sleep(quiet)
        now = work_done()
        if now == seen and now != trimmed_at:
            trim()
            trimmed_at = now
        seen = now
