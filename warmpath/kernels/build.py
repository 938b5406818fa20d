"""Building the native kernel: cpu/forward.c compiled with the system C compiler for this CPU, once
per source, flags and CPU, under $WARMPATH_HOME/kernels/. No torch here: `warmpath serve` starts the
compile (seconds) before torch and the model load, which it then overlaps (start_building)."""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import subprocess
import tempfile
import threading
from pathlib import Path

from warmpath.cpu import cpu_flags
from warmpath.store import home_dir, write_atomic

log = logging.getLogger(__name__)

# the one translation unit; it includes the cpu/ headers
SOURCE = Path(__file__).with_name("cpu") / "forward.c"
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC"]
# one build at a time: the one start_building() began is waited for, not repeated
_BUILDING = threading.Lock()


class NativeKernelError(RuntimeError):
    """The native kernel cannot be built or used here (no C compiler, unsupported model or
    dtype)."""


def source_digest() -> bytes:
    """Every C source of the kernel's directory (forward.c and its headers), by name and content: a
    change to any of them builds a new library."""
    h = hashlib.sha256()
    for f in sorted(SOURCE.parent.glob("*.[ch]")):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.digest()


def build_library() -> Path:
    """The built library for this CPU, compiled first if it is not there yet, or not whole: loaded
    only when its bytes are those its digest file (written after it) names, so a library a crash or
    a power cut emptied or cut short is built again, never loaded."""
    with _BUILDING:
        key = hashlib.sha256(source_digest() + " ".join(CFLAGS).encode() +
                             cpu_flags().encode()).hexdigest()[:16]
        out = home_dir("kernels") / f"cpu_forward-{platform.machine()}-{key}.so"
        digest = out.with_suffix(".so.sha256")
        if _whole(out, digest):
            return out
        cc = os.environ.get("CC", "cc")
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent, prefix=".")
        os.close(fd)
        try:
            subprocess.run([cc, *CFLAGS, "-o", tmp, str(SOURCE)], check=True, capture_output=True,
                           text=True)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
                sha = hashlib.file_digest(f, "sha256").hexdigest()
            os.chmod(tmp, 0o700)  # the linker makes its output 0755
            os.replace(tmp, out)  # atomic: servers starting together never load a half-written file
            write_atomic(digest, sha)
        except FileNotFoundError as e:
            raise NativeKernelError(f"no C compiler ({cc}) to build the native kernel") from e
        except subprocess.CalledProcessError as e:
            raise NativeKernelError(f"building the native kernel failed:\n{e.stderr}") from e
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        log.info("built the native kernel: %s", out)
        return out


def _whole(out: Path, digest: Path) -> bool:
    try:
        want = digest.read_text().strip()
        with open(out, "rb") as f:
            if hashlib.file_digest(f, "sha256").hexdigest() == want:
                return True
        log.warning(
            "native kernel %s is not the library that was built (cut short?): building it again",
            out)
        return False
    except FileNotFoundError:
        return False
    except OSError as e:
        log.warning("native kernel %s unreadable (%s): building it again", out, e)
        return False


def start_building() -> None:
    """Build the kernel in the background; native.load_library() then waits for it (and raises what
    failed)."""
    def build() -> None:
        try:
            build_library()
        except NativeKernelError:
            pass

    threading.Thread(target=build, name="native-kernel-build", daemon=True).start()
