"""The queue of warm-ups waiting for an idle step (_warm_ups.py), bounded in tokens per tenant and
in all.

Why bounded: every request refused at its deadline, late or left by its client leaves one, and a
client can send any number of them (a new session id each time), each up to a context of tokens, all
held until an idle step comes. Past a bound the oldest warm-ups go first (the tenant's own for its
bound): a developer's latest file is the one worth warming. One queued warm-up per session (the
scheduler ends a session's older one). A tenant is the request's `tenant` (its credential's,
server/tenancy.py, whatever the cache isolation: a new `cache_salt` is no new tenant); requests with
none (the offline API) are one tenant.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

from warmpath.engine.request import Request
from warmpath.engine.scheduler.batch import SchedulerStats


@dataclass
class WarmUps:
    """Queued warm-ups, oldest first; `add` keeps both bounds and returns the warm-ups it dropped
    (the scheduler finishes them: none holds blocks yet)."""

    tokens_per_tenant: int
    max_tokens: int
    stats: SchedulerStats  # its warm_ups_dropped_* counters
    tokens: int = 0  # prompt tokens held, all tenants
    # by request id, oldest first
    _queue: OrderedDict[str, Request] = field(default_factory=OrderedDict)
    _by_tenant: dict[str | None, OrderedDict[str, Request]] = field(default_factory=dict)
    _tenant_tokens: dict[str | None, int] = field(default_factory=dict)
    _by_session: dict[str | None, Request] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(list(self._queue.values()))

    def __contains__(self, req: object) -> bool:
        return isinstance(req, Request) and self._queue.get(req.request_id) is req

    def of_session(self, session_id: str | None) -> Request | None:
        return self._by_session.get(session_id)

    def tenant_tokens(self, tenant: str | None) -> int:
        return self._tenant_tokens.get(tenant, 0)

    def add(self, req: Request) -> list[Request]:
        tenant, n = req.tenant, req.num_tokens
        if n > self.tokens_per_tenant or n > self.max_tokens:  # alone over a bound: never queued
            self._count(n > self.tokens_per_tenant)
            return [req]
        dropped = []
        while self.tenant_tokens(tenant) + n > self.tokens_per_tenant:
            dropped.append(self.remove(next(iter(self._by_tenant[tenant].values()))))
            self._count(True)
        while self.tokens + n > self.max_tokens:
            dropped.append(self.remove(next(iter(self._queue.values()))))
            self._count(False)
        self._queue[req.request_id] = req
        self._by_tenant.setdefault(tenant, OrderedDict())[req.request_id] = req
        self._tenant_tokens[tenant] = self.tenant_tokens(tenant) + n
        self._by_session[req.session_id] = req
        self.tokens += n
        return dropped

    def remove(self, req: Request) -> Request:
        if self._queue.pop(req.request_id, None) is not req:
            raise ValueError(f"{req.request_id} is not a queued warm-up")
        tenant = req.tenant
        mine = self._by_tenant[tenant]
        del mine[req.request_id]
        self._tenant_tokens[tenant] -= req.num_tokens
        if not mine:
            del self._by_tenant[tenant], self._tenant_tokens[tenant]
        if self._by_session.get(req.session_id) is req:
            del self._by_session[req.session_id]
        self.tokens -= req.num_tokens
        return req

    def _count(self, tenant: bool) -> None:
        if tenant:
            self.stats.warm_ups_dropped_tenant += 1
        else:
            self.stats.warm_ups_dropped_total += 1
