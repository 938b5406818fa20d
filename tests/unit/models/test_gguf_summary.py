"""Loading a GGUF file logs one summary line (architecture, quant mix, seconds): the header is all
it reads, the weights are read when the kernel packs them (kernels/packed_cache.py keeps that for
the next start)."""

import logging
import re

import torch
from gguf import GGMLQuantizationType as Q
from tiny_gguf import QWEN_VOCAB, q4_k_m, write_gguf

import warmpath.models.gguf as gguf_loader
from warmpath.models.loader import load_checkpoint


def test_loading_logs_a_summary_line(tmp_path, caplog):
    path, _, _ = write_gguf(tmp_path / "m.gguf", "qwen2", q4_k_m(4), QWEN_VOCAB, num_layers=4)
    caplog.set_level(logging.INFO, logger=gguf_loader.__name__)
    load_checkpoint(str(path), torch.float32)
    lines = [r.getMessage() for r in caplog.records if r.name == gguf_loader.__name__]
    assert len(lines) == 1, lines
    summary = lines[-1]
    assert summary.startswith(
        "loaded m.gguf: qwen2, 4 layers") and f"x{Q.Q4_K.name}" in summary, summary
    assert re.search(r"in [\d.]+ s$", summary)
