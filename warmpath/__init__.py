"""warmpath: a serving stack for AI code completion."""

from warmpath.engine.request import RequestOutput, SamplingParams
from warmpath.llm import LLM

__all__ = ["LLM", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"
