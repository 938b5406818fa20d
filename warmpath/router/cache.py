"""Exact-match response cache for deterministic requests (temperature 0): the same model, prompt,
suffix and sampling parameters give the same answer, so a repeat is served without touching a node.
Bounded in entries, bytes and age; least recently used dropped first. Only complete answers are
stored (finish_reason stop or length), never silence, errors or a stream cut short.

Entries belong to a tenant and a model tier: the key includes a hash of the client's Authorization
credential (the credential itself is never stored), the body's `cache_salt` and the tier the request
went to (the same body goes to another model there). An entry is only ever stored after a node
answered 200 to that credential for that request, so a hit is served only to a credential a node has
already accepted for it: a missing, wrong or other key misses the cache and goes to a node, which
answers 401 as it would without the router. A key revoked on the nodes keeps its entries until they
age out (`cache_ttl`)."""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from dataclasses import dataclass

# Fields that do not change the answer: who asked.
_IGNORED = {"user"}


@dataclass
class CachedResponse:
    body: bytes
    media_type: str
    stored: float


def cache_key(path: str, body: dict, credential: bytes = b"",
              model_tier: str = "default") -> str | None:
    """None when the request is not deterministic (sampling) and must not be cached. `credential`:
    the client's Authorization header as sent (its hash is part of the key; `cache_salt` is in the
    body); `model_tier`: the model tier that answers it."""
    temperature = body.get("temperature", 1.0)  # the API's default samples
    if not isinstance(temperature, (int, float)) or temperature != 0:
        return None
    # ASCII escapes: any string JSON can carry (lone surrogates included) has a key.
    canonical = json.dumps({k: v
                            for k, v in body.items() if k not in _IGNORED}, sort_keys=True,
                           ensure_ascii=True)
    tenant = hashlib.sha256(b"credential\0" + credential).hexdigest()
    return hashlib.sha256(f"{tenant}\n{model_tier}\n{path}\n{canonical}".encode()).hexdigest()


class ResponseCache:
    def __init__(self, max_entries: int = 1024, max_bytes: int = 64 << 20, ttl_s: float = 300.0):
        self.max_entries, self.max_bytes, self.ttl_s = max_entries, max_bytes, ttl_s
        self.entries: OrderedDict[str, CachedResponse] = OrderedDict()
        self.bytes = 0

    def get(self, key: str) -> CachedResponse | None:
        entry = self.entries.get(key)
        if entry is None:
            return None
        if time.monotonic() - entry.stored > self.ttl_s:
            self._drop(key)
            return None
        self.entries.move_to_end(key)
        return entry

    def put(self, key: str, body: bytes, media_type: str) -> None:
        if self.max_entries <= 0 or len(body) > self.max_bytes:
            return
        if key in self.entries:
            self._drop(key)
        self.entries[key] = CachedResponse(body, media_type, time.monotonic())
        self.bytes += len(body)
        while len(self.entries) > self.max_entries or self.bytes > self.max_bytes:
            self._drop(next(iter(self.entries)))

    def _drop(self, key: str) -> None:
        self.bytes -= len(self.entries.pop(key).body)


def complete_answer(body: bytes, streamed: bool) -> bool:
    """Did the node give a whole answer (finish_reason stop/length, and for a stream a final
    [DONE])?"""
    try:
        if not streamed:
            choices = json.loads(body).get("choices") or []
            return bool(choices) and choices[0].get("finish_reason") in ("stop", "length")
        events = [e[5:].strip() for e in body.decode().split("\n\n") if e.startswith("data:")]
        if not events or events[-1] != "[DONE]":
            return False
        finish = None
        for e in events[:-1]:
            payload = json.loads(e)
            if "error" in payload:
                return False
            for c in payload.get("choices") or []:
                finish = c.get("finish_reason") or finish
        return finish in ("stop", "length")
    except (ValueError, UnicodeDecodeError, AttributeError):
        return False
