"""One streamed completion over the OpenAI-compatible API, timed: SSE parsing, the client-side
deadline, and a cancel that closes the stream (so the server aborts the request instead of finishing
it for nobody)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx

from warmpath.client.outcome import CANCELLED, COMPLETED, CUT, DROPPED, ERROR, SHOWN, outcome

__all__ = [
    "CANCELLED", "COMPLETED", "DROPPED", "ERROR", "SHOWN", "RequestRecord", "Target",
    "discover_model", "monotonic_clock", "sse_events", "stream_completion"
]


# /v1/completions; llama.cpp's /infill (what llama.vim / llama.vscode send); Mistral's
# /v1/fim/completions (SSE); Ollama's /api/generate (NDJSON); Tabby's completions (one JSON answer:
# its first token is the whole answer)
PROTOCOLS = ("openai", "infill", "mistral", "ollama", "tabby")


@dataclass
class Target:
    url: str  # base URL, e.g. http://127.0.0.1:8000 (with or without /v1)
    model: str | None = None
    api_key: str | None = None
    protocol: str = "openai"

    @property
    def api(self) -> str:
        base = self.url.rstrip("/")
        return base if base.endswith("/v1") else base + "/v1"

    @property
    def root(self) -> str:
        return self.api.removesuffix("/v1")

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass
class RequestRecord:
    session: str
    kind: str  # editor | agent
    sent: float  # seconds on the replay clock
    prompt_chars: int = 0
    first_token: float | None = None
    done: float | None = None
    outcome: str = ""
    # completion tokens received (usage when the server sends it, else content chunks)
    tokens: int = 0
    chunk_times: list[float] = field(default_factory=list)
    text: str = ""
    expected: str | None = None  # editor: the real next line
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    node: str | None = None  # the node that answered, when a router says so (X-Warmpath-Node)

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.sent


async def sse_events(response: httpx.Response) -> AsyncIterator[dict]:
    """The JSON payloads of a `text/event-stream` response, until `data: [DONE]`."""
    data: list[str] = []
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif line == "" and data:
            payload = "\n".join(data)
            data = []
            if payload == "[DONE]":
                return
            yield json.loads(payload)
    if data and data != ["[DONE]"]:
        yield json.loads("\n".join(data))


def _as_infill(body: dict) -> dict:
    """An OpenAI completions body as llama.cpp's /infill takes it (the fields llama.vim sends)."""
    out = {
        "input_prefix": body["prompt"], "input_suffix": body.get("suffix") or "",
        "n_predict": body["max_tokens"], "temperature": body.get("temperature", 0), "stream": True,
        "cache_prompt": True, "samplers": ["top_k"]
    }
    if body.get("stop"):
        out["stop"] = body["stop"]
    if body.get("scope"):
        out["scope"] = body["scope"]  # warmpath's field, as on /v1/completions
    return out


def _request(target: Target, body: dict) -> tuple[str, dict]:
    """Where and what to POST for an OpenAI completions body in the target's protocol."""
    p, prompt, suffix = target.protocol, body["prompt"], body.get("suffix") or ""
    if p == "infill":
        return target.root + "/infill", _as_infill(body)
    if p == "mistral":
        out = {k: body[k] for k in ("model", "stop", "scope") if body.get(k)}
        return target.api + "/fim/completions", {
            **out, "prompt": prompt, "suffix": suffix, "stream": True,
            "max_tokens": body["max_tokens"], "temperature": body.get("temperature", 0)
        }
    if p == "ollama":
        options = {"num_predict": body["max_tokens"], "temperature": body.get("temperature", 0)}
        if body.get("stop"):
            options["stop"] = body["stop"]
        return target.root + "/api/generate", {
            "model": body.get("model"), "prompt": prompt, "suffix": suffix, "stream": True,
            "options": options
        }
    if p == "tabby":
        return target.api + "/completions", {
            "language": "python", "segments": {"prefix": prompt, "suffix": suffix},
            "temperature": body.get("temperature", 0)
        }
    return target.api + "/completions", body


async def _events(resp: httpx.Response, protocol: str) -> AsyncIterator[dict]:
    if protocol == "tabby":
        yield json.loads(await resp.aread())
    elif protocol == "ollama":
        async for line in resp.aiter_lines():
            if line.strip():
                yield json.loads(line)
    else:
        async for event in sse_events(resp):
            yield event


def _choices(event: dict, rec: RequestRecord, protocol: str) -> list[dict]:
    """An event of the protocol as the choices of an OpenAI chunk; its counts into rec."""
    if protocol == "infill":
        return _infill_choices(event, rec)
    if protocol == "ollama":
        rec.prompt_tokens = event.get("prompt_eval_count", rec.prompt_tokens)
        if event.get("done"):
            rec.tokens = event.get("eval_count", rec.tokens)
            return [{
                "text": event.get("response") or "", "finish_reason": event.get("done_reason") or
                "stop"
            }]
        return [{"text": event.get("response") or ""}]
    return event.get("choices") or []


def _infill_choices(event: dict, rec: RequestRecord) -> list[dict]:
    """An /infill event as the choices of an OpenAI chunk; its counts into rec."""
    rec.prompt_tokens = event.get("tokens_evaluated", rec.prompt_tokens)
    rec.cached_tokens = event.get("tokens_cached", rec.cached_tokens)
    if event.get("stop"):
        rec.tokens = event.get("tokens_predicted", rec.tokens)
        return [{
            "text": event.get("content") or "", "finish_reason": event.get("finish_reason") or
            "stop"
        }]
    return [{"text": event.get("content") or ""}]


def _delta_text(choice: dict) -> str:
    if "text" in choice:
        return choice["text"] or ""
    return (choice.get("delta") or {}).get("content") or ""


async def stream_completion(http: httpx.AsyncClient, target: Target, body: dict, rec: RequestRecord,
                            clock, first_token_deadline_s: float | None = None,
                            total_deadline_s: float | None = None,
                            session: str | None = None) -> RequestRecord:
    """POST /v1/completions with stream=true, filling `rec`. Past `first_token_deadline_s` without a
    token, or `total_deadline_s` overall, the stream is closed; if the calling task is cancelled (a
    newer keystroke), the stream is closed and CancelledError propagates. rec.outcome: the rule of
    warmpath.client.outcome."""
    headers = target.headers()
    if session:
        headers["X-Session-Id"] = session
    if total_deadline_s is not None:
        # the server stops working on it too
        headers["X-Deadline-Ms"] = f"{total_deadline_s * 1000:.0f}"
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    if target.model:
        body.setdefault("model", target.model)
    path, body = _request(target, body)
    loop = asyncio.get_running_loop()
    start = loop.time()
    first = first_token_deadline_s if first_token_deadline_s is not None else total_deadline_s
    chunks = 0

    def end(cancelled_at: float | None = None) -> None:
        if rec.error is None:
            rec.tokens = rec.tokens or chunks  # usage when the server sent it
        rec.outcome = outcome(rec.kind, rec.first_token, cancelled_at=cancelled_at,
                              finish_reason=rec.finish_reason, error=rec.error)

    try:
        async with asyncio.timeout_at(None if first is None else start + first) as timer:
            async with http.stream("POST", path, json=body, headers=headers) as resp:
                rec.node = resp.headers.get("x-warmpath-node")
                if resp.status_code != 200:
                    await resp.aread()
                    rec.error = f"HTTP {resp.status_code}: {resp.text[:300]}"
                    rec.done = clock()
                    end()
                    return rec
                async for event in _events(resp, target.protocol):
                    if "error" in event:
                        rec.error = json.dumps(event["error"])[:300]
                        cut = isinstance(event["error"], dict) and event["error"].get("code") == CUT
                        if rec.kind == "editor" and cut:
                            rec.finish_reason = CUT  # its node died mid-stream
                        rec.done = clock()
                        end()
                        return rec
                    usage = event.get("usage")
                    if usage:
                        rec.tokens = usage.get("completion_tokens", rec.tokens)
                        rec.prompt_tokens = usage.get("prompt_tokens")
                        rec.cached_tokens = (usage.get("prompt_tokens_details") or
                                             {}).get("cached_tokens")
                    for choice in _choices(event, rec, target.protocol):
                        text = _delta_text(choice)
                        if text:
                            now = clock()
                            if rec.first_token is None:
                                rec.first_token = now
                                total = (None if total_deadline_s is None else
                                         start + total_deadline_s)
                                timer.reschedule(total)
                            rec.chunk_times.append(now)
                            rec.text += text
                            chunks += 1
                        if choice.get("finish_reason"):
                            rec.finish_reason = choice["finish_reason"]
        rec.done = clock()
        end()  # no first token: silence (the server's own deadline, or an empty answer)
    except TimeoutError:  # the first-token deadline, or the whole answer's
        rec.finish_reason = rec.finish_reason or "client_deadline"
        end()
    except asyncio.CancelledError:
        rec.finish_reason = rec.finish_reason or "client_cancel"
        end(cancelled_at=clock())
        raise
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as e:
        rec.error = f"{type(e).__name__}: {e}"[:300]
        rec.done = clock()
        end()
    return rec


async def discover_model(http: httpx.AsyncClient, target: Target) -> str | None:
    """The first model the server lists (llama.cpp's and vLLM's servers want a model name)."""
    try:
        r = await http.get(target.api + "/models", headers=target.headers())
        r.raise_for_status()
        data = r.json().get("data") or []
        return data[0]["id"] if data else None
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def monotonic_clock(origin: float | None = None):
    t0 = time.monotonic() if origin is None else origin
    return lambda: time.monotonic() - t0
