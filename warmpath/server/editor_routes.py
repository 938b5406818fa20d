"""The editor protocols' routes on `warmpath serve`: llama.cpp's /infill, Ollama's /api/*, Mistral's
/v1/fim/completions, Tabby's /v1/health, /v1beta/server_setting, /v1/events and its completions (on
OpenAI's /v1/completions: SharedCompletions). Each completion is the protocol's Ask run by the one
pipeline (server/pipeline.py) and answered in its shape (server/answers.py); the model listings are
answered here."""

from __future__ import annotations

import json
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute

from warmpath.api import infill, mistral, ollama, tabby
from warmpath.api.bodies import parse_json
from warmpath.api.protocol import ApiError
from warmpath.server.answers import EditorAnswers, shaped_error
from warmpath.server.served_model import ServedModel

routes = APIRouter()


class SharedCompletions(APIRoute):
    """POST /v1/completions is OpenAI's and Tabby's: a body `tabby.speaks` goes to Tabby's handler,
    any other to the route's own (OpenAI's, validated by FastAPI and documented in /openapi.json as
    before)."""

    def get_route_handler(self):
        openai = super().get_route_handler()

        async def handler(request: Request) -> Response:
            try:
                body = json.loads(await request.body())
            except (ValueError, RecursionError):
                body = None  # OpenAI's handler answers the 400
            if tabby.speaks(body):
                return await _serve(tabby, request, check_model=False)  # Tabby names no model
            return await openai(request)

        return handler


def _served(request: Request) -> ServedModel:
    return request.app.state.served


async def _serve(wire, request: Request, check_model: bool = True) -> Response:
    """The body parsed by its protocol (`wire`: an api/ module) and run by the pipeline."""
    received = time.monotonic()
    try:
        ask = wire.parse(await request.body())
    except ApiError as e:
        raise shaped_error(wire, e) from None
    answers = EditorAnswers(wire, ask, _served(request).model_name)
    return await request.app.state.pipeline.run(ask, answers, request, received, check_model)


@routes.post("/infill")
async def llama_infill(request: Request):
    return await _serve(infill, request, check_model=False)  # llama.cpp serves its one model


@routes.post("/v1/fim/completions")
async def mistral_fim(request: Request):
    return await _serve(mistral, request)


@routes.post("/api/generate")
async def ollama_generate(request: Request):
    return await _serve(ollama, request)


def _ollama_model(request: Request) -> tuple[str, str | None, str]:
    s = _served(request)
    return s.model_name, None if s.fim is None else s.fim.layout, s.engine.model_config.architecture


@routes.post("/api/show")
async def ollama_show(request: Request):
    body = parse_json(await request.body(), ollama.error)
    asked = body.get("model") or body.get("name")
    name, layout, family = _ollama_model(request)
    if not isinstance(asked,
                      str) or ollama.served_name(asked) not in _served(request).accepted_names:
        return JSONResponse({"error": f"model {asked!r} not found; this server serves {name!r}"},
                            status_code=404)
    return ollama.show(name, layout, family, _served(request).engine.max_model_len)


@routes.get("/api/tags")
async def ollama_tags(request: Request):
    _, _, family = _ollama_model(request)
    return ollama.tags(_served(request).names, family)


@routes.get("/api/version")
async def ollama_version():
    return ollama.version()


# -- Tabby -----------------------------------------------------------------------------------------
def devices(request: Request) -> tuple[str, list[str]]:
    """("cpu" | "cuda", the CUDA devices' names) of the engine, as Tabby's health reports them."""
    device = _served(request).engine.config.device
    if not device.startswith("cuda"):
        return "cpu", []
    import torch

    return "cuda", [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


@routes.get("/v1/health")
# tabby-agent falls back to POST (older Tabby servers)
@routes.post("/v1/health", operation_id="tabby_health_post")
async def tabby_health(request: Request):
    return tabby.health(_served(request).model_name, *devices(request))


@routes.get("/v1beta/server_setting")
async def tabby_server_setting():
    return tabby.server_setting()


@routes.post("/v1/events")
async def tabby_events(request: Request):
    tabby.check_event(await request.body())
    return Response(status_code=200)
