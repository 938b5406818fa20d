"""The headers a node gets with a request: a fresh set, never the client's as they came (a client's
own `X-Warmpath-Tenant` is not among them).

With `upstream_api_key` the router authenticates as itself, so every client would reach the nodes as
one tenant (one prefix-cache salt, one session space); it names each client's tenant instead, a hash
of the client's credential (api/credentials.py). Without it the client's own Authorization goes on,
and the node finds the tenant itself.
"""

from __future__ import annotations

import time

from warmpath.api.credentials import TENANT_HEADER, authorization, tenant_of


def forward_headers(headers, session: str | None, deadline: float | None, upstream_auth: str | None
                    ) -> dict[str, bytes]:
    """`headers`: the client's request's; `session`: its routing key (reading.Routed); `deadline`:
    monotonic; `upstream_auth`: the router's own Authorization for the nodes, if it has one."""
    # Values as bytes: a header is passed on byte for byte, whatever it holds (Starlette decoded
    # latin-1).
    h = {"Content-Type": b"application/json"}
    for name in ("x-session-id", "x-completion-kind"):
        if name in headers:
            h[name] = headers[name].encode("latin-1")
    if session and "x-session-id" not in headers and session.isascii() and session.isprintable():
        # the node keys the session as we did (its bearer may be ours)
        h["x-session-id"] = session.encode()
    if deadline is not None:
        h["X-Deadline-Ms"] = f"{max(1.0, (deadline - time.monotonic()) * 1000):.0f}".encode()
    client = authorization(headers)
    if upstream_auth:
        h["Authorization"] = upstream_auth.encode("latin-1")
        h[TENANT_HEADER] = tenant_of(client).encode()
    elif client:
        h["Authorization"] = client.encode("latin-1")
    return h
