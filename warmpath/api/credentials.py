"""Who a request is, shared by the server and the router: the one reader of its credential (the
Authorization header), the API keys a file lists, and the tenant a credential stands for.

Every reader of a credential goes through `header()`, which refuses a header sent twice (400): the
guard, the session key, the cache salt and the router's cache would otherwise each pick their own
copy.

A tenant is a hash of a credential, never the credential itself. A router that authenticates to its
nodes with its own key names its client's tenant in `X-Warmpath-Tenant`; a node hashes that name
under the caller's own tenant (`tenant()`), so a caller can split its tenant but never enter
another's: a client that sends the header itself, to a node or through a router (which never
forwards it), stays inside its own key's tenant.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

from warmpath.api.protocol import ApiError

TENANT_HEADER = "X-Warmpath-Tenant"
# A comment starts at `#` at a line's start or after whitespace: a `#` inside a key is part of it.
_COMMENT = re.compile(r"(?:^|\s)#")


def header(headers, name: str) -> str | None:
    """The value of header `name` (Starlette's Headers, an ASGI scope's raw pairs or a plain
    mapping), None without it; ApiError (400) when it comes more than once."""
    if not hasattr(headers, "raw") and isinstance(headers, Mapping):  # a dict cannot hold two
        return headers.get(name.lower(), headers.get(name))
    wanted = name.lower().encode("latin-1")
    raw = headers.raw if hasattr(headers, "raw") else headers
    values = [v for k, v in raw if k.lower() == wanted]
    if len(values) > 1:
        raise ApiError(400, f"the {name} header was sent {len(values)} times; send it once",
                       param=name, code=f"duplicate_{name.lower().replace('-', '_')}")
    return values[0].decode("latin-1") if values else None


def authorization(headers) -> str:
    """The request's one Authorization header as sent, "" without one."""
    return header(headers, "Authorization") or ""


def tenant_of(credential: str) -> str:
    """The tenant a credential (an Authorization header's value) stands for."""
    return hashlib.sha256(b"warmpath tenant\0" +
                          credential.encode("latin-1", "replace")).hexdigest()


def tenant(headers) -> str:
    """A request's tenant on a node: its credential's, refined by the tenant its caller names (a
    router's client). The name is hashed under the caller's own tenant: naming never reaches another
    credential's tenant."""
    own = tenant_of(authorization(headers))
    named = header(headers, TENANT_HEADER)
    if named is None:
        return own
    return hashlib.sha256(f"{own}\0{named}".encode("latin-1", "replace")).hexdigest()


def parse_keys(text: str) -> list[str]:
    """The keys of an API keys file: one per line, blank lines and comments skipped (`_COMMENT`)."""
    keys = (_COMMENT.split(line, maxsplit=1)[0].strip() for line in text.splitlines())
    return [k for k in keys if k]


def accepted_keys(config) -> list[str]:
    """The API keys a request may carry: `api_key`, plus those of `api_keys_file`."""
    keys = [config.api_key] if config.api_key else []
    if config.api_keys_file:
        with open(config.api_keys_file) as f:
            keys += parse_keys(f.read())
    return keys
