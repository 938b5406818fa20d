"""Issue 21's "loading takes seconds, with a progress line": a GGUF file from models.gguf.PROGRESS_BYTES on logs a
line every tenth of its tensor bytes up to 100% and then the summary line (architecture, quant mix, seconds);
a smaller file logs the summary only. (Lowered here so that a tiny file counts as large.)"""

import logging
import re

import torch
from gguf import GGMLQuantizationType as Q
from tiny_gguf import QWEN_VOCAB, q4_k_m, write_gguf

import warmpath.models.gguf as gguf_loader
from warmpath.models.loader import load_checkpoint


def test_a_large_file_logs_its_loading_progress(tmp_path, caplog, monkeypatch):
    path, _, _ = write_gguf(tmp_path / "m.gguf", "qwen2", q4_k_m(4), QWEN_VOCAB, num_layers=4)
    caplog.set_level(logging.INFO, logger=gguf_loader.__name__)
    load_checkpoint(str(path), torch.float32)
    small = [r.getMessage() for r in caplog.records if r.name == gguf_loader.__name__]
    assert not any(m.startswith("loading ") for m in small) and any(m.startswith("loaded m.gguf") for m in small)
    caplog.clear()
    monkeypatch.setattr(gguf_loader, "PROGRESS_BYTES", 1)
    load_checkpoint(str(path), torch.float32)
    lines = [r.getMessage() for r in caplog.records if r.name == gguf_loader.__name__]
    progress = [re.fullmatch(r"loading m\.gguf: +(\d+)% of \d+ MB \([\d.]+ s\)", line) for line in lines[:-1]]
    assert all(progress), lines
    shares = [int(m.group(1)) for m in progress]
    assert len(shares) >= 5 and shares == sorted(shares) and shares[-1] == 100, lines
    summary = lines[-1]
    assert summary.startswith("loaded m.gguf: qwen2, 4 layers") and f"x{Q.Q4_K.name}" in summary, summary
    assert re.search(r"in [\d.]+ s$", summary)
