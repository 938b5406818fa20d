"""Where each recent session's latest request went (the node where its prefix is warm), for
/admin/sessions."""

from __future__ import annotations

from collections import OrderedDict

SESSIONS_KEPT = 10_000


class SessionLog:
    """session -> {"node": where its latest request went, "requests": how many it sent}; bounded,
    the least recently seen session dropped first."""

    def __init__(self, kept: int = SESSIONS_KEPT):
        self.kept = kept
        self.entries: OrderedDict[str, dict] = OrderedDict()

    def note(self, session: str, node: str, new_request: bool) -> None:
        entry = self.entries.setdefault(session, {"node": node, "requests": 0})
        entry["node"] = node
        entry["requests"] += int(new_request)
        self.entries.move_to_end(session)
        if len(self.entries) > self.kept:
            self.entries.popitem(last=False)

    def view(self) -> dict[str, dict]:
        return dict(self.entries)
