"""The router's request path: read just enough of a request to route it, answer from the response
cache, pick nodes with the tier's policy, and send the request to a node, relaying its answer
through unbuffered.

A node that fails before the first byte reaches the client gets one failover to the next candidate
while the deadline allows; one that fails mid-stream ends the stream with an error event (never a
clean [DONE], never a replay). A node that sends nothing counts as failed: past `first_byte_timeout`
(a stream's first event) or `response_timeout` (a whole answer), past `idle_timeout` between two
events, or at once when it leaves the ring (router/watch.py). Past X-Deadline-Ms the router answers
silence itself and closes the upstream stream; the node is told the remaining budget. Bad input is
the node's to judge, so errors have exactly the node's shape (a node's 4xx is relayed as it is,
never failed over: it is the request's fault, not the node's); the router itself only refuses a bad
X-Deadline-Ms, before the cache is consulted. A client that goes away closes the upstream stream
(the node aborts).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from warmpath.api import mistral, ollama, tabby
from warmpath.api import responses as wire
from warmpath.api.asgi import ClientGone, unless_disconnected
from warmpath.api.ask import Ask, Outcome
from warmpath.api.credentials import authorization
from warmpath.api.protocol import error_body
from warmpath.config import RouterConfig
from warmpath.router.cache import ResponseCache, cache_key, complete_answer
from warmpath.router.forward import forward_headers
from warmpath.router.metrics import RouterMetrics
from warmpath.router.model_tiers import LINE, completion_kind
from warmpath.router.nodes import Node, NodeSet, parse_nodes
from warmpath.router.policies import RouteKey, Router
from warmpath.router.reading import Routed, read_request
from warmpath.router.sending import Send
from warmpath.router.sessions import SessionLog
from warmpath.router.translate import Collected, Translation, upstream_message
from warmpath.router.upstream import prepare
from warmpath.router.watch import Stalled, Watch

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 2  # the chosen node, then one failover
# answers cache.complete_answer can judge (llama.cpp's and Ollama's are never stored)
CACHEABLE = {mistral, tabby}
STREAM_MEDIA = ("text/event-stream", "application/x-ndjson")


class _Failed(Exception):
    """The node failed before the first byte reached the client: fail over."""


class Proxy:
    """The router's state (nodes, policies, cache, sessions, metrics, the upstream HTTP client) and
    its request path."""

    def __init__(self, config: RouterConfig):
        self.config = config
        nodes, self.model_tiers = parse_nodes(config)
        self.routers = {
            t: Router([n.url for n in nodes if n.model_tier == t], config.policy,
                      config.load_factor, config.virtual_nodes, config.prefix_block_chars,
                      config.prefix_index_blocks, config.affinity_floor)
            for t in self.model_tiers
        }
        self.cache = ResponseCache(config.cache_entries, ttl_s=config.cache_ttl)
        self.sessions = SessionLog()
        self.upstream_headers = {"Authorization": f"Bearer {config.upstream_api_key}"} \
            if config.upstream_api_key else {}
        # a backstop for
        read = max(config.first_byte_timeout, config.idle_timeout, config.response_timeout)
        # a send given up before it wrote its request (router/sending.py); the Watch's bounds are
        # the real ones
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=config.connect_timeout, read=read, write=30.0, pool=None),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))
        self.given_up: set[asyncio.Task] = set()  # sends given up, until they end
        self.nodes = NodeSet(nodes, self.http, config.health_interval, config.health_failures,
                             self.upstream_headers, on_unhealthy=self._forget,
                             floor=config.affinity_floor, nodes_file=config.nodes_file,
                             on_members=self.routers[self.model_tiers[0]].set_nodes)
        self.metrics = RouterMetrics(self.nodes, self.routers)

    def _forget(self, node: Node) -> None:
        # a node that left may come back empty: its index is stale
        self.routers[node.model_tier].forget(node.url)

    async def start(self) -> None:
        await self.nodes.check_all()
        self.nodes.start()

    async def close(self) -> None:
        await self.nodes.stop()
        await self.http.aclose()

    def model_card(self, name: str) -> dict:
        """A model's /v1/models entry as a node serving it describes it (architecture, quantization,
        FIM, ...)."""
        card = next((n.cards[name] for n in self.nodes.nodes.values() if name in n.cards), {})
        return {**card, "id": name, "object": "model", "created": 0, "owned_by": "warmpath"}

    def model_names(self) -> list[str]:
        names = [self.config.served_model_name] if self.config.served_model_name else []
        for n in self.nodes.nodes.values():
            names += [m for m in n.models if m not in names]
        return names

    async def ask_a_node(self, request: Request, path: str, wire=ollama) -> Response:
        """A metadata request (no routing, no cache): the least loaded available node of the last
        tier answers, to the same method; faults in `wire`'s shape."""
        available = self.nodes.available(self.model_tiers[-1])
        meta = Routed(path, b"", None, None, "", "fill", False, None, wire=wire)
        if not available:
            return fault(meta, 503, "no healthy node", "no_healthy_node")
        url = min(available, key=lambda u: self.nodes.loads().get(u, 0))
        auth = self.upstream_headers.get("Authorization") or authorization(request.headers)
        headers = {"Content-Type": "application/json", **({"Authorization": auth} if auth else {})}
        try:
            r = await self.http.request(request.method, url + path, content=await request.body(),
                                        headers=headers, timeout=self.config.response_timeout)
        except httpx.HTTPError as e:
            return fault(meta, 502, repr(e), "upstream_failed")
        return Response(r.content, status_code=r.status_code,
                        media_type=r.headers.get("content-type"))

    # -- one request -------------------------------------------------------------------------------
    async def handle(self, request: Request, path: str) -> Response | dict:
        routed = read_request(path, await request.body(), request.headers,
                              self.config.max_session_id_chars)
        if routed.session_hashed:  # kept as its hash (api/asgi.py session_key)
            self.metrics.session_ids_hashed.inc()
        model_tier = self.model_tiers[0]
        if len(self.model_tiers) > 1:
            body = routed.body or {}
            if routed.ask is not None:  # the same rule on the Ask's limits and suffix
                path, body = "/v1/completions", {"max_tokens": routed.ask.max_tokens or 10**9,
                                                 "suffix": routed.ask.fill.suffix}
            kind = completion_kind(path, body, request.headers.get("x-completion-kind"),
                                   self.config.line_max_tokens)
            model_tier = self.model_tiers[0] if kind == LINE else self.model_tiers[-1]
            self.metrics.model_tiers.labels(model_tier, kind).inc()
        if routed.body is not None and self.config.cache_entries > 0 and routed.wire in (
                None, *CACHEABLE):
            # per tenant and model tier (cache.py); an editor protocol's own default temperature
            # decides (Tabby's: greedy)
            body = routed.body if routed.ask is None else {
                **routed.body, "temperature": routed.ask.temperature
            }
            routed.key = cache_key(routed.path, body,
                                   authorization(request.headers).encode("latin-1"), model_tier)
        if routed.key is not None:
            hit = self.cache.get(routed.key)
            self.metrics.cache.labels("hit" if hit else "miss").inc()
            if hit:
                return Response(hit.body, media_type=hit.media_type,
                                headers={"X-Warmpath-Cache": "hit"})
        decision = self.routers[model_tier].choose(RouteKey(routed.session, routed.prompt),
                                                   self.nodes.available(model_tier),
                                                   self.nodes.loads())
        self.metrics.decisions.labels(self.config.policy, decision.decision).inc()
        if routed.session and decision.nodes:
            self.sessions.note(routed.session, decision.nodes[0], True)
        if not decision.nodes:
            self.metrics.degraded.labels("no_node").inc()
            where = "" if len(self.model_tiers) == 1 else " in tier " + model_tier
            return fault(routed, 503, f"no healthy node{where}", "no_healthy_node")
        return await self.failover(request, routed, decision.nodes)

    async def failover(self, request: Request, routed: Routed,
                       candidates: list[str]) -> Response | dict:
        """The first candidate's answer; the next candidate's if it fails before the first byte."""
        for attempt, url in enumerate(candidates[:MAX_ATTEMPTS]):
            if routed.deadline is not None and time.monotonic() >= routed.deadline:
                break
            node = self.nodes.nodes.get(url)
            if node is None:  # gone from the nodes file meanwhile
                continue
            own_model = len(self.model_tiers) > 1 and (routed.model is None or
                                                 routed.model in self.model_names())
            path, payload, convert = prepare(node, routed, own_model, self.config.completion_scope)
            if routed.session and attempt:
                # failed over: the prefix now grows there
                self.sessions.note(routed.session, url, False)
            try:
                return await self.send(request, node, path, payload, routed, convert)
            except _Failed as e:
                log.warning("node %s failed before the first byte (%s)%s", url, e,
                            "; failing over" if attempt + 1 < MAX_ATTEMPTS else "")
                self.metrics.failovers.labels(url).inc()
        if routed.deadline is not None and time.monotonic() >= routed.deadline:
            self.metrics.degraded.labels("deadline").inc()
            return silence(routed, {})
        self.metrics.degraded.labels("nodes_failed").inc()
        return fault(routed, 502, "the nodes tried for this request failed before answering",
                     "upstream_failed")

    async def send(self, request: Request, node: Node, path: str, payload: bytes, routed: Routed,
                   convert: Translation | Collected | None = None) -> Response:
        """One attempt on one node. Raises _Failed while nothing has reached the client yet: the
        node refused, failed, answered 5xx, sent nothing within its bound (first event of a stream,
        or a whole answer) or left the ring."""
        node.in_flight += 1
        self.metrics.requests.labels(node.url).inc()
        deadline, watch = routed.deadline, Watch(node)
        first = time.monotonic() + (self.config.first_byte_timeout
                                    if routed.stream else self.config.response_timeout)
        resp: httpx.Response | None = None
        handed_over = False  # the relay generator owns resp, the watch and in_flight from here
        try:
            req = self.http.build_request(
                "POST", node.url + path, content=payload,
                headers=forward_headers(request.headers, routed.session, routed.deadline,
                                        self.upstream_headers.get("Authorization")))
            sending = Send(self.http, req, self.given_up)
            try:
                async with watch.until(deadline, first, "the answer"):
                    resp = await unless_disconnected(request, asyncio.shield(sending.task))
            except httpx.ConnectError as e:
                self.nodes.mark_down(node, f"refused a connection: {e}")
                raise _Failed(repr(e)) from None
            finally:
                if resp is None:
                    sending.give_up()
            if resp.status_code >= 500:
                raise _Failed(f"HTTP {resp.status_code}")
            media = resp.headers.get("content-type", "application/json")
            headers = {"X-Warmpath-Node": node.url}
            if resp.status_code != 200:
                # bad input, auth, unknown model: the node's answer, as it gave it
                async with watch.until(deadline, first, "the answer"):
                    body = await resp.aread()
                if convert is not None:  # ... in the protocol the client speaks
                    return fault(routed, resp.status_code, upstream_message(body),
                                 "upstream_rejected")
                return Response(body, status_code=resp.status_code, media_type=media,
                                headers=headers)
            if convert is not None and convert.collect:  # streamed from the node, answered whole
                async with watch.until(deadline, first, "the answer"):
                    body = await unless_disconnected(
                        request, convert.gather(wire.sse_events(resp.aiter_raw())))
                return self.whole(routed, body, "application/json", headers)
            if routed.stream and media.startswith(STREAM_MEDIA):
                framing = routed.wire.FRAMING if routed.wire and not convert else "sse"
                events = (wire.ndjson_lines if framing == "ndjson" else wire.sse_events)(
                    resp.aiter_raw())
                if convert is not None:
                    events, media = convert.events(events), convert.media
                async with watch.until(deadline, first, "the first event"):
                    head = await unless_disconnected(request, anext(events))
                stream = self.relay(head, events, resp, watch, routed)
                handed_over = True
                # Started here, so its cleanup (in-flight count, upstream close) runs even if the
                # client is gone before the response starts iterating: a started async generator is
                # closed when collected.
                head = await anext(stream)
                return StreamingResponse(_prepend(head, stream), media_type=media,
                                         headers={**headers, **wire.SSE_HEADERS})
            async with watch.until(deadline, first, "the answer"):
                body = await unless_disconnected(request, resp.aread())
            if convert is not None:
                body, media = convert.answer(body), "application/json"
            return self.whole(routed, body, media, headers)
        except ClientGone:
            # a newer keystroke: closing the upstream stream (below) aborts it on the node
            return Response(status_code=499)
        except TimeoutError:
            # past the deadline before the answer: silence, the upstream is closed below
            self.metrics.degraded.labels("deadline").inc()
            return silence(routed, {"X-Warmpath-Node": node.url})
        except (httpx.HTTPError, StopAsyncIteration, Stalled, ValueError) as e:
            # nothing sent to the client yet
            # (ValueError: a translated answer that is not the OpenAI JSON it should be)
            raise _Failed(str(e) if isinstance(e, Stalled) else repr(e)) from None
        finally:
            if not handed_over:
                node.in_flight -= 1
                watch.close()
                if resp is not None:
                    await resp.aclose()

    def whole(self, routed: Routed, body: bytes, media: str, headers: dict) -> Response:
        if routed.key is not None and complete_answer(body, streamed=False):
            self.cache.put(routed.key, body, media)
        return Response(body, media_type=media, headers=headers)

    async def relay(self, first: bytes, events: AsyncIterator[bytes], resp: httpx.Response,
                    watch: Watch, routed: Routed) -> AsyncIterator[bytes]:
        node, kept = watch.node, bytearray(first) if routed.key is not None else None
        try:
            yield first
            while True:
                try:
                    async with watch.until(routed.deadline,
                                           time.monotonic() + self.config.idle_timeout,
                                           "the next event"):
                        event = await anext(events)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    self.metrics.degraded.labels("deadline").inc()
                    yield silence_events(routed)
                    return
                except (httpx.HTTPError, Stalled) as e:
                    log.warning("node %s failed mid-stream: %s", node.url,
                                e if isinstance(e, Stalled) else repr(e))
                    self.metrics.degraded.labels("mid_stream_failure").inc()
                    message = "the node serving this stream failed; the answer is incomplete"
                    yield routed.wire.stream_error(message) if routed.wire else \
                        wire.sse_error(message, "upstream_failed").encode()
                    return
                if kept is not None:
                    kept += event
                yield event
            if kept is not None and complete_answer(bytes(kept), streamed=True):
                self.cache.put(routed.key, bytes(kept),
                               resp.headers.get("content-type", "text/event-stream"))
        finally:
            # also on client disconnect (the generator is closed): the node sees its stream closed
            node.in_flight -= 1
            watch.close()
            await resp.aclose()


def fault(routed: Routed, status: int, message: str, code: str) -> Response:
    """The router's own error, in the request's protocol (JSON, or Tabby's plain text)."""
    body = routed.wire.error(status, message).body if routed.wire else error_body(
        message, "server_error", code=code)
    return PlainTextResponse(body, status_code=status) if isinstance(body, str) else \
        JSONResponse(body, status_code=status)


def silence_events(routed: Routed) -> bytes:
    """The end of a stream past the deadline, in the request's protocol (empty text, never an
    error)."""
    if routed.wire is None:
        return wire.silence_sse(routed.kind, routed.model).encode()
    return routed.wire.end(routed.ask or Ask(stream=True), wire.new_id("route"), Outcome(),
                           routed.model)


def silence(routed: Routed, headers: dict) -> Response:
    """The router's own answer past the deadline: the protocol's "nothing", whole or as a stream."""
    if routed.stream:
        media = routed.wire.STREAM_MEDIA if routed.wire else "text/event-stream"
        return StreamingResponse(iter([silence_events(routed)]), media_type=media, headers=headers)
    if routed.wire is None:
        return JSONResponse(wire.silence(routed.kind, routed.model), headers=headers)
    return Response(
        routed.wire.answer(routed.ask or Ask(), wire.new_id("route"), Outcome(), routed.model),
        media_type="application/json", headers=headers)


async def _prepend(head: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        yield head
        async for chunk in rest:
            yield chunk
    finally:
        await rest.aclose()
