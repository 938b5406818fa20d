"""How long the router waits on a node. Every wait of one attempt (for the answer's head, its first
event, the whole body, the next event) is bounded twice: by the request's deadline (past it the
client gets silence) and by a bound of its own (a node that is hung, frozen or cut off without a
reset sends nothing, and would hold the request forever). The wait is also cut short at once when
the node leaves the ring."""

from __future__ import annotations

from contextlib import asynccontextmanager

import anyio


class Stalled(Exception):
    """The node sent nothing within the bound, or left the ring."""


class Watch:
    """One attempt's waits on one node (node.watches holds the attempts in flight there)."""

    def __init__(self, node):
        self.node, self.left = node, not node.healthy
        self._scope: anyio.CancelScope | None = None
        node.watches.add(self)

    def close(self) -> None:
        self.node.watches.discard(self)

    def node_left(self) -> None:
        """Called when the node leaves the ring: the wait in progress ends now."""
        self.left = True
        if self._scope is not None:
            self._scope.cancel()

    @asynccontextmanager
    async def until(self, deadline: float | None, bound: float, what: str):
        """A wait, up to the monotonic `deadline` (then TimeoutError) and `bound` (then Stalled,
        naming `what` did not come in time)."""
        if self.left:
            raise Stalled("the node left the ring")
        # an anyio scope, not asyncio.timeout: a wait that ends as httpx closes the connection
        # lets the close finish (api/asgi.Cancellable)
        with anyio.CancelScope(deadline=bound if deadline is None else min(deadline, bound)) \
                as scope:
            self._scope = scope
            try:
                yield
            finally:
                self._scope = None
        if not scope.cancelled_caught:
            return
        if self.left:
            raise Stalled("the node left the ring")
        if deadline is not None and deadline <= bound:
            raise TimeoutError
        raise Stalled(f"{what} did not come in time")
