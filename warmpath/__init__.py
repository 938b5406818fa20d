"""warmpath: a serving stack for AI code completion."""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["LLM", "EngineRequest", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from warmpath.engine.request import EngineRequest, RequestOutput, SamplingParams
    from warmpath.llm import LLM


def __getattr__(name: str):
    # Imported on first use: `warmpath.router`, `.client`, `.bench` and `.sim` must not pull in
    # torch.
    if name == "LLM":
        from warmpath.llm import LLM

        return LLM
    if name in ("EngineRequest", "RequestOutput", "SamplingParams"):
        from warmpath.engine import request

        return getattr(request, name)
    raise AttributeError(f"module 'warmpath' has no attribute {name!r}")
