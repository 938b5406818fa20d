"""Running the server or the router under uvicorn with the connection limits of its config
(ServerConfig or RouterConfig): a time to send the headers, a keep-alive time, a header size, a
connection count. The body's size and time limits are the guard's (guard.py), which sees the body as
it arrives.

uvicorn alone holds a connection that never finishes its headers for ever (its keep-alive timer
stops at the first byte), and answers protocol errors in plain text. `LimitedH11` closes such a
connection after `header_timeout` (408), refuses connections past `max_connections` (503), and
answers a malformed request (400) or oversized headers (431) with the OpenAI error object. After
such an answer it reads and drops what the client still sends for a moment before closing, so the
client gets the answer rather than a reset.
"""

from __future__ import annotations

import json

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from warmpath.api.protocol import error_body

LINGER_S = 2.0  # how long input is drained after an error answer before the connection is closed
_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large",
            503: b"Service Unavailable"}


class LimitedH11(H11Protocol):
    """uvicorn's h11 protocol with the limits of `limits` (a ServerConfig or RouterConfig; set by
    protocol_for)."""

    limits = None

    def connection_made(self, transport) -> None:
        self._header_timer = None
        self._refused = False
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self.refuse(503, "too many connections; try again later", "server_error")
            return
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        if self._refused:  # draining after an error answer
            return
        super().data_received(data)
        if self.cycle is not None and not self.cycle.response_complete:
            # a request's headers are in
            self._cancel_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self._arm_header_timer()  # the next request's headers are due in time as well

    def connection_lost(self, exc) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        too_big = len(self.conn.trailing_data[0]) > self.limits.max_header_bytes
        if too_big:
            self.refuse(431, f"request headers over {self.limits.max_header_bytes} bytes")
        else:
            self.refuse(400, "malformed HTTP request")

    # -- limits ------------------------------------------------------------------------------------
    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.limits.header_timeout, self._headers_late)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self.refuse(408,
                        f"request headers not received within {self.limits.header_timeout:g} s",
                        code="timeout")

    def refuse(self, status: int, message: str, type_: str = "invalid_request_error",
               code: str | None = None):
        """Answer with the OpenAI error object outside h11 (which has no request to answer here),
        then close."""
        self._cancel_header_timer()
        self._refused = True
        body = json.dumps(error_body(message, type_, code=code)).encode()
        head = (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                b"connection: close\r\n\r\n")
        self.transport.write(head % (status, _REASONS[status], len(body)) + body)
        if self.conn.our_state is not h11.ERROR:
            self.conn.send_failed()  # h11 is told this connection is over
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


def protocol_for(limits) -> type[LimitedH11]:
    return type("LimitedH11", (LimitedH11,), {"limits": limits})


def uvicorn_config(app, limits, log_level: str = "info", **kwargs) -> uvicorn.Config:
    """uvicorn's config for `app` under `limits` (its host and port unless kwargs say otherwise)."""
    kwargs.setdefault("host", limits.host)
    kwargs.setdefault("port", limits.port)
    return uvicorn.Config(app, log_level=log_level.lower(), access_log=False,
                          http=protocol_for(limits), timeout_keep_alive=limits.keep_alive_timeout,
                          h11_max_incomplete_event_size=limits.max_header_bytes, **kwargs)


def run(app, limits, log_level: str = "info") -> None:
    """`warmpath serve` / `warmpath route`: serve `app` until interrupted."""
    uvicorn.Server(uvicorn_config(app, limits, log_level)).run()
