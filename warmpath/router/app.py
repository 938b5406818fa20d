"""`warmpath route`: one OpenAI-compatible endpoint in front of many nodes (warmpath or any
OpenAI-compatible server), sending each session back to the node where its prefix is warm. The
routes and the admin API; the request path itself (routing, cache, failover, relay) is proxy.py's
`Proxy`."""

from __future__ import annotations

import hmac
import logging
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from warmpath.api import ollama, tabby
from warmpath.api.asgi import install_error_handlers
from warmpath.api.credentials import authorization
from warmpath.api.guard import GuardMiddleware
from warmpath.api.protocol import ApiError
from warmpath.config import RouterConfig
from warmpath.router.nodes import Node, base_url
from warmpath.router.policies import RouteKey
from warmpath.router.proxy import Proxy
from warmpath.router.reading import EDITOR_WIRES

log = logging.getLogger(__name__)
routes = APIRouter()


def _proxy(request: Request) -> Proxy:
    return request.app.state.proxy


def node_view(n: Node) -> dict:
    load = n.load
    return {
        "url": n.url, "engine": n.kind, "tier": n.model_tier, "healthy": n.healthy,
        "draining": n.draining, "in_flight": n.in_flight, "models": n.models,
        "reported": {"running": load.running, "waiting": load.waiting, "kv_usage": load.kv_usage}
        if load else None
    }


# -- the fleet's state -----------------------------------------------------------------------------
@routes.get("/health")
async def health(request: Request):
    p = _proxy(request)
    ok = all(p.nodes.available(t) for t in p.model_tiers)
    body = {
        "status": "ok" if ok else "unavailable",
        "nodes": [node_view(n) for n in p.nodes.nodes.values()]
    }
    return JSONResponse(body, status_code=200 if ok else 503)


@routes.get("/v1/models")
async def models(request: Request):
    p = _proxy(request)
    return {"object": "list", "data": [p.model_card(m) for m in p.model_names()]}


@routes.get("/v1/models/{model_id:path}")
async def model(model_id: str, request: Request):
    if model_id not in _proxy(request).model_names():
        raise ApiError(404, f"model {model_id!r} does not exist", param="model",
                       code="model_not_found")
    return _proxy(request).model_card(model_id)


@routes.get("/metrics")
async def prometheus(request: Request):
    p = _proxy(request)
    await p.nodes.scrape()
    return Response(p.metrics.render(), media_type=CONTENT_TYPE_LATEST)


# -- admin -----------------------------------------------------------------------------------------
def _admin(request: Request) -> Proxy:
    """The proxy, for a request that carries the admin key; ApiError (403 / 401) otherwise."""
    p = _proxy(request)
    if not p.config.admin_key:
        raise ApiError(403, "admin routes are off: start the router with --admin-key",
                       "permission_error", code="admin_disabled")
    auth = authorization(request.headers)
    if not hmac.compare_digest(auth.encode("latin-1"), f"Bearer {p.config.admin_key}".encode()):
        raise ApiError(401, "missing or wrong admin key", "authentication_error",
                       code="invalid_admin_key")
    return p


@routes.get("/admin/sessions")
async def list_sessions(request: Request):
    """Where each recent session's latest request went (where its prefix is warm)."""
    return {"sessions": _admin(request).sessions.view()}


@routes.get("/admin/route")
async def where(request: Request, session: str, tier: str | None = None):
    """The node this replica would send the session's next request to now (nothing is sent):
    replicas that agree answer the same."""
    p = _admin(request)
    tier = tier or p.model_tiers[-1]
    if tier not in p.routers:
        raise ApiError(404, f"no tier {tier!r}", param="tier", code="tier_not_found")
    decision = p.routers[tier].choose(RouteKey(session, ""), p.nodes.available(tier),
                                      p.nodes.loads())
    return {"session": session, "tier": tier, "node": decision.nodes[0] if decision.nodes else None,
            "decision": decision.decision}


@routes.get("/admin/nodes")
async def list_nodes(request: Request):
    return {"nodes": [node_view(n) for n in _admin(request).nodes.nodes.values()]}


async def _set_draining(request: Request, draining: bool) -> dict:
    p = _admin(request)
    try:
        url = base_url(str((await request.json())["node"]))
    except (ValueError, KeyError, TypeError):
        raise ApiError(400, 'body must be {"node": URL}', param="node") from None
    node = p.nodes.nodes.get(url)
    if node is None:
        raise ApiError(404, f"no node {url!r}", param="node", code="node_not_found")
    node.draining = draining
    log.info("node %s %s", url, "draining" if draining else "takes new requests again")
    return node_view(node)


@routes.post("/admin/nodes/drain")
async def drain(request: Request):
    return await _set_draining(request, True)


@routes.post("/admin/nodes/undrain")
async def undrain(request: Request):
    return await _set_draining(request, False)


# -- the proxied routes ----------------------------------------------------------------------------
@routes.post("/v1/completions")
async def completions(request: Request):
    return await _proxy(request).handle(request, "/v1/completions")


@routes.post("/v1/chat/completions")
async def chat(request: Request):
    return await _proxy(request).handle(request, "/v1/chat/completions")


async def _editor(request: Request):
    return await _proxy(request).handle(request, request.url.path)


for _path in EDITOR_WIRES:
    # llama.cpp's /infill, Ollama's /api/generate, Mistral's /v1/fim/completions
    routes.add_api_route(_path, _editor, methods=["POST"])


@routes.get("/api/tags")
async def ollama_tags(request: Request):
    return ollama.tags(_proxy(request).model_names())


@routes.get("/api/version")
async def ollama_version():
    return ollama.version()


@routes.post("/api/show")
async def ollama_show(request: Request):
    """A node's own answer (its template says how it fills in the middle)."""
    return await _proxy(request).ask_a_node(request, "/api/show")


@routes.get("/v1/health")
@routes.post("/v1/health", operation_id="tabby_health_post")
async def tabby_health(request: Request):
    """Tabby's health, a node's (its model and device): tabby-agent offers completions once it names
    a model."""
    return await _proxy(request).ask_a_node(request, "/v1/health", tabby)


@routes.get("/v1beta/server_setting")
async def tabby_server_setting():
    return tabby.server_setting()


@routes.post("/v1/events")
async def tabby_events(request: Request):
    """Accepted and dropped here, as on a node."""
    tabby.check_event(await request.body())
    return Response(status_code=200)


def create_router_app(config: RouterConfig) -> FastAPI:
    proxy = Proxy(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await proxy.start()
        yield
        await proxy.close()

    app = FastAPI(title="warmpath router", lifespan=lifespan)
    app.state.proxy = proxy
    app.state.http_config = config  # its connection limits: api/serving.py
    app.state.nodes, app.state.routers, app.state.cache, app.state.metrics = \
        proxy.nodes, proxy.routers, proxy.cache, proxy.metrics
    install_error_handlers(app)
    app.add_middleware(GuardMiddleware, config=config, open_paths=("/health", "/admin"))
    app.include_router(routes)
    return app
