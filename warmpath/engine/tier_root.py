"""The KV tier's root as a whole: one disk bound over every key's directory, shared by every server
on the root.

Why: each change of code, plan or model starts a new key directory (`<root>/<key>/`, kv_tier.py),
and several servers may share one root; a bound per directory and per process let the root grow past
--kv-offload-bytes, and each server counted, and deleted, by its own index only.

How (one lock, no owner): `<root>/.lock` holds the root's byte count (the ledger). A server changes
files under the root only from its tier's writer thread, and only while it holds fcntl.flock on that
file, so the count stays true whatever number of servers share the root; the step thread never waits
for it. Each live tier holds a shared flock on its key's `<dir>/.in-use` for its life: a key
directory whose `.in-use` nobody holds is stale (an old model, plan or code version, or a server
that is gone). Making room deletes stale directories first, whole, the least recently used first (by
their newest block), then the least recently used blocks of live keys, any server's (a block's file
time is its last use: kv_tier.py sets it at each write, read and reuse). The ledger is recounted
from the files at each start and when the known blocks run out, which also corrects a crash's or a
hand's changes. Only files this tier writes are ever deleted (`<hash>.kv`; its temporary
`.<hash>.kv.<random>.tmp`, store.atomic_file, once older than STALE_TMP_S, and an older warmpath's
`<hash>.tmp`; `.in-use`), and a directory only once it is empty of them. The root, key directories
and `.lock`, `.in-use` are private (0700, 0600: store.py). Local filesystems only (flock over NFS is
not reliable).
"""

from __future__ import annotations

import fcntl
import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from warmpath.store import FILE_MODE, private_dir

LOCK = ".lock"
IN_USE = ".in-use"
BLOCK = re.compile(r"[0-9a-f]{64}\.kv")
# A block's temporary file (store.atomic_file's mkstemp name; an older warmpath's `<hash>.tmp`): a
# write under way, or cut short by a crash.
PARTIAL = re.compile(r"\.[0-9a-f]{64}\.kv\.[a-z0-9_]+\.tmp|[0-9a-f]{64}\.tmp")
# a temporary file older than this is a crash's leftover, not a write in progress
STALE_TMP_S = 600.0


@dataclass
class Candidate:
    """A block file that may go to make room, as the last count saw it."""

    path: Path
    mtime_ns: int
    stale: bool  # its key directory had no live tier


class TierRoot:
    """One tier's handle on the shared root; used from its writer thread only (and at its start)."""

    def __init__(self, root: Path, max_bytes: int):
        self.root, self.max_bytes = root, max_bytes
        private_dir(root)
        self._fd = _open_private(root / LOCK)
        # key directories this tier holds: the .in-use descriptor
        self._in_use: dict[Path, int] = {}
        # oldest first: stale directories', then live blocks
        self._candidates: deque[Candidate] = deque()
        self._counted = False
        self.stale_keys_pruned = 0  # stale key directories removed, emptied

    @contextmanager
    def locked(self) -> Iterator[TierRoot]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield self
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    # -- under locked() ----------------------------------------------------------------------------
    def join(self, key_dir: Path) -> None:
        """This tier uses key_dir from now on (until close()): never stale to anyone."""
        private_dir(key_dir)  # again under the lock: a pruner may have removed it, empty
        fd = _open_private(key_dir / IN_USE)
        fcntl.flock(fd, fcntl.LOCK_SH)
        self._in_use[key_dir] = fd
        self._counted = False  # count the root afresh at this start

    def make_room(self, need: int, on_deleted: Callable[[Path], None]) -> bool:
        """Delete the least recently used blocks (stale keys' first) until `need` more bytes fit the
        bound; whether they fit. on_deleted: each deleted block file (the owning tier forgets its
        own)."""
        if need > self.max_bytes:
            return False
        recounted, checked, emptied = not self._counted, {}, set()
        used = self._count() if recounted else self.used()
        while used + need > self.max_bytes:
            if not self._candidates:
                if recounted:
                    break
                used, recounted = self._count(), True
                continue
            c = self._candidates.popleft()
            if c.stale and c.path.parent not in checked:
                checked[c.path.parent] = self._stale(c.path.parent)
            if c.stale and not checked[c.path.parent]:
                # a server took the key up again: its blocks are live ones now
                self._candidates.clear()
                continue
            try:
                st = c.path.stat()
                if st.st_mtime_ns != c.mtime_ns:
                    # used since the count: not among the least recently used
                    continue
                c.path.unlink()
            except OSError:  # gone already (another server's tier made room)
                continue
            used -= st.st_size
            on_deleted(c.path)
            if c.stale:
                emptied.add(c.path.parent)
        for d in emptied:
            self._prune(d, had_blocks=True)
        self._set_used(used)
        return used + need <= self.max_bytes

    def grow(self, delta: int) -> None:
        """A write under this lock changed the root's bytes by delta."""
        self._set_used(self.used() + delta)

    def delete(self, path: Path) -> None:
        """A block file found bad: gone, and out of the count."""
        try:
            size = path.stat().st_size
            path.unlink()
        except OSError:
            return
        self._set_used(self.used() - size)

    def used(self) -> int:
        """The ledger: the root's bytes (counted afresh when the file holds no number)."""
        raw = os.pread(self._fd, 32, 0)
        return int(raw) if raw.strip().isdigit() else self._count()

    # -- inside ------------------------------------------------------------------------------------
    def _set_used(self, n: int) -> None:
        data = str(max(0, n)).encode()
        os.pwrite(self._fd, data, 0)
        os.ftruncate(self._fd, len(data))

    def _count(self) -> int:
        """Every key directory's blocks, from the files: the ledger and the candidates, oldest
        first."""
        stale: dict[Path, list[tuple[int, Path, int]]] = {}
        live: list[tuple[int, Path, int]] = []
        for d in sorted(p for p in self.root.iterdir() if p.is_dir() and not p.is_symlink()):
            is_stale, files = self._stale(d), []
            for p in d.iterdir():
                try:
                    if BLOCK.fullmatch(p.name):
                        st = p.stat()
                        files.append((st.st_mtime_ns, p, st.st_size))
                    elif is_stale and _leftover(p):  # a live key's may be being written
                        p.unlink()
                except OSError:
                    continue
            if is_stale and not files:
                self._prune(d, had_blocks=False)
            (stale.setdefault(d, []) if is_stale else live).extend(files)
        by_age = sorted(stale, key=lambda d: max(t for t, _, _ in stale[d]) if stale[d] else 0)
        self._candidates = deque([
            *(Candidate(p, t, True) for d in by_age for t, p, _ in sorted(stale[d])),
            *(Candidate(p, t, False) for t, p, _ in sorted(live))
        ])
        used = sum(size for files in (*stale.values(), live) for _, _, size in files)
        self._set_used(used)
        self._counted = True
        return used

    def _stale(self, key_dir: Path) -> bool:
        """No live tier holds key_dir (none of this process's, and no shared flock on its
        .in-use)."""
        if key_dir in self._in_use:
            return False
        try:
            fd = os.open(key_dir / IN_USE, os.O_RDONLY)
        except FileNotFoundError:  # an older warmpath's, or a start that never finished
            return True
        except OSError:
            return False  # cannot tell: keep it
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        finally:
            os.close(fd)  # (drops the lock just taken)

    def _prune(self, key_dir: Path, had_blocks: bool) -> None:
        """Remove a stale key directory that holds nothing but the tier's own leftovers (and is one:
        it held blocks, or has an .in-use); anything else keeps it."""
        if key_dir in self._in_use or not self._stale(key_dir) or not (had_blocks or
                                                                       (key_dir / IN_USE).exists()):
            return
        try:
            found = list(key_dir.iterdir())
            if not all(p.name == IN_USE or _leftover(p) for p in found):
                # another file, or a write under way
                return
            for p in found:
                p.unlink()
            key_dir.rmdir()
        except OSError:
            return
        self.stale_keys_pruned += 1

    def close(self) -> None:
        for fd in self._in_use.values():
            os.close(fd)
        self._in_use.clear()
        os.close(self._fd)


def _open_private(path: Path) -> int:
    """`path` opened for reading and writing, created 0600 (never through a link); made 0600 if it
    was not."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


def _leftover(path: Path) -> bool:
    """A block's temporary file that no write is making any more (older than STALE_TMP_S)."""
    if not PARTIAL.fullmatch(path.name):
        return False
    try:
        return time.time() - path.stat().st_mtime > STALE_TMP_S
    except OSError:
        return False
