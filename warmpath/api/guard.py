"""ASGI middleware shared by the server and the router: body size limit and API key, answered with the
OpenAI error object."""

from __future__ import annotations

import hmac

from fastapi.responses import JSONResponse

from warmpath.api.protocol import error_body


class GuardMiddleware:
    """Pure ASGI (no response buffering, disconnects pass through): body size limit and API key."""

    def __init__(self, app, config, open_paths: tuple[str, ...] = ("/health",)):
        self.app, self.config, self.open_paths = app, config, open_paths  # open_paths: no API key asked

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.config.max_body_bytes:
            resp = JSONResponse(error_body(f"request body over {self.config.max_body_bytes} bytes"), status_code=413)
            return await resp(scope, receive, send)
        if self.config.api_key and not _is_open(scope["path"], self.open_paths):
            auth = headers.get("authorization", "")
            if not hmac.compare_digest(auth.encode(), f"Bearer {self.config.api_key}".encode()):
                resp = JSONResponse(error_body("missing or wrong API key", "authentication_error",
                                               code="invalid_api_key"), status_code=401)
                return await resp(scope, receive, send)
        return await self.app(scope, receive, send)


def _is_open(path: str, open_paths: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p + "/") for p in open_paths)
