"""An editor plugin's completion behaviour, as a state machine with no clock of its own: debounce
keystrokes, cancel the stale request the moment the developer types again (closing its stream so the
server aborts it), and drop a suggestion whose first token is later than the deadline, silently. A
late suggestion is worth nothing under a moving cursor; retrying would be worse.

It is told each event and its time and answers what to do. `EditorClient` (editor_http.py) drives it
with asyncio over real HTTP, the simulator's `Driver` on virtual time; one `EditorSession` per
developer:

    keystroke(t, ...)   -> Cancel (the request in flight is stale) or None;
                           the debounce timer is (re)armed for `due`
    timer(t)            -> Send, when the timer armed for t fires with nothing typed since;
                           else None
    first_token(t)      the request in flight got its first token at t
    deadline(t)         -> Cancel when t is the request's first-token deadline
                           and no token came by then
    done(t)             the request in flight ended
                        (finished, failed, or dropped by the client's own timer)
"""

from __future__ import annotations

from dataclasses import dataclass

from warmpath.config import ClientConfig

__all__ = ["Cancel", "ClientConfig", "EditorSession", "Send"]


@dataclass(frozen=True)
class Send:
    """Send this request now."""

    body: dict  # the /v1/completions fields: prompt, max_tokens, temperature, user (+ suffix)
    at: float
    deadline: float  # its first token must come by then, or the stream is closed and it is dropped
    max_time: float  # the whole answer's end (sent as X-Deadline-Ms, so the server stops too)
    expected: str | None = None  # the real next line, for the quality proxy

    @property
    def first_token_deadline_s(self) -> float:
        return self.deadline - self.at

    @property
    def total_deadline_s(self) -> float:
        return self.max_time - self.at


@dataclass(frozen=True)
class Cancel:
    """Close the stream of the request in flight now (the server aborts it)."""

    reason: str  # "client_cancel": a newer keystroke | "client_deadline": no first token in time


class EditorSession:
    """One developer's plugin: at most one debounce armed and one request in flight."""

    def __init__(self, session: str, config: ClientConfig | None = None):
        self.session, self.config = session, config or ClientConfig()
        self.due: float | None = None  # when the armed debounce timer fires (None: none armed)
        self.in_flight: Send | None = None
        self.keystrokes = 0
        self.requests_sent = 0
        self._document: tuple[str, str, str | None] = ("", "", None)
        self._first_token: float | None = None

    def keystroke(self, t: float, prefix: str, suffix: str = "",
                  expected: str | None = None) -> Cancel | None:
        """The document around the new cursor: `prefix` before it, `suffix` after it."""
        self.keystrokes += 1
        self.due = t + self.config.debounce_ms / 1000  # a debounce still armed sends nothing
        self._document = (prefix, suffix, expected)
        # shown or not, the suggestion is for a cursor that has moved
        return self._close("client_cancel")

    def timer(self, t: float) -> Send | None:
        if self.due is None or t < self.due:
            return None  # a timer of an earlier key: that key was typed over
        cfg, (prefix, suffix, expected) = self.config, self._document
        body = {
            "prompt": prefix, "max_tokens": cfg.max_tokens, "temperature": cfg.temperature,
            "user": self.session
        }
        if cfg.fim and suffix:
            body["suffix"] = suffix
        self.due = None
        self.in_flight = Send(body, t, t + cfg.deadline_ms / 1000, t + cfg.max_time_ms / 1000,
                              expected)
        self._first_token = None
        self.requests_sent += 1
        return self.in_flight

    def first_token(self, t: float) -> None:
        if self.in_flight is not None and self._first_token is None:
            self._first_token = t

    def deadline(self, t: float) -> Cancel | None:
        req = self.in_flight
        if req is None or t < req.deadline or (self._first_token is not None and
                                               self._first_token <= t):
            return None
        return self._close("client_deadline")

    def done(self, t: float) -> None:
        self.in_flight = None

    def _close(self, reason: str) -> Cancel | None:
        if self.in_flight is None:
            return None
        self.in_flight = None
        return Cancel(reason)
