"""What a request shares on a node, and with whom: its prefix-cache salt and the session its engine
request carries (speculation history, warm-ups, the quick-session rule), both scoped by its tenant.

The tenant is its credential's (api/credentials.py, a router's client's when the router names it),
with the body's `cache_salt`. Sessions are always kept per tenant: another key sending the same
X-Session-Id (or `user`) neither drafts from this session's history nor ends its warm-up. The prefix
cache is per tenant only with `cache_isolation` "key" (else per `cache_salt` alone: sharing is the
deployer's choice). The engine's bounds kept per tenant (queued warm-ups, engine/warmups.py) count
by the credential's tenant, whatever the isolation: a client cannot leave its bound by sending a new
`cache_salt`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from warmpath.api.asgi import session_key
from warmpath.api.credentials import tenant


@dataclass(frozen=True)
class Tenancy:
    # the prefix-cache salt (engine/block_pool.py): blocks are shared only within one
    salt: str | None
    session: str | None  # the engine's session id; None: the request belongs to no session
    # whose it is (api/credentials.tenant), for the engine's per-tenant bounds
    tenant: str | None = None
    session_hashed: bool = False  # the client's session id was over the cap (api/asgi.session_key)


def tenancy(headers, user: object, cache_salt: str | None, isolation: str,
            max_session_id_chars: int = 128) -> Tenancy:
    """`headers`: the request's; `user`: the protocol's user field (api/asgi.session_key);
    `isolation`: the server's cache_isolation ("none" or "key"); an id over `max_session_id_chars`
    is hashed first (counted)."""
    who = tenant(headers)
    scope = f"{who}\0{cache_salt or ''}"
    key, hashed = session_key(headers, user, max_session_id_chars)
    session = None
    if key is not None:  # hashed: bounded, and no tenant can name another's
        session = hashlib.sha256(f"{scope}\0{key}".encode("utf-8",
                                                          "surrogatepass")).hexdigest()[:32]
    return Tenancy(scope if isolation == "key" else cache_salt, session, who, hashed)
