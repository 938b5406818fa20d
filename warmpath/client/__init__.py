"""Async completion client that behaves like an editor plugin (debounce, cancel on keystroke, client
deadline, SSE), used by `warmpath bench` and `warmpath complete`; the plugin's rules (editor.py,
outcome.py) are the simulator's too."""

from warmpath.client.completion import (
    RequestRecord,
    Target,
    discover_model,
    sse_events,
    stream_completion,
)
from warmpath.client.editor import Cancel, EditorSession, Send
from warmpath.client.editor_http import EditorClient
from warmpath.client.outcome import CANCELLED, COMPLETED, DROPPED, ERROR, SHOWN, outcome
from warmpath.config import ClientConfig

__all__ = [
    "CANCELLED", "COMPLETED", "DROPPED", "ERROR", "SHOWN", "Cancel", "ClientConfig", "EditorClient",
    "EditorSession", "RequestRecord", "Send", "Target", "discover_model", "outcome", "sse_events",
    "stream_completion"
]
