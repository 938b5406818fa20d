"""What decides a cache's content, as digests its key is made of: the model by its whole content,
the code that computes numbers by its sources, the machine by its CPU and torch. A cache entry whose
key names all of what decides it cannot be stale: a model file changed in its middle bytes, or a
change to the KV quantization code, makes new keys, and the old entries are never read (DESIGN.md:
"keyed by model sha").

No torch here: the kernel's build (kernels/build.py) runs before torch is imported.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
from functools import cache
from importlib import metadata
from pathlib import Path

from warmpath.config import warmpath_home
from warmpath.cpu import cpu_flags, cpu_name
from warmpath.store import private_dir, write_atomic

log = logging.getLogger(__name__)

PACKAGE = Path(__file__).parent
# The packages whose code decides a step's numbers and a block's K/V: the runner and its backends,
# the model and its attention, the KV cache and its int8 quantization, the GGUF dequantization, the
# packing, the kernel's C.
NUMERICS = ("engine", "models", "kernels")


def model_identity(path: Path) -> str:
    """The model's content: sha256 of the whole file (of each weight and config file of an HF
    directory). Hashed once per file version: kept under $WARMPATH_HOME/identity by device, inode,
    size, modification and change time (a file rewritten in place changes its times; a hash of its
    ends alone would not see a new middle)."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir()
                       if p.suffix in (".safetensors", ".json") and p.is_file())
        return hashlib.sha256("|".join(f"{p.name}:{_file_sha256(p)}"
                                       for p in files).encode()).hexdigest()
    return _file_sha256(path)


def _file_sha256(path: Path) -> str:
    st = path.stat()
    stamp = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
    index = warmpath_home(
    ) / "identity" / f"{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:24]}.json"
    try:
        kept = json.loads(index.read_text())
        if kept.get("stamp") == stamp and isinstance(kept.get("sha256"), str):
            return kept["sha256"]
    except (OSError, ValueError, AttributeError):
        pass  # absent, torn or foreign: hash again
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    try:
        private_dir(index.parent)
        write_atomic(index, json.dumps({"path": str(path), "stamp": stamp, "sha256": digest}),
                     durable=False)
    except OSError as e:
        log.warning("could not keep the model's hash at %s: %s", index, e)
    return digest


@cache
def numerics_identity() -> str:
    """The sources of every module that changes numbers (NUMERICS), the torch version and the CPU
    (the kernel's paths differ by its vector units): a block's K/V computed by other code or on
    another CPU is another key."""
    h = hashlib.sha256()
    for d in NUMERICS:
        for p in sorted((PACKAGE / d).rglob("*")):
            if p.suffix in (".py", ".c", ".h") and p.is_file():
                h.update(str(p.relative_to(PACKAGE)).encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(f"torch {_torch_version()} {platform.machine()}\n{cpu_name()}\n{cpu_flags()}".encode())
    return h.hexdigest()[:24]


def _torch_version() -> str:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "none"
