"""ASGI helpers shared by the server and the router: the client's disconnect, the X-Deadline-Ms
header, the session key, and the error handlers that answer every failure with the OpenAI error
object."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable
from typing import NamedTuple, TypeVar

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException

from warmpath.api.credentials import authorization
from warmpath.api.protocol import ApiError, error_body

log = logging.getLogger(__name__)
T = TypeVar("T")
_TYPE_NAMES = {"str", "int", "float", "bool", "dict", "list", "none"}
DEADLINE_HEADER = "X-Deadline-Ms"


class ClientGone(Exception):
    """The client disconnected while we waited on its answer."""


async def wait_disconnect(request: Request) -> None:
    """Returns when the client goes away. Reads the request's receive channel: call it after the
    body is read."""
    while True:
        if (await request.receive())["type"] == "http.disconnect":
            return


class Cancellable:
    """`work` in a task of its own, cancelled through an anyio scope. httpx closes a connection in
    regions shielded from anyio's cancellation only: a plain Task.cancel() that lands there (say, as
    the answer's last byte is read) stops the close halfway and leaves the connection taken in its
    pool for good. The task ends cancelled when the scope stopped `work`."""

    def __init__(self, work: Awaitable[T]):
        self.scope = anyio.CancelScope()
        self.task: asyncio.Task[T] = asyncio.ensure_future(self._run(work))

    async def _run(self, work: Awaitable[T]) -> T:
        with self.scope:
            return await work
        raise asyncio.CancelledError

    def cancel(self) -> None:
        self.scope.cancel()


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result, unless the client goes away first: then `work` is cancelled (a request given
    up before its answer must stop its work at once, not when the answer comes) and ClientGone is
    raised. `work`'s own exceptions pass through."""
    running = Cancellable(work)
    gone = asyncio.ensure_future(wait_disconnect(request))
    try:
        await asyncio.wait({running.task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        running.cancel()
        gone.cancel()
        # what `work` holds is closed before we go on, even as our own waits are cancelled
        with anyio.CancelScope(shield=True):
            await asyncio.gather(running.task, gone, return_exceptions=True)
    if running.task.cancelled():
        raise ClientGone()
    return running.task.result()


def parse_deadline(headers, now: float) -> float | None:
    """The monotonic deadline X-Deadline-Ms sets, counted from `now`; None without the header.
    ApiError (400) when it is not a positive, finite number of milliseconds."""
    raw = headers.get(DEADLINE_HEADER.lower())
    if raw is None:
        return None
    try:
        ms = float(raw)
    except ValueError:
        ms = float("nan")
    if not ms > 0 or ms == float("inf"):
        raise ApiError(400, f"{DEADLINE_HEADER} must be a positive number of milliseconds",
                       param=DEADLINE_HEADER)
    return now + ms / 1000


class Session(NamedTuple):
    key: str | None  # None: the request names no session
    hashed: bool  # the client's id was longer than the cap: key is its hash


def session_key(headers, user, max_chars: int = 128) -> Session:
    """Which session a request belongs to: the X-Session-Id header, else the protocol's user field
    (a string: OpenAI's and Tabby's `user`, Mistral's `prompt_cache_key`), else a hash of the bearer
    token (llama.vim can set no other header; the token itself is never kept). An id longer than
    max_chars is kept as a hash of itself: server and router keep sessions as keys, and a client's
    id could be a header's 64 KiB. The server and the router both use this rule."""
    if headers.get("x-session-id"):
        key = headers["x-session-id"]
    elif isinstance(user, str) and user:
        key = user
    else:
        auth = authorization(headers)
        if not (auth[:7].lower() == "bearer " and auth[7:].strip()):
            return Session(None, False)
        return Session("key-" + hashlib.sha256(auth.encode("latin-1")).hexdigest()[:32], False)
    if len(key) <= max_chars:
        return Session(key, False)
    return Session("sid-" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32],
                   True)


def install_error_handlers(app: FastAPI) -> None:
    """Every error answered as the OpenAI error object: ApiError with its status, a validation error
    as 400 naming the field, Starlette's own (no such route 404, wrong method 405, a body that does
    not parse 400) with theirs, anything else (a bug: logged with its traceback) as 500."""

    @app.exception_handler(ApiError)
    async def api_error(_: Request, e: ApiError):
        if isinstance(e.body, str):  # a protocol whose errors are plain text (Tabby's)
            return PlainTextResponse(e.body, status_code=e.status)
        return JSONResponse(e.body, status_code=e.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        if e.status_code == 404:
            message = f"Invalid URL ({request.method} {request.url.path})"  # OpenAI's words
        elif e.status_code == 405:
            message = f"method {request.method} not allowed on {request.url.path}"
        elif e.status_code == 400:
            # FastAPI could not read the body: not JSON, not UTF-8, nested too deep
            message = "request body is not valid JSON"
        else:
            message = str(e.detail)
        return JSONResponse(error_body(message), status_code=e.status_code, headers=e.headers)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, e: Exception):
        log.exception("unhandled error")
        return JSONResponse(error_body(f"internal error: {type(e).__name__}", "server_error"),
                            status_code=500)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        # pydantic names the union member tried ("prompt.str", "prompt.list[int].0"): the field is
        # what counts
        loc = [
            str(x) for x in first.get("loc", ())
            if x != "body" and str(x) not in _TYPE_NAMES and "[" not in str(x)
        ]
        msg = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":  # its loc is a character offset, not a field
            msg, loc = "request body is not valid JSON", []
        return JSONResponse(
            error_body(f"{'.'.join(loc) + ': ' if loc else ''}{msg}", param=".".join(loc) or None),
            status_code=400)
