"""The disk tier of the KV cache: every prefix block the RAM pool caches is also written here (off
the step thread), so a block the pool later evicts, or a whole pool lost to a restart, comes back by
reading instead of recomputing. A developer back from lunch finds their file's prefix here.

One file per block, `<root>/<key>/<block hash>.kv`, under a key that names everything that makes K/V
valid (the model file, the numerics of the backends that computed it, the KV dtype, the block size;
engine.py tier_key()). The block hash already chains the request's cache salt (block_pool.py), so
one tenant's blocks are never found by another's hashes. A file is trusted only whole: its header
repeats the key, the hash and the block's token ids, and a checksum covers the payload; anything
else (truncated, flipped, foreign) is deleted and recomputed. The tier is bounded in bytes over its
whole root, every key and every server on it (tier_root.py): stale keys' blocks go first, then the
least recently used. Blocks waiting for the writer are bounded in bytes too: a block that does not
fit is not kept on disk, and the step never waits for the disk.

Pure Python over bytes (the simulator imports this module): kv_offload.py copies a block's tensors
in and out.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from warmpath.engine.tier_root import STALE_TMP_S, TierRoot
from warmpath.store import private_dir, write_atomic

log = logging.getLogger(__name__)

MAGIC = b"WPKV\x01"
# magic, key digest (32), block hash (32), tokens in the block, payload bytes, payload blake2b (32)
HEADER = struct.Struct(f"<{len(MAGIC)}s32s32sIQ32s")


class KVTier(Protocol):
    """What the scheduler restores from: kv_offload.py's over this DiskTier; the simulator's
    sim/tier.py."""

    seconds_per_block: float | None  # what reading a block back costs (None: not known yet)

    def has(self, block_hash: bytes) -> bool: ...

    def restore(self, blocks: list[int], hashes: list[bytes], token_ids: list[tuple[int,
                                                                                    ...]]) -> int:
        """Fill these fresh pool blocks with the kept K/V of these hashes, in order; how many it
        filled (it stops at the first block it cannot read: a damaged file is recomputed, never
        used)."""
        ...


def held_in_a_row(tier: KVTier | None, hashes: list[bytes], start: int) -> int:
    """How many of these block hashes, from `start` on, the tier holds in a row."""
    n = 0
    while tier is not None and start + n < len(hashes) and tier.has(hashes[start + n]):
        n += 1
    return n


@dataclass
class TierStats:
    blocks_written: int = 0
    blocks_read: int = 0
    # corrupt, truncated or foreign files: deleted, their tokens recomputed
    blocks_rejected: int = 0
    blocks_evicted: int = 0  # block files deleted to keep the root's bound (any key's)
    write_errors: int = 0  # e.g. a full disk: the block stays in RAM only
    # not kept: the write queue was full (a slow disk), or a block is larger than the bound
    blocks_dropped: int = 0


def _digest(payload: bytes | memoryview) -> bytes:
    return hashlib.blake2b(payload, digest_size=32).digest()


class DiskTier:
    """Blocks on disk by hash, within max_bytes over the whole root (tier_root.py). `put` queues a
    write (at most queue_bytes of payloads wait); `has` and `read` see queued blocks too, so a block
    is never missing between its caching and its write. Only the writer thread touches files for the
    bound (it alone takes the root's lock)."""

    def __init__(self, root: str | Path, key: str, max_bytes: int, queue_bytes: int = 256 << 20):
        self.dir = private_dir(private_dir(Path(root)) / key)  # a team's code, as token ids and K/V
        self.key_digest = hashlib.sha256(key.encode()).digest()
        self.max_bytes, self.queue_bytes = max_bytes, queue_bytes
        self.stats = TierStats()
        self._lock = threading.Lock()
        self._index: dict[bytes, int] = {}  # hash -> file bytes (this key's files this tier knows)
        # the write queue, oldest first
        self._pending: dict[bytes, tuple[tuple[int, ...], bytes]] = {}
        self._queued = 0  # payload bytes in _pending
        # used again: their file times move (the root's LRU order)
        self._touched: set[bytes] = set()
        self._doomed: set[bytes] = set()  # found bad on the step thread: deleted by the writer
        self._bytes = 0
        self._work, self._idle, self._closing = threading.Event(), threading.Event(), False
        self._idle.set()
        self._last_error_log = 0.0
        self.root = TierRoot(self.dir.parent, max_bytes)
        with self.root.locked():  # (another server's writer may be mid-write in this directory)
            self.root.join(self.dir)
            self._scan()
            self.root.make_room(0, self._evicted)
        self._writer = threading.Thread(target=self._write_loop, name="warmpath-kv-tier",
                                        daemon=True)
        self._writer.start()

    def _scan(self) -> None:
        """What an earlier run left: indexed oldest first by modification time (checked when
        read)."""
        found = []
        for p in self.dir.glob("*.kv"):
            try:
                st = p.stat()
                found.append((st.st_mtime, bytes.fromhex(p.stem), st.st_size))
            except (OSError, ValueError):
                continue
        for _, h, size in sorted(found):
            self._index[h] = size
            self._bytes += size
        for p in self.dir.glob("*.tmp"):
            # a write cut short by a crash (not one another server is making now)
            with contextlib.suppress(OSError):
                if time.time() - p.stat().st_mtime > STALE_TMP_S:
                    p.unlink()
        if found:
            log.info("KV tier: %d blocks (%.0f MB) found in %s", len(self._index),
                     self._bytes / 1e6, self.dir)

    @property
    def num_blocks(self) -> int:
        return len(self._index) + len(self._pending)

    @property
    def num_bytes(self) -> int:
        return self._bytes

    @property
    def queued_bytes(self) -> int:
        return self._queued

    def has(self, block_hash: bytes) -> bool:
        with self._lock:
            return block_hash in self._pending or block_hash in self._index

    def touch(self, block_hash: bytes) -> None:
        """A kept block was used again: the last to go (its file's time moves, in the writer)."""
        with self._lock:
            if block_hash in self._index:
                self._touched.add(block_hash)
                self._wake()

    def put(self, block_hash: bytes, token_ids: tuple[int, ...], payload: bytes) -> None:
        """Keep a computed block (written by the writer thread); one already kept is only marked as
        used. Never waits: with queue_bytes waiting already, the block is dropped (counted), RAM
        keeps it until evicted."""
        if block_hash in self._index:
            self.touch(block_hash)
            return
        with self._lock:
            if block_hash in self._pending:
                return
            if self._queued + len(payload) > self.queue_bytes:
                self.stats.blocks_dropped += 1
                return
            self._pending[block_hash] = (token_ids, payload)
            self._queued += len(payload)
            self._wake()

    def _wake(self) -> None:  # under self._lock
        self._idle.clear()
        self._work.set()

    def read(self, block_hash: bytes, token_ids: tuple[int, ...], nbytes: int) -> bytes | None:
        """The block's payload, verified (its key, hash, tokens, size and checksum), or None: a file
        that fails is deleted and the caller recomputes the tokens."""
        with self._lock:
            pending = self._pending.get(block_hash)
            if pending is not None:
                return pending[1] if pending[0] == token_ids and len(pending[1]) == nbytes else None
            if block_hash not in self._index:
                return None
        path = self._path(block_hash)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            # deleted for the root's bound by another server: recomputed, nothing wrong
            self._forget(path)
            return None
        except OSError:
            data = b""
        payload = self._verify(data, block_hash, token_ids, nbytes)
        if payload is None:
            self.stats.blocks_rejected += 1
            log.warning(
                "KV tier: block %s is corrupt, truncated or not this model's: deleted, recomputed",
                block_hash.hex()[:16])
            self._drop(block_hash)
            return None
        self.stats.blocks_read += 1
        try:
            t = time.time_ns()
            # the root's least recently used order is by file time (tier_root.py)
            os.utime(path, ns=(t, t))
        except OSError:
            pass
        return payload

    def _verify(self, data: bytes, block_hash: bytes, token_ids: tuple[int, ...],
                nbytes: int) -> bytes | None:
        tokens_at = HEADER.size
        payload_at = tokens_at + 8 * len(token_ids)
        if len(data) != payload_at + nbytes:
            return None
        magic, key, h, n, size, check = HEADER.unpack_from(data)
        if (magic, key, h, n, size) != (MAGIC, self.key_digest, block_hash, len(token_ids), nbytes):
            return None
        if tuple(np.frombuffer(data, dtype="<i8", count=n, offset=tokens_at).tolist()) != token_ids:
            return None
        payload = memoryview(data)[payload_at:]
        return bytes(payload) if _digest(payload) == check else None

    def _path(self, block_hash: bytes) -> Path:
        return self.dir / f"{block_hash.hex()}.kv"

    def _drop(self, block_hash: bytes) -> None:
        """A bad file: forgotten now, deleted by the writer (only it changes the root's files)."""
        with self._lock:
            size = self._index.pop(block_hash, None)
            if size is not None:
                self._bytes -= size
            self._doomed.add(block_hash)
            self._wake()

    def _forget(self, path: Path) -> None:
        """A block file that is gone (deleted for the root's bound, by this tier or another): out of
        the index."""
        if path.parent == self.dir:
            with self._lock:
                size = self._index.pop(bytes.fromhex(path.stem), None)
                if size is not None:
                    self._bytes -= size

    def _evicted(self, path: Path) -> None:  # TierRoot.make_room deleted it
        self.stats.blocks_evicted += 1
        self._forget(path)

    # -- the writer thread -------------------------------------------------------------------------
    def _write_loop(self) -> None:
        try:
            # the lowest CPU priority (Linux: per thread): on 2 cores, writing must not slow the
            # steps
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError):
            pass
        while True:
            self._work.wait()
            self._work.clear()
            while self._write_some():
                pass
            with self._lock:
                if not (self._pending or self._touched or self._doomed):
                    self._idle.set()
            if self._closing:
                return

    def _write_some(self) -> bool:
        """The oldest queued block, with the times and deletions asked for since: under the root's
        lock (another server holding it only delays this thread; the queue's bound keeps what waits
        meanwhile)."""
        with self._lock:
            touched, doomed, self._touched, self._doomed = self._touched, self._doomed, set(), set()
            h = next(iter(self._pending), None)
            item = None if h is None else self._pending[h]
        if item is None and not touched and not doomed:
            return False
        with self.root.locked():
            t = time.time_ns()
            for used in touched:
                try:
                    os.utime(self._path(used), ns=(t, t))
                except OSError:
                    pass
            for bad in doomed:
                self.root.delete(self._path(bad))
            if item is not None:
                self._write(h, *item)
        return True

    def _write(self, h: bytes, token_ids: tuple[int, ...], payload: bytes) -> None:
        data = (HEADER.pack(MAGIC, self.key_digest, h, len(token_ids), len(payload),
                            _digest(payload))
                + np.asarray(token_ids, dtype="<i8").tobytes() + payload)
        path = self._path(h)
        try:
            old = path.stat().st_size  # another server on this key wrote it: replaced, counted once
        except OSError:
            old = 0
        if not self.root.make_room(len(data) - old, self._evicted):  # larger than the whole bound
            self._done(h, payload, None, dropped=True)
            return
        try:
            # whole or absent under its name; not fsynced: a block torn by a power cut fails its
            # checksum
            write_atomic(path, data, durable=False)
        except OSError as e:
            self.stats.write_errors += 1
            self._done(h, payload, None)
            now = time.monotonic()
            if now - self._last_error_log > 60:
                self._last_error_log = now
                log.warning(
                    "KV tier: cannot write to %s (%s); blocks stay in RAM only, recomputed when "
                    "evicted",
                    self.dir, e)
            return
        self.root.grow(len(data) - old)
        with contextlib.suppress(OSError):
            # to the nanosecond: the root's LRU order (a file system's own is coarse)
            t = time.time_ns()
            os.utime(path, ns=(t, t))
        self._done(h, payload, len(data))
        self.stats.blocks_written += 1

    def _done(self, h: bytes, payload: bytes, size: int | None, dropped: bool = False) -> None:
        """Out of the queue; into the index when written (at once: has() never misses it in
        between)."""
        with self._lock:
            self._pending.pop(h, None)
            self._queued -= len(payload)
            self.stats.blocks_dropped += dropped
            if size is not None:
                self._index[h] = size
                self._bytes += size

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every queued block is on disk (tests, shutdown)."""
        self._idle.wait(timeout)

    def close(self) -> None:
        self.flush()
        self._closing = True
        self._work.set()
        self._writer.join(timeout=10)
        if not self._writer.is_alive():
            self.root.close()
