"""ASGI middleware shared by the server and the router: API key (401; two Authorization headers:
400), then the body read under a size limit (413) and a time limit (408), answered with the OpenAI
error object.

The limit is on the bytes actually received, whatever the framing: a `Content-Length` over it is
refused before any byte of the body is read, a chunked body as soon as its running total passes it.
Headers are decoded as latin-1, as Starlette does, so no header byte can make a request fail with a
500.
"""

from __future__ import annotations

import asyncio
import hmac

from fastapi.responses import JSONResponse

from warmpath.api.credentials import accepted_keys, authorization
from warmpath.api.protocol import ApiError, error_body


class _TooLarge(Exception):
    pass


class _Gone(Exception):
    """The client went away while sending its body."""


class GuardMiddleware:
    """Pure ASGI (no response buffering, disconnects pass through). The app sees a request only once
    its whole body is in, within the limits; the body is handed on as one message."""

    def __init__(self, app, config, open_paths: tuple[str, ...] = ("/health",)):
        # open_paths: no API key asked
        self.app, self.config, self.open_paths = app, config, open_paths
        self.keys = [f"Bearer {k}".encode() for k in accepted_keys(config)]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v for k, v in scope.get("headers", [])}
        limit = self.config.max_body_bytes
        length = headers.get("content-length", b"").decode("latin-1")
        if length.isdigit() and int(length) > limit:
            return await _refuse(413, f"request body over {limit} bytes", scope, receive, send)
        try:
            # on every path: two credentials are ambiguous to every later reader (admin, session,
            # salt) too
            auth = authorization(scope.get("headers", [])).encode("latin-1")
        except ApiError as e:
            return await JSONResponse(e.body, status_code=e.status)(scope, receive, send)
        if self.keys and not _is_open(scope["path"], self.open_paths):
            if not any(hmac.compare_digest(auth, k) for k in self.keys):
                # each compared in constant time
                return await _refuse(401, "missing or wrong API key", scope, receive, send,
                                     "authentication_error", "invalid_api_key")
        try:
            async with asyncio.timeout(self.config.body_timeout):
                body = await _read_body(receive, limit)
        except _TooLarge:
            return await _refuse(413, f"request body over {limit} bytes", scope, receive, send)
        except TimeoutError:
            return await _refuse(408, "request body not received in time", scope, receive, send,
                                 code="timeout")
        except _Gone:
            return None
        return await self.app(scope, _replay(body, receive), send)


async def _read_body(receive, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Gone()
        piece = message.get("body", b"")
        size += len(piece)
        if size > limit:  # refused now: the rest is never read into memory
            raise _TooLarge()
        chunks.append(piece)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive):
    """The app's receive: the whole body once, then the real channel (its disconnect)."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _refuse(status: int, message: str, scope, receive, send,
                  type_: str = "invalid_request_error", code: str | None = None) -> None:
    # 408: the connection is closed (the client is too slow to wait for). 413 keeps it open: the
    # server reads and drops what the client is still sending (the protocol discards a body past its
    # answer, within the keep-alive and header timeouts), so the client gets the 413 instead of a
    # reset mid-upload.
    headers = {"connection": "close"} if status == 408 else None
    resp = JSONResponse(error_body(message, type_, code=code), status_code=status, headers=headers)
    await resp(scope, receive, send)


def _is_open(path: str, open_paths: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p + "/") for p in open_paths)
