"""LLM: the offline API over one Engine. generate() queues every prompt and steps until all are
done."""

from __future__ import annotations

from warmpath.config import EngineConfig
from warmpath.engine.engine import Engine
from warmpath.engine.request import EngineRequest, RequestOutput, SamplingParams
from warmpath.models.tokenizer import Tokenizer

Prompt = str | dict


class LLM:
    def __init__(self, model: str = EngineConfig.model, **engine_kwargs):
        self.engine = Engine(EngineConfig(model=model, **engine_kwargs))
        self._next_id = 0

    @property
    def config(self) -> EngineConfig:
        return self.engine.config

    @property
    def model_config(self):
        return self.engine.model_config

    @property
    def dtype(self):
        return self.engine.dtype

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def get_tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    def stats(self) -> dict:
        return self.engine.stats()

    def _prompt_ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.engine.tokenizer.encode(prompt)
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            return list(prompt["prompt_token_ids"])
        raise TypeError("a prompt is a str or {'prompt_token_ids': [...]}")

    def generate(
            self, prompts: Prompt | list[Prompt],
            params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        params = params or SamplingParams()
        plist = params if isinstance(params, list) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError("one SamplingParams per prompt, or one for all")
        ids = []
        try:
            for prompt, sp in zip(prompts, plist, strict=True):
                self._next_id += 1
                rid = f"llm-{self._next_id}"
                self.engine.add_request(EngineRequest(rid, self._prompt_ids(prompt), sp))
                ids.append(rid)
            done: dict[str, RequestOutput] = {}
            while len(done) < len(ids):
                for out in self.engine.step():
                    if out.finished:
                        done[out.request_id] = out
        except BaseException:
            for rid in ids:  # nothing left behind holding blocks
                self.engine.abort(rid)
            while self.engine.has_unfinished_requests() and any(r in self.engine.requests
                                                                for r in ids):
                self.engine.step()
            raise
        return [done[rid] for rid in ids]
