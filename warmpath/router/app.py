"""`warmpath route`: one OpenAI-compatible endpoint in front of many nodes (warmpath or any OpenAI-compatible
server), sending each session back to the node where its prefix is warm.

Per request: parse just enough to route (session key, prompt text, tier), answer from the response cache if
the request is deterministic and seen before, otherwise pick nodes with the policy and stream the node's
answer through unbuffered (SSE relayed event by event). A node that fails before the first byte gets one
failover to the next candidate while the deadline allows; one that fails mid-stream ends the stream with an
error event (never a clean [DONE], never a replay). Past X-Deadline-Ms the router answers silence itself
and closes the upstream stream; the node is told the remaining budget. Bad input is the node's to judge, so
errors have exactly the node's shape; a client that goes away closes the upstream stream (the node aborts).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from warmpath.config import RouterConfig
from warmpath.router.cache import ResponseCache, cache_key, complete_answer
from warmpath.router.metrics import RouterMetrics
from warmpath.router.nodes import Node, NodeSet
from warmpath.router.policies import RouteKey, Router
from warmpath.router.tiering import LINE, completion_kind
from warmpath.server.guard import GuardMiddleware
from warmpath.server.protocol import error_body

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 2  # the chosen node, then one failover
SESSIONS_KEPT = 10_000  # /admin/sessions remembers this many recent sessions


def parse_nodes(config: RouterConfig) -> tuple[list[Node], list[str]]:
    """Nodes with their tier, and the tiers from smallest to largest model."""
    urls = list(config.node or [])
    if config.nodes_file:
        with open(config.nodes_file) as f:
            urls += [line.split("#")[0].strip() for line in f if line.split("#")[0].strip()]
    if config.tier and urls:
        raise ValueError("give either --node (one pool) or --tier NAME=URL,... (model tiers), not both")
    nodes, tiers = [], []
    if config.tier:
        for spec in config.tier:
            name, _, members = spec.partition("=")
            if not name or not members or name in tiers:
                raise ValueError(f"--tier wants NAME=URL[,URL...] with distinct names, got {spec!r}")
            tiers.append(name)
            nodes += [Node(_base(u), tier=name) for u in members.split(",") if u.strip()]
    else:
        tiers = ["default"]
        nodes = [Node(_base(u)) for u in urls]
    if not nodes:
        raise ValueError("no nodes: give --node URL (repeated), --nodes-file or --tier")
    if len({n.url for n in nodes}) != len(nodes):
        raise ValueError("a node is listed twice")
    return nodes, tiers


def _base(url: str) -> str:
    return url.strip().rstrip("/").removesuffix("/v1")


@dataclass
class Routed:
    """What the router learned from a request body."""

    body: dict | None
    session: str | None
    prompt: str
    kind: str  # "completion" | "chat"
    stream: bool


def read_request(path: str, raw: bytes, headers) -> Routed:
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = None
    b = body or {}
    session = headers.get("x-session-id") or (b.get("user") if isinstance(b.get("user"), str) else None)
    if path.endswith("/chat/completions"):
        kind = "chat"
        parts = []
        for m in b.get("messages") or []:
            if isinstance(m, dict):
                content = m.get("content")
                if isinstance(content, list):
                    content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
                parts.append(f"{m.get('role')}\x1f{content or ''}\x1e")
        prompt = "".join(parts)
    else:
        kind = "completion"
        prompt = b.get("prompt", "")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, list):
            prompt = ",".join(str(t) for t in prompt)
        prompt = prompt if isinstance(prompt, str) else ""
    return Routed(body, session, prompt, kind, b.get("stream") is True)


def _deadline(headers) -> tuple[float | None, bool]:
    """(monotonic deadline, header valid). An invalid header is forwarded as is: the node answers the 400."""
    raw = headers.get("x-deadline-ms")
    if raw is None:
        return None, True
    try:
        ms = float(raw)
    except ValueError:
        return None, False
    if not ms > 0 or ms == float("inf"):
        return None, False
    return time.monotonic() + ms / 1000, True


def _silence(kind: str, model: str | None, reason: str = "deadline") -> dict:
    choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": reason} if kind == "completion" else \
        {"index": 0, "message": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": reason}
    return {"id": f"route-{uuid.uuid4().hex}", "object": "text_completion" if kind == "completion" else
            "chat.completion", "created": int(time.time()), "model": model, "choices": [choice],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}


def _silence_chunk(kind: str, model: str | None, reason: str = "deadline") -> bytes:
    choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": reason} if kind == "completion" else \
        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}
    chunk = {"id": f"route-{uuid.uuid4().hex}", "object": "text_completion" if kind == "completion" else
             "chat.completion.chunk", "created": int(time.time()), "model": model, "choices": [choice]}
    return f"data: {json.dumps(chunk)}\n\n".encode() + b"data: [DONE]\n\n"


def _sse_error(message: str, code: str) -> bytes:
    return f"data: {json.dumps(error_body(message, 'server_error', code=code))}\n\n".encode()


async def _sse_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Whole SSE events (`...\\n\\n`) from raw chunks, so the router can end a stream cleanly between two."""
    buf = b""
    async for chunk in chunks:
        buf += chunk.replace(b"\r\n", b"\n")
        *events, buf = buf.split(b"\n\n")
        for e in events:
            yield e + b"\n\n"
    if buf.strip():
        yield buf


class _ClientGone(Exception):
    """The client disconnected while the router waited on the node."""


class _Failed(Exception):
    """The node failed before the first byte reached the client: fail over."""


def create_router_app(config: RouterConfig) -> FastAPI:
    nodes_list, tiers = parse_nodes(config)
    routers = {t: Router([n.url for n in nodes_list if n.tier == t], config.policy, config.load_factor,
                         config.virtual_nodes, config.prefix_block_chars, config.prefix_index_blocks)
               for t in tiers}
    cache = ResponseCache(config.cache_entries, ttl_s=config.cache_ttl)
    # session -> {"node": where its latest request went, "requests": how many it sent} (bounded, LRU)
    sessions: OrderedDict[str, dict] = OrderedDict()

    def note_session(session: str, node: str, new_request: bool) -> None:
        entry = sessions.setdefault(session, {"node": node, "requests": 0})
        entry["node"] = node
        entry["requests"] += int(new_request)
        sessions.move_to_end(session)
        if len(sessions) > SESSIONS_KEPT:
            sessions.popitem(last=False)

    def forget(node: Node) -> None:  # a node that left may come back empty: its index is stale
        routers[node.tier].forget(node.url)

    upstream_headers = {"Authorization": f"Bearer {config.upstream_api_key}"} if config.upstream_api_key else {}
    http = httpx.AsyncClient(timeout=httpx.Timeout(connect=config.connect_timeout, read=None, write=30.0, pool=None),
                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))
    nodes = NodeSet(nodes_list, http, config.health_interval, config.health_failures, upstream_headers,
                    on_unhealthy=forget)
    metrics = RouterMetrics(nodes)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await nodes.check_all()
        nodes.start()
        yield
        await nodes.stop()
        await http.aclose()

    app = FastAPI(title="warmpath router", lifespan=lifespan)
    app.state.nodes, app.state.routers, app.state.cache, app.state.metrics = nodes, routers, cache, metrics
    app.add_middleware(GuardMiddleware, config=config, open_paths=("/health", "/admin"))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, e: Exception):
        log.exception("unhandled error")
        return JSONResponse(error_body(f"internal error: {type(e).__name__}", "server_error"), status_code=500)

    # -- fleet state ------------------------------------------------------------------------------------------
    def node_view(n: Node) -> dict:
        return {"url": n.url, "tier": n.tier, "healthy": n.healthy, "draining": n.draining,
                "in_flight": n.in_flight, "models": n.models}

    @app.get("/health")
    async def health():
        ok = all(nodes.available(t) for t in tiers)
        body = {"status": "ok" if ok else "unavailable", "nodes": [node_view(n) for n in nodes.nodes.values()]}
        return JSONResponse(body, status_code=200 if ok else 503)

    def model_names() -> list[str]:
        names = [config.served_model_name] if config.served_model_name else []
        for n in nodes.nodes.values():
            names += [m for m in n.models if m not in names]
        return names

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "warmpath"}
                                           for m in model_names()]}

    @app.get("/metrics")
    async def prometheus():
        await nodes.scrape()
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    # -- admin ------------------------------------------------------------------------------------------------
    def admin_denied(request: Request) -> JSONResponse | None:
        if not config.admin_key:
            return JSONResponse(error_body("admin routes are off: start the router with --admin-key",
                                           "permission_error", code="admin_disabled"), status_code=403)
        auth = request.headers.get("authorization", "")
        if not hmac.compare_digest(auth.encode(), f"Bearer {config.admin_key}".encode()):
            return JSONResponse(error_body("missing or wrong admin key", "authentication_error",
                                           code="invalid_admin_key"), status_code=401)
        return None

    @app.get("/admin/sessions")
    async def list_sessions(request: Request):
        """Where each recent session's latest request went (where its prefix is warm)."""
        if denied := admin_denied(request):
            return denied
        return {"sessions": dict(sessions)}

    @app.get("/admin/nodes")
    async def list_nodes(request: Request):
        if denied := admin_denied(request):
            return denied
        return {"nodes": [node_view(n) for n in nodes.nodes.values()]}

    async def set_draining(request: Request, draining: bool):
        if denied := admin_denied(request):
            return denied
        try:
            url = _base(str((await request.json())["node"]))
        except (ValueError, KeyError, TypeError):
            return JSONResponse(error_body('body must be {"node": URL}', param="node"), status_code=400)
        node = nodes.nodes.get(url)
        if node is None:
            return JSONResponse(error_body(f"no node {url!r}", param="node", code="node_not_found"), status_code=404)
        node.draining = draining
        log.info("node %s %s", url, "draining" if draining else "takes new requests again")
        return node_view(node)

    @app.post("/admin/nodes/drain")
    async def drain(request: Request):
        return await set_draining(request, True)

    @app.post("/admin/nodes/undrain")
    async def undrain(request: Request):
        return await set_draining(request, False)

    # -- proxy ------------------------------------------------------------------------------------------------
    def forward_headers(request: Request, deadline: float | None, deadline_ok: bool) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        for name in ("x-session-id", "x-completion-kind"):
            if name in request.headers:
                h[name] = request.headers[name]
        if not deadline_ok:
            h["X-Deadline-Ms"] = request.headers["x-deadline-ms"]  # the node answers the 400
        elif deadline is not None:
            h["X-Deadline-Ms"] = f"{max(1.0, (deadline - time.monotonic()) * 1000):.0f}"
        auth = upstream_headers.get("Authorization") or request.headers.get("authorization")
        if auth:
            h["Authorization"] = auth
        return h

    async def proxy(request: Request, path: str):
        raw = await request.body()
        deadline, deadline_ok = _deadline(request.headers)
        routed = read_request(path, raw, request.headers)
        tier = tiers[0]
        if len(tiers) > 1:
            kind = completion_kind(path, routed.body or {}, request.headers.get("x-completion-kind"),
                                   config.line_max_tokens)
            tier = tiers[0] if kind == LINE else tiers[-1]
            metrics.tiers.labels(tier, kind).inc()
        model = (routed.body or {}).get("model")
        key = cache_key(path, routed.body) if routed.body is not None and config.cache_entries > 0 else None
        if key is not None:
            hit = cache.get(key)
            metrics.cache.labels("hit" if hit else "miss").inc()
            if hit:
                return Response(hit.body, media_type=hit.media_type, headers={"X-Warmpath-Cache": "hit"})
        decision = routers[tier].choose(RouteKey(routed.session, routed.prompt), nodes.available(tier),
                                        nodes.loads())
        metrics.decisions.labels(config.policy, decision.decision).inc()
        if routed.session and decision.nodes:
            note_session(routed.session, decision.nodes[0], True)
        if not decision.nodes:
            metrics.degraded.labels("no_node").inc()
            return JSONResponse(error_body(f"no healthy node{'' if len(tiers) == 1 else ' in tier ' + tier}",
                                           "server_error", code="no_healthy_node"), status_code=503)
        for attempt, url in enumerate(decision.nodes[:MAX_ATTEMPTS]):
            if deadline is not None and time.monotonic() >= deadline:
                break
            node = nodes.nodes[url]
            payload = raw
            if len(tiers) > 1 and routed.body is not None and node.models and \
                    (model is None or model in model_names()):
                payload = json.dumps({**routed.body, "model": node.models[0]}).encode()  # the tier's own model
            if routed.session and attempt:
                note_session(routed.session, url, False)  # failed over: the prefix now grows there
            try:
                return await send(request, node, path, payload, routed, deadline, deadline_ok, key)
            except _Failed as e:
                log.warning("node %s failed before the first byte (%s)%s", url, e,
                            "; failing over" if attempt + 1 < MAX_ATTEMPTS else "")
                metrics.failovers.labels(url).inc()
        if deadline is not None and time.monotonic() >= deadline:
            metrics.degraded.labels("deadline").inc()
            if routed.stream:
                return StreamingResponse(iter([_silence_chunk(routed.kind, model)]), media_type="text/event-stream")
            return _silence(routed.kind, model)
        metrics.degraded.labels("nodes_failed").inc()
        return JSONResponse(error_body("the nodes tried for this request failed before answering", "server_error",
                                       code="upstream_failed"), status_code=502)

    async def send(request: Request, node: Node, path: str, payload: bytes, routed: Routed,
                   deadline: float | None, deadline_ok: bool, key: str | None) -> Response:
        """One attempt on one node. Raises _Failed while nothing has reached the client yet."""
        node.in_flight += 1
        metrics.requests.labels(node.url).inc()
        resp: httpx.Response | None = None
        handed_over = False  # the relay generator owns resp and in_flight from here
        try:
            req = http.build_request("POST", node.url + path, content=payload,
                                     headers=forward_headers(request, deadline, deadline_ok))
            try:
                async with asyncio.timeout_at(deadline):
                    resp = await _unless_disconnected(request, http.send(req, stream=True))
            except _ClientGone:
                return Response(status_code=499)
            except httpx.ConnectError as e:
                nodes.mark_down(node, f"refused a connection: {e}")
                raise _Failed(repr(e)) from None
            except httpx.HTTPError as e:
                raise _Failed(repr(e)) from None
            if resp.status_code >= 500:
                raise _Failed(f"HTTP {resp.status_code}")
            media = resp.headers.get("content-type", "application/json")
            headers = {"X-Warmpath-Node": node.url}
            if resp.status_code != 200:  # bad input, auth, unknown model: the node's answer, as it gave it
                body = await _read_all(resp, deadline)
                return Response(body, status_code=resp.status_code, media_type=media, headers=headers)
            if routed.stream and media.startswith("text/event-stream"):
                events = _sse_events(resp.aiter_raw())
                try:
                    async with asyncio.timeout_at(deadline):
                        first = await _unless_disconnected(request, anext(events))
                except _ClientGone:  # a newer keystroke: closing the upstream stream (below) aborts it on the node
                    return Response(status_code=499)
                except (httpx.HTTPError, StopAsyncIteration) as e:
                    raise _Failed(repr(e)) from None
                stream = relay(first, events, resp, node, deadline, routed, key)
                handed_over = True
                # Started here, so its cleanup (in-flight count, upstream close) runs even if the client is gone
                # before the response starts iterating: a started async generator is closed when collected.
                head = await anext(stream)
                return StreamingResponse(_prepend(head, stream), media_type=media,
                                         headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            body = await _read_or_disconnect(request, resp, deadline)
            if body is None:  # the client went away: closing the upstream connection aborts the request
                return Response(status_code=499)
            if key is not None and complete_answer(body, streamed=False):
                cache.put(key, body, media)
            return Response(body, media_type=media, headers=headers)
        except TimeoutError:  # past the deadline before the answer: silence, the upstream is closed below
            metrics.degraded.labels("deadline").inc()
            if routed.stream:
                return StreamingResponse(iter([_silence_chunk(routed.kind, routed.body and routed.body.get("model"))]),
                                         media_type="text/event-stream", headers={"X-Warmpath-Node": node.url})
            return JSONResponse(_silence(routed.kind, (routed.body or {}).get("model")),
                                headers={"X-Warmpath-Node": node.url})
        except httpx.HTTPError as e:  # lost while reading a non-streamed body: nothing was sent yet
            raise _Failed(repr(e)) from None
        finally:
            if not handed_over:
                node.in_flight -= 1
                if resp is not None:
                    await resp.aclose()

    async def relay(first: bytes, events: AsyncIterator[bytes], resp: httpx.Response, node: Node,
                    deadline: float | None, routed: Routed, key: str | None) -> AsyncIterator[bytes]:
        kept = bytearray(first) if key is not None else None
        try:
            yield first
            while True:
                try:
                    async with asyncio.timeout_at(deadline):
                        event = await anext(events)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    metrics.degraded.labels("deadline").inc()
                    yield _silence_chunk(routed.kind, (routed.body or {}).get("model"))
                    return
                except httpx.HTTPError as e:
                    log.warning("node %s failed mid-stream: %r", node.url, e)
                    metrics.degraded.labels("mid_stream_failure").inc()
                    yield _sse_error("the node serving this stream failed; the answer is incomplete",
                                     "upstream_failed")
                    return
                if kept is not None:
                    kept += event
                yield event
            if kept is not None and complete_answer(bytes(kept), streamed=True):
                cache.put(key, bytes(kept), "text/event-stream")
        finally:  # also on client disconnect (the generator is closed): the node sees its stream closed
            node.in_flight -= 1
            await resp.aclose()

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await proxy(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await proxy(request, "/v1/chat/completions")

    return app


async def _prepend(head: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        yield head
        async for chunk in rest:
            yield chunk
    finally:
        await rest.aclose()


async def _unless_disconnected(request: Request, work):
    """Await `work` (the node's headers, or its first event) unless the client goes away first: a request
    cancelled before its first token must stop the node's work at once, not when the token finally comes."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
        if not gone.done():
            gone.cancel()
        await asyncio.gather(task, gone, return_exceptions=True)
    if task.done() and not task.cancelled():
        return task.result()
    raise _ClientGone()


async def _read_all(resp: httpx.Response, deadline: float | None) -> bytes:
    async with asyncio.timeout_at(deadline):
        return await resp.aread()


async def _read_or_disconnect(request: Request, resp: httpx.Response, deadline: float | None) -> bytes | None:
    """The node's whole (non-streamed) answer, or None if the client disconnects first."""
    reading = asyncio.ensure_future(_read_all(resp, deadline))
    gone = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({reading, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (reading, gone):
            if not t.done():
                t.cancel()
        await asyncio.gather(reading, gone, return_exceptions=True)
    if not reading.done() or reading.cancelled():
        return None
    return reading.result()  # raises TimeoutError / httpx errors to the caller


async def _wait_disconnect(request: Request) -> None:
    while True:
        if (await request.receive())["type"] == "http.disconnect":
            return
