"""What warmpath keeps on disk ($WARMPATH_HOME: models, plans, packed weights, the kernel; the KV
tier) is a team's code or decides the numbers a server computes, so it is private to the user who
runs warmpath and written whole or not at all:

- directories 0700, files 0600 (the kernel 0700); a directory owned by another user, or writable by
  group or others, is refused (anyone who can write there could plant a plan, a kernel or K/V that
  we would trust);
- a file is written to a temporary name of its own (mkstemp: O_EXCL, never a link someone planted),
  fsynced, renamed over its name and the directory fsynced: after a crash or a power cut it is the
  old file or the new one.

Readers still treat what they find as untrusted: a file that does not parse or check is a cache
miss, rebuilt.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from warmpath.config import warmpath_home

DIR_MODE = 0o700
FILE_MODE = 0o600


class UnsafeDirectory(RuntimeError):
    """A directory warmpath would keep state in that others could write (or that another user
    owns)."""


def private_dir(path: Path) -> Path:
    """`path`, created 0700 with any missing parents, and checked: owned by this user and writable
    by no one else. A directory this user owns that others may read (an older warmpath's 0755) is
    made 0700."""
    path = Path(path).expanduser()
    missing = []
    at = path
    while not at.exists():
        missing.append(at)
        at = at.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it first: checked below
            d.mkdir(mode=DIR_MODE)
    st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"{path} is not a directory")
    if st.st_uid != os.geteuid():
        raise UnsafeDirectory(
            f"{path} belongs to user id {st.st_uid}, not to this user ({os.geteuid()}): warmpath "
            f"keeps code and caches it trusts there; use a directory of your own")
    if st.st_mode & 0o022:
        raise UnsafeDirectory(
            f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}): anyone "
            f"could plant a file warmpath trusts; run `chmod 700 {path}` or use another directory")
    if st.st_mode & 0o077:
        os.chmod(path, DIR_MODE)
    return path


@contextlib.contextmanager
def atomic_file(path: Path, mode: int = FILE_MODE, durable: bool = True) -> Iterator[BinaryIO]:
    """A file to write `path`'s new content into: renamed over `path` when the block ends without an
    error (else removed). `durable`: fsynced first, and the directory after, so a power cut leaves
    the old or the new file; without it a crash may leave the new name empty, for files whose reader
    checks them (the KV tier)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        if mode != FILE_MODE:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def write_atomic(path: Path, data: bytes | str, durable: bool = True) -> None:
    """`data` as the whole of `path` (atomic_file)."""
    with atomic_file(path, durable=durable) as f:
        f.write(data.encode() if isinstance(data, str) else data)


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Holds an exclusive flock on `path` (a private lock file, created if missing) for the block:
    a read-modify-write of a shared file by processes starting together (the last writer would
    otherwise drop what the others added)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def fsync_dir(path: Path) -> None:
    """Make a rename in `path` survive a power cut."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems do not sync directories
    finally:
        os.close(fd)


def home_dir(*parts: str) -> Path:
    """A private directory under $WARMPATH_HOME, the home itself made private first."""
    return private_dir(private_dir(warmpath_home()).joinpath(*parts))
