"""The OpenAI-compatible HTTP server over one AsyncEngine: its routes (the editor protocols' are in
editor_routes.py), over the Frontend (frontend.py) they share, and the app that holds them.
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from warmpath.api.asgi import install_error_handlers
from warmpath.api.guard import GuardMiddleware
from warmpath.api.protocol import ChatRequest, CompletionRequest
from warmpath.config import ServerConfig
from warmpath.engine.engine import Engine
from warmpath.server import editor_routes
from warmpath.server.editors import Editors
from warmpath.server.frontend import Frontend

routes = APIRouter()


def _frontend(request: Request) -> Frontend:
    return request.app.state.frontend


@routes.get("/health")
async def health(request: Request):
    async_engine = _frontend(request).async_engine
    if not async_engine.alive:
        return JSONResponse({"status": "dead", "error": repr(async_engine.error)}, status_code=503)
    return {"status": "ok"}


@routes.get("/v1/models")
async def models(request: Request):
    f = _frontend(request)
    return {"object": "list", "data": [{**f.model_card, "id": name} for name in f.names]}


@routes.get("/v1/models/{model_id:path}")
async def model(model_id: str, request: Request):
    f = _frontend(request)
    f.check_model(model_id)
    return {**f.model_card, "id": model_id if model_id in f.names else f.model_name}


@routes.get("/metrics")
async def prometheus(request: Request):
    return Response(_frontend(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def completions(body: CompletionRequest, request: Request):
    received, f = time.monotonic(), _frontend(request)
    return await f.respond(await f.completion_job(body, request, received), body, request)


# Tabby's completions share the path: the route tells the two by the body's shape (api/tabby.py speaks)
routes.add_api_route("/v1/completions", completions, methods=["POST"],
                     route_class_override=editor_routes.SharedCompletions)


@routes.post("/v1/chat/completions")
async def chat(body: ChatRequest, request: Request):
    received, f = time.monotonic(), _frontend(request)
    return await f.respond(await f.chat_job(body, request, received), body, request)


def create_app(engine: Engine, config: ServerConfig | None = None) -> FastAPI:
    frontend = Frontend(engine, config or ServerConfig())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        frontend.async_engine.shutdown()

    app = FastAPI(title="warmpath", lifespan=lifespan)
    app.state.frontend = frontend
    app.state.editors = Editors(frontend)
    app.state.http_config = frontend.config  # its connection limits: api/serving.py
    app.state.engine, app.state.async_engine, app.state.metrics = engine, frontend.async_engine, frontend.metrics
    install_error_handlers(app)
    app.add_middleware(GuardMiddleware, config=frontend.config)
    app.include_router(routes)
    app.include_router(editor_routes.routes)
    return app
