"""OpenAI response bodies for /v1/completions and /v1/chat/completions, whole and streamed; the
silence answer (a late or refused request: 200, empty text, finish_reason "deadline" or
"overloaded"); SSE framing.

`kind` is "completion" or "chat". A stream is `data: <json>\\n\\n` events ending with `data:
[DONE]\\n\\n`; a stream that fails ends with an error event instead, never with [DONE].
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator

from warmpath.api.ask import SILENT
from warmpath.api.protocol import error_body

SSE_DONE = "data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_OBJECT = {"completion": "text_completion", "chat": "chat.completion"}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None,
          tier_cached_tokens: int | None = None) -> dict:
    """OpenAI's usage; cached_tokens counts the prompt tokens not computed, tier_cached_tokens
    (warmpath's, with a KV tier) those of them read back from disk rather than found in RAM."""
    body = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        body["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
        if tier_cached_tokens is not None:
            body["prompt_tokens_details"]["tier_cached_tokens"] = tier_cached_tokens
    return body


def choice(kind: str, text: str, finish: str | None, delta: bool = False, first: bool = False,
           logprobs: dict | None = None, confidence: float | None = None) -> dict:
    """The one choice; for a chat stream (`delta`) the first chunk carries the role, later ones only
    text. A fill-in-the-middle answer's confidence (warmpath's own field) once it is judged."""
    if kind == "completion":
        c = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
        return c if confidence is None else {**c, "confidence": round(confidence, 4)}
    if delta:
        d = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
        return {"index": 0, "delta": d, "logprobs": logprobs, "finish_reason": finish}
    return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
            "finish_reason": finish}


def envelope(kind: str, request_id: str, model: str | None, choices: list[dict],
             chunk: bool = False, fim_mode: str | None = None) -> dict:
    body = {
        "id": request_id, "object": _OBJECT[kind] + (".chunk" if chunk and kind == "chat" else ""),
        "created": int(time.time()), "model": model, "choices": choices
    }
    if fim_mode is not None:  # how a completion with a suffix was prompted (warmpath's own field)
        body["fim_mode"] = fim_mode
    return body


def answer(kind: str, request_id: str, model: str | None, text: str, finish: str | None,
           usage_: dict, fim_mode: str | None = None, logprobs: dict | None = None,
           confidence: float | None = None) -> dict:
    """A whole (non-streamed) answer; a late, refused or unsure one (SILENT) is silence: empty text,
    no logprobs."""
    if finish in SILENT:
        text, logprobs = "", None
    c = choice(kind, text, finish, logprobs=logprobs, confidence=confidence)
    return {**envelope(kind, request_id, model, [c], fim_mode=fim_mode), "usage": usage_}


def chunk(kind: str, request_id: str, model: str | None, text: str, finish: str | None,
          first: bool = False, fim_mode: str | None = None, logprobs: dict | None = None,
          confidence: float | None = None) -> dict:
    """One streamed event's body."""
    c = choice(kind, text, finish, delta=True, first=first, logprobs=logprobs,
               confidence=confidence)
    return envelope(kind, request_id, model, [c], chunk=True, fim_mode=fim_mode)


def usage_chunk(kind: str, request_id: str, model: str | None, usage_: dict,
                fim_mode: str | None = None) -> dict:
    """The last event of a stream asked for with stream_options.include_usage: no choices, the
    usage."""
    return {**envelope(kind, request_id, model, [], chunk=True, fim_mode=fim_mode), "usage": usage_}


def silence(kind: str, model: str | None, reason: str = "deadline", request_id: str | None = None,
            usage_: dict | None = None, fim_mode: str | None = None) -> dict:
    """A late or refused answer as JSON: empty text, finish_reason `reason`, never an error."""
    return answer(kind, request_id or new_id("route"), model, "", reason, usage_ or usage(0, 0),
                  fim_mode)


def silence_sse(kind: str, model: str | None, reason: str = "deadline",
                request_id: str | None = None, first: bool = False,
                fim_mode: str | None = None) -> str:
    """The same as the end of a stream: one empty chunk with finish_reason `reason`, then [DONE].
    `first` when it opens the stream (a chat stream's first chunk carries the role)."""
    body = chunk(kind, request_id or new_id("route"), model, "", reason, first=first,
                 fim_mode=fim_mode)
    return sse(body) + SSE_DONE


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def sse_error(message: str, code: str) -> str:
    """The event that ends a stream that failed (in place of [DONE])."""
    return sse(error_body(message, "server_error", code=code))


async def sse_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Whole SSE events (`...\\n\\n`) from raw chunks, so a relay can end a stream cleanly between
    two."""
    buf = b""
    async for piece in chunks:
        buf += piece.replace(b"\r\n", b"\n")
        *events, buf = buf.split(b"\n\n")
        for e in events:
            yield e + b"\n\n"
    if buf.strip():
        yield buf


async def ndjson_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Whole NDJSON lines (Ollama's stream) from raw chunks, as sse_events does for SSE."""
    buf = b""
    async for piece in chunks:
        buf += piece
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line.strip():
                yield line + b"\n"
    if buf.strip():
        yield buf
