"""What every editor protocol's module does with JSON: read a body as an object (or answer in its
own error shape), name a validation error's field, build an error in its own shape, and write a
compact answer."""

from __future__ import annotations

import json

from pydantic import ValidationError

from warmpath.api.protocol import ApiError


def compact(payload) -> bytes:
    """JSON with no spaces: llama.vim takes a reply only if it matches `"content":"` (no space after
    the colon)."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


def validation_message(e: ValidationError) -> tuple[str, str | None]:
    """The first error of a body's validation as (message, field)."""
    first = e.errors()[0] if e.errors() else {}
    loc = ".".join(
        str(x) for x in first.get("loc", ())
        if not str(x).startswith(("function-", "list[", "dict[")))
    return (f"{loc}: " if loc else "") + first.get("msg", "invalid request"), loc or None


def parse_json(raw: bytes, error) -> dict:
    """The body as a JSON object, or `error(400, message)` (the protocol's own shape) raised."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise error(400, "request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise error(400, "request body must be a JSON object")
    return body


def shaped(status: int, body: dict | str) -> ApiError:
    """An ApiError answered with `body` as it is: a protocol's own error shape, JSON or (a str)
    plain text (see asgi.install_error_handlers)."""
    e = ApiError(status, "")
    # shaped: already the protocol's (the others are converted by the protocol's answers)
    e.body, e.shaped = body, True
    return e
