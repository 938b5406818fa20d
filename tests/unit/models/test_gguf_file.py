"""warmpath's GGUF header reader against gguf-py's GGUFReader on the same files: every metadata
value and every tensor's name, shape, type and bytes equal; a damaged file refused by name."""

import numpy as np
import pytest
from gguf import GGUFReader
from tiny_gguf import QWEN_VOCAB, every_type, write_gguf

from warmpath.models.gguf_file import read_gguf


def test_every_field_and_tensor_equals_gguf_py(tmp_path):
    path, _, _ = write_gguf(tmp_path / "every.gguf", "qwen2", every_type, QWEN_VOCAB)
    ours, theirs = read_gguf(path), GGUFReader(path)
    expected = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert ours.fields == expected
    assert isinstance(ours.fields["tokenizer.ggml.tokens"], list) and len(
        ours.fields["tokenizer.ggml.tokens"]) > 10
    assert len(ours.tensors) == len(theirs.tensors) > 0
    for a, b in zip(ours.tensors, theirs.tensors, strict=True):
        assert (a.name, a.shape, a.tensor_type,
                a.n_bytes) == (b.name, tuple(int(d)
                                             for d in b.shape), b.tensor_type, int(b.n_bytes))
        assert np.array_equal(a.data, np.ascontiguousarray(b.data).reshape(-1).view(np.uint8))
        # a view of the read-only map: the file cannot be changed through it
        assert not a.data.flags.writeable


def test_a_truncated_or_foreign_file_is_refused_by_name(tmp_path):
    path, _, _ = write_gguf(tmp_path / "m.gguf", "qwen2", every_type, QWEN_VOCAB)
    whole = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: len(whole) - 100])
    with pytest.raises(ValueError, match="runs past the end of the file"):
        read_gguf(cut)
    cut.write_bytes(whole[:2000])
    with pytest.raises(ValueError, match="truncated GGUF header"):
        read_gguf(cut)
    other = tmp_path / "weights.safetensors"
    other.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_gguf(other)
