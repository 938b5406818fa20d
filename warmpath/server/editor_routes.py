"""The editor protocols' routes on `warmpath serve`: llama.cpp's /infill, Ollama's /api/*, Mistral's
/v1/fim/completions, Tabby's /v1/health, /v1beta/server_setting, /v1/events and its completions (on OpenAI's
/v1/completions: SharedCompletions). Each completion is a Fill run by server/editors.py; the model listings
are answered here."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute

from warmpath.api import infill, mistral, ollama, tabby
from warmpath.api.fill import parse_json
from warmpath.server.editors import Editors

routes = APIRouter()


class SharedCompletions(APIRoute):
    """POST /v1/completions is OpenAI's and Tabby's: a body `tabby.speaks` goes to Tabby's handler, any other to
    the route's own (OpenAI's, validated by FastAPI and documented in /openapi.json as before)."""

    def get_route_handler(self):
        openai = super().get_route_handler()

        async def handler(request: Request) -> Response:
            try:
                body = json.loads(await request.body())
            except (ValueError, RecursionError):
                body = None  # OpenAI's handler answers the 400
            if tabby.speaks(body):
                return await _editors(request).handle(tabby, request, check_model=False)  # Tabby names no model
            return await openai(request)

        return handler


def _editors(request: Request) -> Editors:
    return request.app.state.editors


@routes.post("/infill")
async def llama_infill(request: Request):
    return await _editors(request).handle(infill, request, check_model=False)  # llama.cpp serves its one model


@routes.post("/v1/fim/completions")
async def mistral_fim(request: Request):
    return await _editors(request).handle(mistral, request)


@routes.post("/api/generate")
async def ollama_generate(request: Request):
    return await _editors(request).handle(ollama, request)


def _ollama_model(request: Request) -> tuple[str, str | None, str]:
    f = _editors(request).f
    return f.model_name, None if f.fim is None else f.fim.layout, f.engine.model_config.architecture


@routes.post("/api/show")
async def ollama_show(request: Request):
    body = parse_json(await request.body(), ollama.error)
    asked = body.get("model") or body.get("name")
    name, layout, family = _ollama_model(request)
    if not isinstance(asked, str) or ollama.served_name(asked) not in _editors(request).f.accepted_names:
        return JSONResponse({"error": f"model {asked!r} not found; this server serves {name!r}"}, status_code=404)
    return ollama.show(name, layout, family, _editors(request).f.engine.max_model_len)


@routes.get("/api/tags")
async def ollama_tags(request: Request):
    _, _, family = _ollama_model(request)
    return ollama.tags(_editors(request).f.names, family)


@routes.get("/api/version")
async def ollama_version():
    return ollama.version()


# -- Tabby --------------------------------------------------------------------------------------------------------
def devices(request: Request) -> tuple[str, list[str]]:
    """("cpu" | "cuda", the CUDA devices' names) of the engine, as Tabby's health reports them."""
    device = _editors(request).f.engine.config.device
    if not device.startswith("cuda"):
        return "cpu", []
    import torch

    return "cuda", [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


@routes.get("/v1/health")
@routes.post("/v1/health", operation_id="tabby_health_post")  # tabby-agent falls back to POST (older Tabby servers)
async def tabby_health(request: Request):
    return tabby.health(_editors(request).f.model_name, *devices(request))


@routes.get("/v1beta/server_setting")
async def tabby_server_setting():
    return tabby.server_setting()


@routes.post("/v1/events")
async def tabby_events(request: Request):
    tabby.check_event(await request.body())
    return Response(status_code=200)
