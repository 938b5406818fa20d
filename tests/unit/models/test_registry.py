"""Model specs resolve to files; a missing bundled model says which command fetches it."""

import subprocess
import sys

import pytest

from warmpath import LLM
from warmpath.models.registry import BUNDLED, ModelNotFoundError, bundled, resolve_model


def test_missing_bundled_model_names_the_fetch_command(tmp_path, monkeypatch):
    monkeypatch.setenv("WARMPATH_HOME", str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="warmpath fetch-model smollm2"):
        LLM("smollm2")


def test_truncated_bundled_model_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setenv("WARMPATH_HOME", str(tmp_path))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF" + b"\0" * 100)
    with pytest.raises(ModelNotFoundError, match="fetch-model"):
        resolve_model("smollm2")


def test_a_bundled_model_is_named_by_its_ollama_tag_too(tmp_path, monkeypatch):
    """Zed and Ollama clients tell a model's FIM format by the name before the colon:
    `qwen2.5-coder:0.5b` names the bundled 0.5B wherever its registry name does (the fetch, the
    model spec, the file's path)."""
    monkeypatch.setenv("WARMPATH_HOME", str(tmp_path))
    assert bundled("qwen2.5-coder:0.5b") is bundled(
        "qwen2.5-coder-0.5b") is BUNDLED["qwen2.5-coder-0.5b"]
    assert bundled("/somewhere/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf").tag == "qwen2.5-coder:1.5b"
    assert bundled("qwen2.5-coder:7b") is None and bundled("smollm2:135m").name == "smollm2"
    with pytest.raises(ModelNotFoundError, match="warmpath fetch-model qwen2.5-coder-0.5b"):
        resolve_model("qwen2.5-coder:0.5b")  # not fetched here: the message names the command


def test_paths_resolve(tiny_llama_dir, tmp_path):
    assert resolve_model(str(tiny_llama_dir)) == tiny_llama_dir
    with pytest.raises(ModelNotFoundError, match="neither a bundled name"):
        resolve_model(str(tmp_path / "nope.gguf"))
    with pytest.raises(ModelNotFoundError):
        resolve_model(str(tmp_path))  # a directory without config.json


def test_cli_reports_a_failed_first_fetch_cleanly(tmp_path):
    """`warmpath serve` without --model fetches the default model on first use; when that fails (no
    index here: nothing is downloaded) it says so, and which command retries it, without a
    traceback."""
    env = {"WARMPATH_HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "PIP_NO_INDEX": "1"}
    r = subprocess.run([sys.executable, "-m", "warmpath.cli", "serve"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 2
    assert "warmpath fetch-model qwen2.5-coder-0.5b" in r.stderr and "Traceback" not in r.stderr


def test_cli_flags_map_one_to_one_to_engine_config():
    import argparse

    from warmpath.cli import add_engine_flags, engine_config
    from warmpath.config import EngineConfig, SchedulerConfig

    parser = argparse.ArgumentParser()
    add_engine_flags(parser)
    cfg = engine_config(
        parser.parse_args([
            "--no-enable-prefix-caching", "--max-num-batched-tokens", "64", "--dtype", "float32",
            "--num-kv-blocks", "10", "--no-warm-late-prompts"
        ]))
    assert cfg == EngineConfig(
        enable_prefix_caching=False, dtype="float32", num_kv_blocks=10,
        scheduler=SchedulerConfig(max_num_batched_tokens=64, warm_late_prompts=False))
    assert engine_config(parser.parse_args([])) == EngineConfig()
