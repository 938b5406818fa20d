"""Hugging Face directories: config.json + *.safetensors + tokenizer.json (Llama and Qwen2
families)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from warmpath.config import ModelConfig
from warmpath.models.checkpoint import Checkpoint
from warmpath.models.tokenizer import Tokenizer

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

_ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}


def read_hf_config(cfg: dict) -> ModelConfig:
    archs = cfg.get("architectures") or []
    arch = next((_ARCHITECTURES[a] for a in archs if a in _ARCHITECTURES), None)
    if arch is None:
        raise ValueError(f"unsupported architectures {archs} (supported: {list(_ARCHITECTURES)})")
    if cfg.get("rope_scaling"):
        raise ValueError(f"rope_scaling {cfg['rope_scaling']} is not supported yet")
    heads = cfg["num_attention_heads"]
    return ModelConfig(
        architecture=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        rope_theta=float(
            cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
    )


def _first_id(value) -> int | None:
    if isinstance(value, list):
        return value[0] if value else None
    return value


def read_hf_tokenizer(path: Path, cfg: dict | None = None) -> Tokenizer:
    if cfg is None:
        cfg = json.loads((path / "config.json").read_text())
    tok_cfg_path = path / "tokenizer_config.json"
    tok_cfg = json.loads(tok_cfg_path.read_text()) if tok_cfg_path.is_file() else {}
    tokenizer_json = path / "tokenizer.json"
    if not tokenizer_json.is_file():
        raise FileNotFoundError(f"{path} has no tokenizer.json")
    template = tok_cfg.get("chat_template")
    template_file = path / "chat_template.jinja"
    if template is None and template_file.is_file():
        template = template_file.read_text()
    tok = Tokenizer.from_tokenizer_json(
        str(tokenizer_json),
        eos_token_id=_first_id(cfg.get("eos_token_id")),
        bos_token_id=_first_id(cfg.get("bos_token_id")),
        add_bos=bool(tok_cfg.get("add_bos_token", False)),
        chat_template=template,
    )
    # tokenizer_config.json names EOS by text; it wins over config.json's id when both are present.
    eos_text = tok_cfg.get("eos_token")
    if isinstance(eos_text, dict):
        eos_text = eos_text.get("content")
    if isinstance(eos_text, str) and tok.token_to_id(eos_text) is not None:
        tok.eos_token_id = tok.token_to_id(eos_text)
    return tok


def load_hf_dir(path: Path, dtype: torch.dtype) -> Checkpoint:
    from safetensors.torch import load_file

    cfg = json.loads((path / "config.json").read_text())
    config = read_hf_config(cfg)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} has no *.safetensors files")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update({k: v.to(dtype) for k, v in load_file(str(f)).items()})
    log.info("loaded %s: %s, %d layers, %d tensors", path, config.architecture, config.num_layers,
             len(weights))
    return Checkpoint(config, weights, read_hf_tokenizer(path, cfg), str(path))
