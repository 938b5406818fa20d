"""The OpenAI-compatible HTTP server over one AsyncEngine: its routes (the editor protocols' are in
editor_routes.py), each an Ask run by the one pipeline (pipeline.py) over the served model
(served_model.py), and the app that holds them.
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
from warmpath.server.answers import OpenAIAnswers
from warmpath.server.pipeline import Pipeline
from warmpath.server.served_model import ServedModel

routes = APIRouter()


def _served(request: Request) -> ServedModel:
    return request.app.state.served


async def _run(body: CompletionRequest | ChatRequest, request: Request) -> Response:
    received, s = time.monotonic(), _served(request)
    ask = body.ask()
    return await request.app.state.pipeline.run(ask,
                                                OpenAIAnswers(ask, s.model_name, s.logprob_format),
                                                request, received)


@routes.get("/health")
async def health(request: Request):
    async_engine = _served(request).async_engine
    if not async_engine.alive:
        return JSONResponse({"status": "dead", "error": repr(async_engine.error)}, status_code=503)
    return {"status": "ok"}


@routes.get("/v1/models")
async def models(request: Request):
    f = _served(request)
    return {"object": "list", "data": [{**f.model_card, "id": name} for name in f.names]}


@routes.get("/v1/models/{model_id:path}")
async def model(model_id: str, request: Request):
    f = _served(request)
    f.check_model(model_id)
    return {**f.model_card, "id": model_id if model_id in f.names else f.model_name}


@routes.get("/metrics")
async def prometheus(request: Request):
    return Response(_served(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def completions(body: CompletionRequest, request: Request):
    return await _run(body, request)


# Tabby's completions share the path: the route tells the two by the body's shape (api/tabby.py
# speaks)
routes.add_api_route("/v1/completions", completions, methods=["POST"],
                     route_class_override=editor_routes.SharedCompletions)


@routes.post("/v1/chat/completions")
async def chat(body: ChatRequest, request: Request):
    return await _run(body, request)


def create_app(engine: Engine, config: ServerConfig | None = None) -> FastAPI:
    served = ServedModel(engine, config or ServerConfig())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        served.async_engine.shutdown()

    app = FastAPI(title="warmpath", lifespan=lifespan)
    app.state.served, app.state.pipeline = served, Pipeline(served)
    app.state.http_config = served.config  # its connection limits: api/serving.py
    app.state.engine, app.state.async_engine, app.state.metrics = (engine, served.async_engine,
                                                                   served.metrics)
    install_error_handlers(app)
    app.add_middleware(GuardMiddleware, config=served.config)
    app.include_router(routes)
    app.include_router(editor_routes.routes)
    return app
