"""The idle engine gives the heap's free pages back (engine/heap.py): a node's resident set follows
what it uses, not the highest it ever used. The hour soak found a node's heap 80 MB larger, free,
after a flood."""

import ctypes

from warmpath.engine import heap


def _fragmented(mib: int) -> list[int]:
    """`mib` MiB of 64 KiB blocks malloc'ed and written (resident), then every block but one in
    eight freed: the freed holes sit between live blocks, below the heap's top, where glibc's own
    top trim cannot give them back."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    blocks = [libc.malloc(64 << 10) for _ in range(mib * 16)]
    for b in blocks:
        ctypes.memset(b, 1, 64 << 10)
    kept = blocks[::8]
    for b in blocks:
        if b not in kept:
            libc.free(ctypes.c_void_p(b))
    return kept


def test_an_idle_trim_gives_freed_heap_pages_back():
    kept = _fragmented(256)
    trimmer = heap.HeapTrimmer()
    before = heap.resident_bytes()
    trimmer.idle()
    assert trimmer.trims == 1
    assert before - heap.resident_bytes() > 128 << 20  # of the 224 MiB freed
    assert trimmer.released_bytes > 128 << 20
    libc = ctypes.CDLL(None)
    for b in kept:
        libc.free(ctypes.c_void_p(b))


def test_trims_are_paced_and_only_when_worth_it():
    now, free = [0.0], [64 << 20]
    trimmer = heap.HeapTrimmer(interval_s=10.0, min_free_bytes=32 << 20, clock=lambda: now[0],
                               free_bytes=lambda: free[0])
    assert trimmer.idle() is None  # trimmed: sleep until woken
    assert trimmer.trims == 1
    now[0] = 9.0
    # too soon after the last: the idle engine calls again when it is due
    assert trimmer.idle() == 1.0
    assert trimmer.trims == 1
    now[0], free[0] = 20.0, 1 << 20
    assert trimmer.idle() is None  # too little free to be worth the page faults
    assert trimmer.trims == 1
    free[0] = 40 << 20
    trimmer.idle()
    assert trimmer.trims == 2


def test_the_heap_gauges_follow_what_is_used_and_what_is_freed():
    """/metrics' warmpath_heap_used_bytes and warmpath_heap_free_bytes: what the soak reads to tell
    a leak (used grows) from a heap kept large by glibc (free grows)."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    used = heap.used_heap_bytes()
    blocks = [libc.malloc(64 << 10) for _ in range(1024)]  # 64 MiB
    assert heap.used_heap_bytes() - used >= 60 << 20
    free = heap.free_heap_bytes()
    for b in blocks[:-1:2]:  # every other block: holes below a live one, kept by malloc
        libc.free(ctypes.c_void_p(b))
    assert heap.free_heap_bytes() - free >= 28 << 20
    assert heap.used_heap_bytes() - used <= 36 << 20
    for b in blocks[1::2]:
        libc.free(ctypes.c_void_p(b))
