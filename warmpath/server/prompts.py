"""Prompt construction: fill-in-the-middle templates by model family, and chat templates."""

from __future__ import annotations

from dataclasses import dataclass

from jinja2.sandbox import ImmutableSandboxedEnvironment

from warmpath.models.tokenizer import Tokenizer


@dataclass(frozen=True)
class FimTemplate:
    name: str
    tokens: tuple[str, ...]  # special tokens whose presence identifies the family
    layout: str  # "{prefix}" / "{suffix}" placeholders around the special tokens

    def build(self, prefix: str, suffix: str) -> str:
        return self.layout.replace("{prefix}", prefix).replace("{suffix}", suffix)


FIM_TEMPLATES = (
    FimTemplate("qwen2.5-coder", ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
                "<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>"),
    FimTemplate("starcoder", ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
                "<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>"),
    FimTemplate("deepseek-coder", ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
                "<｜fim▁begin｜>{prefix}<｜fim▁hole｜>{suffix}<｜fim▁end｜>"),
    FimTemplate("codestral", ("[SUFFIX]", "[PREFIX]"), "[SUFFIX]{suffix}[PREFIX]{prefix}"),  # suffix first
)


def detect_fim(tokenizer: Tokenizer) -> FimTemplate | None:
    """The FIM template whose special tokens this tokenizer has, or None (complete from the prefix)."""
    for t in FIM_TEMPLATES:
        if all(tok in tokenizer.special_tokens or tokenizer.token_to_id(tok) is not None for tok in t.tokens):
            return t
    return None


class SuffixCutter:
    """For models without FIM tokens: cut the completion where it starts repeating the suffix's first
    non-empty line (the model ran on past the cursor into code that already exists). Works on text deltas,
    holding back the current line until it is complete."""

    def __init__(self, suffix: str):
        self.target = next((line.strip() for line in suffix.splitlines() if line.strip()), "")
        self.pending = ""
        self.cut = False

    def feed(self, delta: str, final: bool = False) -> str:
        if self.cut:
            return ""
        if not self.target:
            return delta
        self.pending += delta
        out = []
        while "\n" in self.pending:
            line, self.pending = self.pending.split("\n", 1)
            if line.strip() == self.target:
                self.cut, self.pending = True, ""
                return "".join(out)
            out.append(line + "\n")
        if final:
            if self.pending.strip() == self.target:
                self.cut = True
            else:
                out.append(self.pending)
            self.pending = ""
        return "".join(out)


_jinja = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)


def render_chat(tokenizer: Tokenizer, messages: list[dict]) -> str:
    """The model's own chat template (ChatML for SmolLM2), with the assistant turn opened."""
    template = tokenizer.chat_template
    if not template:
        raise ValueError("this model has no chat template; use /v1/completions")
    bos = tokenizer.id_to_token(tokenizer.bos_token_id) if tokenizer.bos_token_id is not None else ""
    eos = tokenizer.id_to_token(tokenizer.eos_token_id) if tokenizer.eos_token_id is not None else ""
    return _jinja.from_string(template).render(messages=messages, add_generation_prompt=True, bos_token=bos,
                                              eos_token=eos)
