"""Freed heap memory handed back to the OS while the engine is idle.

glibc keeps what a process frees inside its heap for reuse, and gives back only a free top of the
heap. A node's activations come and go in every size (a chunk of a cold file, a batch of decodes, an
agent's long context), so its heap grows to its peak concurrent use, holes stay resident, and the
resident set creeps up with each new peak: the memory the operator sized the box for.
`malloc_trim(0)` gives back every free page inside the heap. It runs only when the engine has
nothing to do for a client (idle, or only warm-ups: an idle engine waits for a trim that is due but
paced), at most once every `interval_s`, and only when the heap holds more than `min_free_bytes`
free: a page given back costs a page fault when a later step touches it again. A trim of ~350 MB
free takes ~20 ms.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

PAGE = os.sysconf("SC_PAGE_SIZE")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t)
                for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                             "uordblks", "fordblks", "keepcost")]


def _glibc():
    try:
        libc = ctypes.CDLL(None)
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (AttributeError, OSError):
        # not glibc (musl, macOS), or glibc before 2.33: nothing to trim by
        return None


_LIBC = _glibc()


def free_heap_bytes() -> int:
    """Bytes free inside the heap (malloc's view: given back or not); 0 where unknown."""
    return _LIBC.mallinfo2().fordblks if _LIBC is not None else 0


def used_heap_bytes() -> int:
    """Bytes malloc has handed out and not had back (inside the heap, and chunks mapped on their
    own); 0 where unknown."""
    if _LIBC is None:
        return 0
    info = _LIBC.mallinfo2()
    return info.uordblks + info.hblkhd


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def trim() -> None:
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


@dataclass
class HeapTrimmer:
    interval_s: float = 10.0
    min_free_bytes: int = 32 << 20
    clock: Callable[[], float] = time.monotonic
    free_bytes: Callable[[], int] = free_heap_bytes
    trims: int = 0
    released_bytes: int = 0  # resident bytes the trims gave back
    _last: float = field(default=float("-inf"), repr=False)

    def idle(self) -> float | None:
        """The engine has nothing to do: trim the heap if it is due and worth it. Returns how long
        the idle engine may sleep before calling again (a trim worth doing but not yet due), None:
        until woken."""
        now = self.clock()
        if self.free_bytes() < self.min_free_bytes:
            return None
        if now - self._last < self.interval_s:
            return self._last + self.interval_s - now
        self._last = now
        before = resident_bytes()
        trim()
        self.trims += 1
        self.released_bytes += max(0, before - resident_bytes())
        return None
