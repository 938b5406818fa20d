"""The model's own chat template, rendered in a sandbox; and the rendered prompt in pieces, so that
the encoder can tokenize message contents apart from the template's own text (server/encoder.py)."""

from __future__ import annotations

import secrets

from jinja2.sandbox import ImmutableSandboxedEnvironment

from warmpath.models.tokenizer import Tokenizer

_jinja = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)


def render_chat(tokenizer: Tokenizer, messages: list[dict]) -> str:
    """The model's own chat template (ChatML for SmolLM2), with the assistant turn opened."""
    template = tokenizer.chat_template
    if not template:
        raise ValueError("this model has no chat template; use /v1/completions")
    bos = tokenizer.id_to_token(
        tokenizer.bos_token_id) if tokenizer.bos_token_id is not None else ""
    eos = tokenizer.id_to_token(
        tokenizer.eos_token_id) if tokenizer.eos_token_id is not None else ""
    return _jinja.from_string(template).render(messages=messages, add_generation_prompt=True,
                                               bos_token=bos, eos_token=eos)


def render_chat_pieces(tokenizer: Tokenizer, messages: list[dict]) -> list[tuple[str, bool]]:
    """The rendered chat prompt as (text, is_message_content) pieces. Each content is wrapped in
    markers with a fresh random nonce before rendering, so no content can fake a marker; the
    template's own text lies outside them. A template that trims a content's ends sees the markers
    instead: that content keeps its whitespace."""
    nonce = secrets.token_hex(8)
    start, end = f"\ue000{nonce}\ue001", f"\ue002{nonce}\ue003"
    rendered = render_chat(tokenizer,
                           [{**m, "content": start + m["content"] + end} for m in messages])
    pieces, rest = [], rendered
    while (i := rest.find(start)) >= 0:
        j = rest.find(end, i)
        if j < 0:
            raise ValueError("the chat template cut a message's content")
        pieces += [(rest[:i], False), (rest[i + len(start) : j], True)]
        rest = rest[j + len(end) :]
    if end in rest:
        raise ValueError("the chat template cut a message's content")
    return [p for p in [*pieces, (rest, False)] if p[0]]
