"""`EditorClient`: the editor plugin over real HTTP. An `EditorSession` (editor.py) decides; this
drives it with asyncio: a task per debounce that sleeps until the session's timer is due, then
streams what it says to send; a keystroke cancels that task (a debounce not yet due, or the stream:
closing it makes the server abort). The session's first-token deadline is enforced by
`stream_completion`'s own timer."""

from __future__ import annotations

import asyncio

import httpx

from warmpath.client.completion import RequestRecord, Target, stream_completion
from warmpath.client.editor import EditorSession
from warmpath.config import ClientConfig


class EditorClient:
    """One developer's plugin. Call keystroke() at each key with the document around the new
    cursor."""

    def __init__(self, http: httpx.AsyncClient, target: Target, session: str, config: ClientConfig,
                 records: list[RequestRecord], clock):
        self.http, self.target, self.session, self.config = http, target, session, config
        self.records, self.clock = records, clock
        self.editor = EditorSession(session, config)
        self._pending: asyncio.Task | None = None

    @property
    def keystrokes(self) -> int:
        return self.editor.keystrokes

    @property
    def requests_sent(self) -> int:
        return self.editor.requests_sent

    def keystroke(self, prefix: str, suffix: str = "", expected: str | None = None) -> None:
        # a Cancel is the task's cancel below
        self.editor.keystroke(self.clock(), prefix, suffix, expected)
        if self._pending is not None and not self._pending.done():
            # streaming: closes the stream, the server aborts; else a debounce not yet due
            self._pending.cancel()
        self._pending = asyncio.create_task(self._debounced(self.editor.due))

    async def _debounced(self, due: float) -> None:
        await asyncio.sleep(max(0.0, due - self.clock()))
        send = self.editor.timer(due)
        if send is None:
            return
        rec = RequestRecord(self.session, "editor", self.clock(),
                            prompt_chars=len(send.body["prompt"]), expected=send.expected)
        self.records.append(rec)
        await stream_completion(self.http, self.target, send.body, rec, self.clock,
                                first_token_deadline_s=send.first_token_deadline_s,
                                total_deadline_s=send.total_deadline_s, session=self.session)
        self.editor.done(self.clock())

    @property
    def pending(self) -> asyncio.Task | None:
        """The debounce or request in progress, if any."""
        return self._pending if self._pending is not None and not self._pending.done() else None

    async def idle(self) -> None:
        """Wait for the pending request (if any) to end."""
        if self._pending is not None:
            await asyncio.gather(self._pending, return_exceptions=True)

    async def close(self) -> None:
        if self._pending is not None and not self._pending.done():
            self._pending.cancel()
        await self.idle()
