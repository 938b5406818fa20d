"""The editor protocols' routes on `warmpath serve`: llama.cpp's /infill, Ollama's /api/*, Mistral's
/v1/fim/completions. Each completion is a Fill run by server/editors.py; the model listings are answered here."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from warmpath.api import infill, mistral, ollama
from warmpath.api.fill import parse_json
from warmpath.server.editors import Editors

routes = APIRouter()


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
    name, _, family = _ollama_model(request)
    return ollama.tags([name], family)


@routes.get("/api/version")
async def ollama_version():
    return ollama.version()
