"""LLM: the offline API. Loads a model, owns the KV cache, generates for a list of prompts.

The generation loop here is the foundation's interim loop (decodes first, then prompt chunks under the token
budget, blocks reserved up front, no prefix caching, no preemption). The engine-core issue replaces it with
Engine + Scheduler and keeps this class's interface.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from warmpath.config import EngineConfig
from warmpath.engine.kv_cache import BlockPool, allocate_kv_cache, num_kv_blocks
from warmpath.engine.request import (
    FinishReason,
    PromptTooLongError,
    RequestMetrics,
    RequestOutput,
    SamplingParams,
)
from warmpath.engine.runner import ModelRunner, SeqInput
from warmpath.engine.sampler import make_generator, sample
from warmpath.models.llama import LlamaForCausalLM
from warmpath.models.registry import load_checkpoint
from warmpath.models.tokenizer import Tokenizer

log = logging.getLogger(__name__)

Prompt = str | dict


def resolve_dtype(name: str, device: str) -> torch.dtype:
    if name == "auto":
        if device.startswith("cuda"):
            return torch.bfloat16
        # bf16 where the CPU computes it natively (AVX-512 BF16 / AMX); fp32 elsewhere.
        return torch.bfloat16 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else torch.float32
    dtypes = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
              "float16": torch.float16, "fp16": torch.float16}
    if name not in dtypes:
        raise ValueError(f"unknown dtype {name!r} (auto, float32, bfloat16, float16)")
    return dtypes[name]


@dataclass
class _Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]
    max_tokens: int
    generator: torch.Generator | None
    metrics: RequestMetrics
    blocks: list[int] = field(default_factory=list)
    num_computed: int = 0
    output_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None

    @property
    def prefilled(self) -> bool:
        return self.num_computed >= len(self.prompt_ids)


class LLM:
    def __init__(self, model: str = "smollm2", **engine_kwargs):
        self.config = EngineConfig(model=model, **engine_kwargs)
        cfg = self.config
        torch.set_num_threads(cfg.num_threads or os.cpu_count() or 1)
        self.dtype = resolve_dtype(cfg.dtype, cfg.device)
        ckpt = load_checkpoint(model, self.dtype)
        self.model_config = ckpt.config
        self.tokenizer: Tokenizer = ckpt.tokenizer
        self.model = LlamaForCausalLM.from_weights(ckpt.config, ckpt.weights, self.dtype, cfg.device)
        del ckpt
        self.max_model_len = min(cfg.max_model_len or self.model_config.max_position_embeddings,
                                 self.model_config.max_position_embeddings)
        blocks = num_kv_blocks(cfg, self.model_config, self.dtype)
        self.block_pool = BlockPool(blocks)
        kv = allocate_kv_cache(self.model_config, blocks, cfg.block_size, self.dtype, cfg.device)
        self.runner = ModelRunner(self.model, kv, cfg.block_size)
        self._next_id = 0

    def get_tokenizer(self) -> Tokenizer:
        return self.tokenizer

    def stats(self) -> dict:
        return {"num_blocks": self.block_pool.num_blocks, "free_blocks": self.block_pool.num_free}

    def _prompt_ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            ids = list(prompt["prompt_token_ids"])
            vocab = self.model_config.vocab_size
            if any(not isinstance(t, int) or not 0 <= t < vocab for t in ids):
                raise ValueError(f"prompt_token_ids must be ints in [0, {vocab})")
            return ids
        raise TypeError("a prompt is a str or {'prompt_token_ids': [...]}")

    def _new_sequence(self, prompt: Prompt, params: SamplingParams, now: float) -> _Sequence:
        ids = self._prompt_ids(prompt)
        if not ids:
            raise ValueError("empty prompt")
        if len(ids) >= self.max_model_len:
            raise PromptTooLongError(f"prompt of {len(ids)} tokens does not fit max_model_len {self.max_model_len}")
        stop = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.tokenizer.stop_token_ids)
        self._next_id += 1
        return _Sequence(
            request_id=str(self._next_id),
            prompt_ids=ids,
            params=params,
            stop_ids=stop,
            max_tokens=min(params.max_tokens, self.max_model_len - len(ids)),
            generator=make_generator(params, self.config.seed, self.config.device),
            metrics=RequestMetrics(arrival_time=now),
        )

    def generate(
        self, prompts: Prompt | list[Prompt], params: SamplingParams | list[SamplingParams] | None = None
    ) -> list[RequestOutput]:
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        params = params or SamplingParams()
        plist = params if isinstance(params, list) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError("one SamplingParams per prompt, or one for all")
        now = time.perf_counter()
        seqs = [self._new_sequence(p, sp, now) for p, sp in zip(prompts, plist, strict=True)]
        self._run(seqs)
        return [self._output(s) for s in seqs]

    def _blocks_needed(self, s: _Sequence) -> int:
        # The last sampled token is never fed back, so the cache holds prompt + max_tokens - 1 tokens.
        return -(-(len(s.prompt_ids) + s.max_tokens - 1) // self.config.block_size)

    def _run(self, seqs: list[_Sequence]) -> None:
        cfg, pool = self.config, self.block_pool
        for s in seqs:
            if self._blocks_needed(s) > pool.num_blocks:
                raise PromptTooLongError(
                    f"request needs {self._blocks_needed(s)} KV blocks, the pool has {pool.num_blocks}"
                )
        waiting, running = deque(seqs), []
        while waiting or running:
            while waiting and len(running) < cfg.max_num_seqs and self._blocks_needed(waiting[0]) <= pool.num_free:
                s = waiting.popleft()
                s.blocks = pool.allocate(self._blocks_needed(s))
                running.append(s)
            budget = cfg.max_num_batched_tokens
            step: list[tuple[_Sequence, SeqInput]] = []
            for s in running:  # decodes first: one token each, every step
                if s.prefilled:
                    step.append((s, SeqInput([s.output_ids[-1]], s.num_computed, s.blocks)))
                    budget -= 1
            for s in running:  # then prompt chunks under what is left of the budget
                if not s.prefilled and budget > 0:
                    chunk = s.prompt_ids[s.num_computed : s.num_computed + budget]
                    last = s.num_computed + len(chunk) == len(s.prompt_ids)
                    step.append((s, SeqInput(chunk, s.num_computed, s.blocks, sample=last)))
                    budget -= len(chunk)
            t = time.perf_counter()
            for s, _ in step:
                s.metrics.first_scheduled_time = s.metrics.first_scheduled_time or t
            logits = self.runner.forward([x for _, x in step])
            sampled = [s for s, x in step if x.sample]
            tokens = sample(logits, [s.params for s in sampled], [s.generator for s in sampled])
            t = time.perf_counter()
            for s, x in step:
                s.num_computed += len(x.token_ids)
            for s, tok in zip(sampled, tokens, strict=True):
                s.output_ids.append(tok)
                s.metrics.first_token_time = s.metrics.first_token_time or t
                if tok in s.stop_ids:
                    s.finish_reason = FinishReason.STOP
                elif len(s.output_ids) >= s.max_tokens:
                    s.finish_reason = FinishReason.LENGTH
                if s.finish_reason is not None:
                    s.metrics.finish_time = t
                    pool.free(s.blocks)
                    s.blocks = []
            running = [s for s in running if s.finish_reason is None]

    def _output(self, s: _Sequence) -> RequestOutput:
        shown = s.output_ids[:-1] if s.finish_reason == FinishReason.STOP else s.output_ids
        return RequestOutput(
            request_id=s.request_id,
            prompt_token_ids=s.prompt_ids,
            token_ids=list(s.output_ids),
            text=self.tokenizer.decode(shown, skip_special_tokens=True),
            finished=True,
            finish_reason=s.finish_reason,
            num_cached_tokens=0,
            metrics=s.metrics,
        )
