"""Async completion client that behaves like an editor plugin (debounce, cancel on keystroke, client deadline,
SSE), used by `warmpath bench` and `warmpath complete`."""

from warmpath.client.completion import (
    CANCELLED,
    COMPLETED,
    DROPPED,
    ERROR,
    SHOWN,
    RequestRecord,
    Target,
    discover_model,
    sse_events,
    stream_completion,
)
from warmpath.client.editor import ClientConfig, EditorClient

__all__ = ["CANCELLED", "COMPLETED", "DROPPED", "ERROR", "SHOWN", "ClientConfig", "EditorClient", "RequestRecord",
           "Target", "discover_model", "sse_events", "stream_completion"]
