"""An editor plugin's completion behaviour: debounce keystrokes, cancel the stale request the moment the developer
types again (closing its stream so the server aborts it), and drop a suggestion whose first token is later than
the deadline, silently. A late suggestion is worth nothing under a moving cursor; retrying would be worse."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx

from warmpath.client.completion import RequestRecord, Target, stream_completion


@dataclass
class ClientConfig:
    debounce_ms: float = 75.0  # keystrokes closer than this send no request
    deadline_ms: float = 300.0  # first token later than this: the suggestion is dropped
    max_time_ms: float = 3000.0  # the whole suggestion; forwarded as X-Deadline-Ms so the server stops too
    max_tokens: int = 16
    temperature: float = 0.0
    fim: bool = True  # send the text after the cursor as `suffix`


class EditorClient:
    """One developer's plugin. Call keystroke() at each key with the document around the new cursor."""

    def __init__(self, http: httpx.AsyncClient, target: Target, session: str, config: ClientConfig,
                 records: list[RequestRecord], clock):
        self.http, self.target, self.session, self.config = http, target, session, config
        self.records, self.clock = records, clock
        self._pending: asyncio.Task | None = None
        self.keystrokes = 0
        self.requests_sent = 0

    def keystroke(self, prefix: str, suffix: str = "", expected: str | None = None) -> None:
        self.keystrokes += 1
        if self._pending is not None and not self._pending.done():
            self._pending.cancel()  # debouncing: no request; in flight: closes the stream, the server aborts
        self._pending = asyncio.create_task(self._debounced(prefix, suffix, expected))

    async def _debounced(self, prefix: str, suffix: str, expected: str | None) -> None:
        cfg = self.config
        await asyncio.sleep(cfg.debounce_ms / 1000)
        body = {"prompt": prefix, "max_tokens": cfg.max_tokens, "temperature": cfg.temperature,
                "user": self.session}
        if cfg.fim and suffix:
            body["suffix"] = suffix
        rec = RequestRecord(self.session, "editor", self.clock(), prompt_chars=len(prefix), expected=expected)
        self.records.append(rec)
        self.requests_sent += 1
        await stream_completion(self.http, self.target, body, rec, self.clock,
                                first_token_deadline_s=cfg.deadline_ms / 1000,
                                total_deadline_s=cfg.max_time_ms / 1000, session=self.session)

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
