"""The editor protocols' routes on `warmpath serve`: llama.cpp's /infill, Ollama's /api/*, Mistral's
/v1/fim/completions. Each is a Fill run by server/editors.py; only the model listings are answered here."""

from __future__ import annotations

from fastapi import APIRouter, Request

from warmpath.api import infill
from warmpath.server.editors import Editors

routes = APIRouter()


def _editors(request: Request) -> Editors:
    return request.app.state.editors


@routes.post("/infill")
async def llama_infill(request: Request):
    return await _editors(request).handle(infill, request, check_model=False)  # llama.cpp serves its one model
