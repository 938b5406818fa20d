"""One request's send to a node, as a task the router can give up on safely.

httpcore leaves a connection whose send is cancelled between its TCP connect and the start of its
request open and unusable in the pool for good (encode/httpcore#1093): never reused, never reaped,
in CLOSE-WAIT once the node's header timeout closes it. A request past its deadline or whose client
hung up is given up at any moment, so in a flood of them such connections pile up. A send is
therefore cancelled only once its request is being written (from there httpcore closes the
connection, and the node aborts the request); given up before that, it finishes alone and its answer
is closed as soon as it comes.
"""

from __future__ import annotations

import asyncio

import httpx

from warmpath.api.asgi import Cancellable

# httpcore's trace event: the connection is the request's
WRITING = "http11.send_request_headers.started"


class Send:

    def __init__(self, http: httpx.AsyncClient, request: httpx.Request,
                 unfinished: set[asyncio.Task]):
        self.writing = False
        # holds the tasks given up until they end (the loop keeps none)
        self.unfinished = unfinished
        request.extensions["trace"] = self._trace
        self._running = Cancellable(http.send(request, stream=True))
        self.task = self._running.task

    async def _trace(self, event: str, info: dict) -> None:
        if event == WRITING:
            self.writing = True

    def give_up(self) -> None:
        """Stop the send now if that is safe, else when its answer comes (closed unread)."""
        if self.writing:
            self._running.cancel()
        self.unfinished.add(self.task)
        self.task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task) -> None:
        self.unfinished.discard(task)
        if not task.cancelled() and task.exception() is None:
            closing = asyncio.ensure_future(task.result().aclose())
            self.unfinished.add(closing)
            closing.add_done_callback(self.unfinished.discard)
