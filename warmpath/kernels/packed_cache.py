"""The native kernel's packed matrices of one model file, kept on disk after the first start and
read back at the next: a restart neither converts the GGUF file's blocks nor packs them again
(seconds for a 0.5B model).

Per model file and packing (weights mode, activations), the latest code's (an older one's is
removed), under $WARMPATH_HOME/packed/: `KEY.bin` (the packed bytes, each matrix 64-byte aligned)
beside `KEY.json` (name -> kind, rows, cols, int8, offset, bytes). A damaged or partial pair is
packed again. Read into the process's own memory, as packing would have left it (a mapped file's 4
KiB pages would not be what the plan timed).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from warmpath.identity import model_identity, numerics_identity
from warmpath.store import atomic_file, home_dir, write_atomic

log = logging.getLogger(__name__)

ALIGN = 64


@dataclass
class PackedMatrix:
    kind: str  # kernels/packing.py KINDS
    rows: int
    cols: int
    int8: bool  # quants in the order of the int8 products
    data: torch.Tensor  # uint8, the kernel's layout (native.pack)


def cache_path(source: str, options: str) -> Path | None:
    """Where a model file's packed matrices are kept (None: not a file, e.g. an HF directory)."""
    path = Path(source)
    if not path.is_file():
        return None
    # the packing and the conversions of a GGUF file's blocks before it are numerics code
    # (identity.NUMERICS)
    h = hashlib.sha256(f"{model_identity(path)}|{numerics_identity()}|{options}".encode())
    return home_dir("packed") / f"{path.stem}-{options.replace(' ', '-')}-{h.hexdigest()[:16]}.bin"


class PackedCache:
    """Packed matrices by name: from the cache file where it has them, else made and written when
    save()d."""

    def __init__(self, path: Path | None):
        self.path = path
        self.entries: dict[str, dict] = {}
        self.made: dict[str, PackedMatrix] = {}
        self._data: torch.Tensor | None = None
        if path is not None and path.exists() and path.with_suffix(".json").exists():
            try:
                self.entries = json.loads(path.with_suffix(".json").read_text())
                size = path.stat().st_size
                if any(e["offset"] + e["bytes"] > size for e in self.entries.values()):
                    raise ValueError("shorter than its index")
                self._data = torch.empty(size, dtype=torch.uint8)
                with open(path, "rb") as f:
                    if f.readinto(memoryview(self._data.numpy())) != size:
                        raise ValueError("shorter than it was")
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("packed weights %s unreadable (%s): packing again", path, e)
                self.entries, self._data = {}, None

    def get(self, name: str, make: Callable[[], list[PackedMatrix]]) -> list[PackedMatrix]:
        """A (fused) matrix's parts, one kind each (kernels/native.py chains them): read back, or
        made."""
        if self._data is not None and f"{name}#0" in self.entries:
            parts, i = [], 0
            while (e := self.entries.get(f"{name}#{i}")) is not None:
                data = self._data[e["offset"]:e["offset"] + e["bytes"]]
                parts.append(PackedMatrix(e["kind"], e["rows"], e["cols"], e["int8"], data))
                i += 1
            return parts
        parts = make()
        self.made.update({f"{name}#{i}": m for i, m in enumerate(parts)})
        return parts

    def save(self) -> None:
        """Write what was made (all of it: a model's matrices are packed together or not at all)."""
        if self.path is None or not self.made or self.entries:
            return
        index, offset = {}, 0
        try:
            self.path.with_suffix(".json").unlink(missing_ok=True)
            with atomic_file(self.path) as f:
                # the data first, the index last: an index is only beside its data
                for name, m in self.made.items():
                    pad = -offset % ALIGN
                    f.write(b"\0" * pad)
                    offset += pad
                    raw = m.data.contiguous().numpy()
                    f.write(memoryview(raw))
                    index[name] = {"kind": m.kind, "rows": m.rows, "cols": m.cols, "int8": m.int8,
                                   "offset": offset, "bytes": raw.nbytes}
                    offset += raw.nbytes
            write_atomic(self.path.with_suffix(".json"), json.dumps(index))
            stem = self.path.name.rsplit("-", 1)[0]
            for old in self.path.parent.glob(f"{stem}-*"):
                # this file's packings by older code: never read again
                if old.suffix in (".bin", ".json") and old.stem != self.path.stem:
                    old.unlink(missing_ok=True)
        except OSError as e:  # a full disk: the next start packs again
            log.warning("could not keep the packed weights at %s: %s", self.path, e)
