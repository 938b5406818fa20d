"""A GGUF file's header read directly: metadata as Python values, tensors as views of the
memory-mapped file.

gguf-py's GGUFReader builds numpy objects for every element of every array (seconds per 150k-token
vocabulary, paid at each start); this reads strings and numbers straight into Python lists.
Format: github.com/ggml-org/ggml docs/gguf.md (versions 2 and 3, little-endian)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF metadata value types -> struct format (8 = string, 9 = array are read apart).
_SCALARS = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
    12: "<d"
}
_NUMPY = {
    0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8",
    11: "<i8", 12: "<f8"
}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # as the file lists it: innermost dimension first
    tensor_type: GGMLQuantizationType
    n_bytes: int
    data: np.ndarray  # uint8 view of the mapped file: read-only, nothing copied until a caller does


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    version: int
    fields: dict[str, Any]
    tensors: list[GGUFTensor]

    def field(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


class _Cursor:
    def __init__(self, buf: memoryview, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def unpack(self, fmt: str) -> Any:
        try:
            (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        except struct.error:
            raise ValueError(f"{self.path}: truncated GGUF header at byte {self.pos}") from None
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        if self.pos + n > len(self.buf):
            raise ValueError(f"{self.path}: truncated GGUF header at byte {self.pos}")
        s = str(self.buf[self.pos:self.pos + n], "utf-8")
        self.pos += n
        return s

    def strings(self, count: int) -> list[str]:
        """An array of strings (a vocabulary: ~150k of them) in one tight loop."""
        buf, pos, length = self.buf, self.pos, _U64.unpack_from
        out = []
        append = out.append
        try:
            for _ in range(count):
                (n,) = length(buf, pos)
                pos += 8
                append(str(buf[pos:pos + n], "utf-8"))
                pos += n
        except struct.error:
            raise ValueError(f"{self.path}: truncated GGUF header at byte {pos}") from None
        if pos > len(buf):  # the last string ran past the end (a slice stops there silently)
            raise ValueError(f"{self.path}: truncated GGUF header at byte {self.pos}")
        self.pos = pos
        return out

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.unpack("<I"), self.unpack("<Q")
            if item in _NUMPY:
                dtype = np.dtype(_NUMPY[item])
                end = self.pos + count * dtype.itemsize
                if end > len(self.buf):
                    raise ValueError(f"{self.path}: truncated GGUF header at byte {self.pos}")
                values = np.frombuffer(self.buf, dtype, count, self.pos).tolist()
                self.pos = end
                return values
            if item == _STRING:
                return self.strings(count)
            return [self.value(item) for _ in range(count)]
        raise ValueError(f"{self.path}: unknown GGUF value type {kind} at byte {self.pos}")


def read_gguf(path: str | Path) -> GGUFFile:
    """The header of a GGUF file; tensor data stays in the read-only map until used."""
    path = Path(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(memoryview(mapped), path)
    if bytes(cur.buf[:4]) != MAGIC:
        raise ValueError(f"{path}: not a GGUF file (no GGUF magic)")
    cur.pos = 4
    version = cur.unpack("<I")
    if version not in (2, 3):
        raise ValueError(
            f"{path}: GGUF version {version} is not supported (2 and 3 are; a big-endian file "
            "reads as a huge version)")
    n_tensors, n_fields = cur.unpack("<Q"), cur.unpack("<Q")
    fields: dict[str, Any] = {}
    for _ in range(n_fields):
        key = cur.string()
        fields[key] = cur.value(cur.unpack("<I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = tuple(cur.unpack("<Q") for _ in range(cur.unpack("<I")))
        infos.append((name, dims, cur.unpack("<I"), cur.unpack("<Q")))
    alignment = int(fields.get("general.alignment", DEFAULT_ALIGNMENT))
    start = -(-cur.pos // alignment) * alignment
    tensors = []
    for name, dims, kind, offset in infos:
        try:
            qtype = GGMLQuantizationType(kind)
        except ValueError:
            raise ValueError(f"{path}: tensor {name} has unknown GGML type {kind}") from None
        block, size = GGML_QUANT_SIZES[qtype]
        n_bytes = int(np.prod(dims, dtype=np.int64)) // block * size
        begin = start + offset
        if begin + n_bytes > len(mapped):
            raise ValueError(
                f"{path}: tensor {name} runs past the end of the file (truncated download?)")
        tensors.append(GGUFTensor(name, dims, qtype, n_bytes, mapped[begin:begin + n_bytes]))
    return GGUFFile(path, version, fields, tensors)
