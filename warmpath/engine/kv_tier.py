"""The disk tier of the KV cache: every prefix block the RAM pool caches is also written here (off the step
thread), so a block the pool later evicts, or a whole pool lost to a restart, comes back by reading instead of
recomputing. A developer back from lunch finds their file's prefix here.

One file per block, `<root>/<key>/<block hash>.kv`, under a key that names everything that makes K/V valid
(the model file, the numerics of the backends that computed it, the KV dtype, the block size; engine.py
tier_key()). The block hash already chains the request's cache salt (block_pool.py), so one tenant's blocks
are never found by another's hashes. A file is trusted only whole: its header repeats the key, the hash and the
block's token ids, and a checksum covers the payload; anything else (truncated, flipped, foreign) is deleted
and recomputed. The tier is bounded in bytes: the least recently used blocks go first.

Pure Python over bytes (the simulator imports this module): kv_offload.py copies a block's tensors in and out.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import queue
import struct
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from warmpath.store import private_dir, write_atomic

log = logging.getLogger(__name__)

MAGIC = b"WPKV\x01"
# magic, key digest (32), block hash (32), tokens in the block, payload bytes, payload blake2b (32)
HEADER = struct.Struct(f"<{len(MAGIC)}s32s32sIQ32s")
STALE_TMP_S = 600.0  # a temporary file older than this is a crash's leftover, not a write in progress


class KVTier(Protocol):
    """What the scheduler restores from: kv_offload.py's over this DiskTier; the simulator's sim/tier.py."""

    seconds_per_block: float | None  # what reading a block back costs (None: not known yet)

    def has(self, block_hash: bytes) -> bool: ...

    def restore(self, blocks: list[int], hashes: list[bytes], token_ids: list[tuple[int, ...]]) -> int:
        """Fill these fresh pool blocks with the kept K/V of these hashes, in order; how many it filled (it stops
        at the first block it cannot read: a damaged file is recomputed, never used)."""
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
    blocks_rejected: int = 0  # corrupt, truncated or foreign files: deleted, their tokens recomputed
    blocks_evicted: int = 0
    write_errors: int = 0  # e.g. a full disk: the block stays in RAM only


def _digest(payload: bytes | memoryview) -> bytes:
    return hashlib.blake2b(payload, digest_size=32).digest()


class DiskTier:
    """Blocks on disk by hash, LRU within max_bytes. `put` queues a write; `has` and `read` see queued blocks
    too, so a block is never missing between its caching and its write."""

    def __init__(self, root: str | Path, key: str, max_bytes: int):
        self.dir = private_dir(private_dir(Path(root)) / key)  # a team's code, as token ids and K/V
        self.key_digest = hashlib.sha256(key.encode()).digest()
        self.max_bytes = max_bytes
        self.stats = TierStats()
        self._lock = threading.Lock()
        self._index: OrderedDict[bytes, int] = OrderedDict()  # hash -> file bytes, least recently used first
        self._pending: dict[bytes, tuple[tuple[int, ...], bytes]] = {}
        self._bytes = 0
        self._writes: queue.SimpleQueue = queue.SimpleQueue()
        self._last_error_log = 0.0
        self._scan()
        self._writer = threading.Thread(target=self._write_loop, name="warmpath-kv-tier", daemon=True)
        self._writer.start()

    def _scan(self) -> None:
        """What an earlier run left: indexed oldest first by modification time (checked when read)."""
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
        for p in self.dir.glob("*.tmp"):  # a write cut short by a crash (not one another server is making now)
            with contextlib.suppress(OSError):
                if time.time() - p.stat().st_mtime > STALE_TMP_S:
                    p.unlink()
        self._shrink()
        if found:
            log.info("KV tier: %d blocks (%.0f MB) found in %s", len(self._index), self._bytes / 1e6, self.dir)

    @property
    def num_blocks(self) -> int:
        return len(self._index) + len(self._pending)

    @property
    def num_bytes(self) -> int:
        return self._bytes

    def has(self, block_hash: bytes) -> bool:
        with self._lock:
            return block_hash in self._pending or block_hash in self._index

    def touch(self, block_hash: bytes) -> None:
        """A kept block was used again: the last to go."""
        with self._lock:
            if block_hash in self._index:
                self._index.move_to_end(block_hash)

    def put(self, block_hash: bytes, token_ids: tuple[int, ...], payload: bytes) -> None:
        """Keep a computed block (written by the writer thread); one already kept is only marked as used."""
        with self._lock:
            if block_hash in self._index:
                self._index.move_to_end(block_hash)
                return
            if block_hash in self._pending:
                return
            self._pending[block_hash] = (token_ids, payload)
        self._writes.put(block_hash)

    def read(self, block_hash: bytes, token_ids: tuple[int, ...], nbytes: int) -> bytes | None:
        """The block's payload, verified (its key, hash, tokens, size and checksum), or None: a file that fails is
        deleted and the caller recomputes the tokens."""
        with self._lock:
            pending = self._pending.get(block_hash)
            if pending is not None:
                return pending[1] if pending[0] == token_ids and len(pending[1]) == nbytes else None
            if block_hash not in self._index:
                return None
            self._index.move_to_end(block_hash)
        path = self._path(block_hash)
        try:
            data = path.read_bytes()
        except OSError:
            data = b""
        payload = self._verify(data, block_hash, token_ids, nbytes)
        if payload is None:
            self.stats.blocks_rejected += 1
            log.warning("KV tier: block %s is corrupt, truncated or not this model's: deleted, recomputed",
                        block_hash.hex()[:16])
            self._drop(block_hash)
            return None
        self.stats.blocks_read += 1
        try:
            os.utime(path)  # the next start orders blocks by last use
        except OSError:
            pass
        return payload

    def _verify(self, data: bytes, block_hash: bytes, token_ids: tuple[int, ...], nbytes: int) -> bytes | None:
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
        with self._lock:
            size = self._index.pop(block_hash, None)
            if size is not None:
                self._bytes -= size
        self._path(block_hash).unlink(missing_ok=True)

    def _shrink(self) -> None:
        while self._bytes > self.max_bytes and self._index:
            with self._lock:
                h, size = self._index.popitem(last=False)
                self._bytes -= size
            self._path(h).unlink(missing_ok=True)
            self.stats.blocks_evicted += 1

    # -- the writer thread ----------------------------------------------------------------------------------
    def _write_loop(self) -> None:
        try:  # the lowest CPU priority (Linux: per thread): on 2 cores, writing must not slow the steps
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError):
            pass
        while True:
            h = self._writes.get()
            if h is None:
                return
            with self._lock:
                item = self._pending.get(h)
            if item is None:
                continue
            token_ids, payload = item
            data = HEADER.pack(MAGIC, self.key_digest, h, len(token_ids), len(payload), _digest(payload)) + \
                np.asarray(token_ids, dtype="<i8").tobytes() + payload
            try:  # whole or absent under its name; not fsynced: a block torn by a power cut fails its checksum
                write_atomic(self._path(h), data, durable=False)
            except OSError as e:
                self.stats.write_errors += 1
                with self._lock:
                    self._pending.pop(h, None)
                now = time.monotonic()
                if now - self._last_error_log > 60:
                    self._last_error_log = now
                    log.warning("KV tier: cannot write to %s (%s); blocks stay in RAM only, recomputed when evicted",
                                self.dir, e)
                continue
            with self._lock:
                self._pending.pop(h, None)
                self._index[h] = len(data)
                self._bytes += len(data)
            self.stats.blocks_written += 1
            self._shrink()

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every queued block is on disk (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while self._pending and time.monotonic() < deadline:
            time.sleep(0.005)

    def close(self) -> None:
        self.flush()
        self._writes.put(None)
        self._writer.join(timeout=10)
