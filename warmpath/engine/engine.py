"""Engine: add_request / abort / step / stats on one device. Each step: the scheduler plans, the
runner computes, the sampler picks, the scheduler advances; outputs are reported as deltas."""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable

import torch

from warmpath.config import EngineConfig
from warmpath.engine import heap
from warmpath.engine.backends import build, load_dtype
from warmpath.engine.block_pool import BlockPool
from warmpath.engine.healing import Healer
from warmpath.engine.kv_offload import KVOffload, tier_key
from warmpath.engine.kv_tier import DiskTier
from warmpath.engine.plan import BackendPlan
from warmpath.engine.plan_timing import prompt_speed
from warmpath.engine.request import (
    EngineRequest,
    FinishReason,
    PromptTooLongError,
    Request,
    RequestMetrics,
    RequestOutput,
)
from warmpath.engine.runner import ModelRunner, SeqInput
from warmpath.engine.sampler import make_generator, sample, token_logprobs
from warmpath.engine.scheduler import Scheduler, StepBatch
from warmpath.engine.speculator import Speculator
from warmpath.engine.step_cost import StepCost
from warmpath.kernels.build import start_building
from warmpath.models.footprint import parse_bytes
from warmpath.models.kv_cache import allocate_kv_cache, num_kv_blocks
from warmpath.models.llama import LlamaForCausalLM
from warmpath.models.loader import load_checkpoint
from warmpath.models.tokenizer import Tokenizer

log = logging.getLogger(__name__)
PROMPT_CHUNK = 64  # tokens of the prompt chunk timed at startup (Engine._time_prompt_chunk)


def _half_copies(model: LlamaForCausalLM) -> list[torch.Tensor]:
    return [t for m in (model, *model.layers) for t in (m.half or {}).values()]


class Engine:
    def __init__(self, config: EngineConfig, clock: Callable[[], float] = time.monotonic):
        self.config = config
        threads = config.num_threads or os.cpu_count() or 1
        torch.set_num_threads(threads)
        if config.device == "cpu":
            start_building()  # the kernel compiles (first start) while the checkpoint loads
        ckpt = load_checkpoint(config.model, load_dtype(config))
        self.source = ckpt.source
        self.model_config = ckpt.config
        self.tokenizer: Tokenizer = ckpt.tokenizer
        self.tensor_types = ckpt.tensor_types  # the file's quant mix (empty for an HF directory)
        backends = build(config, ckpt, threads)
        self.plan: BackendPlan = backends.plan
        self.dtype, self.kv_dtype = backends.dtype, backends.kv_dtype
        model, native = backends.model, backends.native
        if config.gemv_dtype != "none":  # float16 or bfloat16: the config allows no other
            if model is None or self.dtype != torch.float32:
                raise ValueError(f"gemv_dtype {config.gemv_dtype} needs a float32 torch model; got "
                                 f"{self.dtype if model is not None else 'no torch model'}")
            model.keep_half_width_copies(getattr(torch, config.gemv_dtype))
        ctx = self.model_config.max_position_embeddings
        self.max_model_len = min(config.max_model_len or ctx, ctx)
        # config.KV_ELEMENT_BYTES' names
        self.kv_dtype_name = str(self.kv_dtype).removeprefix("torch.")
        del ckpt  # the kernel keeps its own copies of what it reads
        heap.trim()  # the checkpoint's fp32 tensors: gone, but glibc keeps their pages otherwise
        self.weight_bytes = (0 if native is None else native.weight_bytes) + (
            0 if model is None else sum(t.numel() * t.element_size()
                                        for t in [*model.parameters(), *_half_copies(model)]))
        blocks = num_kv_blocks(config, self.model_config, self.kv_dtype, self.weight_bytes)
        # The prefix-cache key names the model: blocks of different models never match.
        self.pool = BlockPool(blocks, config.block_size, config.enable_prefix_caching,
                              config.model.encode())
        # the pool's size, fixed: check() reads it from any thread
        self.kv_tokens = blocks * config.block_size
        kv = allocate_kv_cache(self.model_config, blocks, config.block_size, self.kv_dtype,
                               config.device)
        if native is not None:
            native.attach_kv_cache(kv)
        self.runner = ModelRunner(model, kv, config.block_size, native, config.gemv_max_rows,
                                  config.num_decode_threads, self.plan, config.thread_tuning)
        route = f"{' + '.join(self.plan.backends)}, {self.kv_dtype_name} KV, {config.device}"
        # What a step costs, from a prompt chunk timed now (its first step) on: fed by every step
        # (step()).
        self.cost = StepCost.measured(prompt_speed(self.plan, route, self._time_prompt_chunk),
                                      PROMPT_CHUNK)
        self.tier: KVOffload | None = None
        if config.kv_offload_dir:
            gemv = [] if config.gemv_dtype == "none" else [f"gemv {config.gemv_dtype}"]
            computed_by = self.plan.backends + gemv  # what a block's numbers depend on
            key = tier_key(self.source, computed_by, self.kv_dtype, config.block_size,
                           self.model_config)
            disk = DiskTier(config.kv_offload_dir, key, parse_bytes(config.kv_offload_bytes),
                            parse_bytes(config.kv_offload_queue_bytes))
            self.tier = KVOffload(disk, kv)
            self.pool.on_cached = self.tier.save
        self.scheduler = Scheduler(config.scheduler, self.pool, self.cost, self.tier, clock)
        log.info(
            "memory: %.0f MB of weights, %.0f MB of KV cache (%d blocks, %s; %.1f warm 4k-token "
            "sessions)",
            self.weight_bytes / 1e6,
            kv.numel() * kv.element_size() / 1e6, blocks, self.kv_dtype_name,
            blocks * config.block_size / 4096)
        self.speculator = None if config.speculative_method == "none" else \
            Speculator(config, self.max_model_len, self.model_config.vocab_size)
        self.requests: dict[str, Request] = {}
        self._finished_unreported: list[Request] = []
        self.num_steps = 0
        self.heap = heap.HeapTrimmer()  # called by the step loop when it has nothing to do

    def _time_prompt_chunk(self) -> float:
        """Seconds per token of a PROMPT_CHUNK-token prompt chunk, timed on free blocks (the best of
        three tries: the first allocates): the scheduler's first measured step, so the chunk a paced
        step holds and the FIM suffix a prompt keeps (api/fim.suffix_budget) are known before the
        first request."""
        tokens = min(PROMPT_CHUNK, (self.pool.num_blocks - 1) * self.pool.block_size)
        blocks = self.pool.allocate(-(-tokens // self.pool.block_size))
        seq = SeqInput([1 + i % 100 for i in range(tokens)], 0, blocks)
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            self.runner.forward([seq])
            if self.config.device != "cpu":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t)
        self.pool.free(blocks)
        return best / tokens

    def close(self) -> None:
        """Finish what is being written to the KV tier (a restart then finds every block)."""
        if self.tier is not None:
            self.tier.close()

    @property
    def model(self) -> LlamaForCausalLM:
        return self.runner.model

    # -- requests ----------------------------------------------------------------------------------
    def add_request(self, request: EngineRequest) -> None:
        """Queue a request; it joins the batch at the next step. ValueError / PromptTooLongError for
        one that can never run (check())."""
        self.check(request)
        self.enqueue(request)

    def check(self, request: EngineRequest) -> None:
        """Raise ValueError / PromptTooLongError for a request that can never run: the one
        validation of a request (add_request here, AsyncEngine.submit in the event loop). Changes
        nothing and reads no state a step changes, so any thread may call it."""
        ids, params = request.prompt_token_ids, request.params
        if not ids:
            raise ValueError("empty prompt")
        vocab = self.model_config.vocab_size
        if any(not isinstance(t, int) or not 0 <= t < vocab for t in ids):
            raise ValueError(f"prompt_token_ids must be ints in [0, {vocab})")
        if params.heal and not len(self.healer.allowed(params.heal.encode()[:1])):
            raise ValueError("token healing needs a byte-level BPE vocabulary")
        n = len(ids)
        if n >= self.max_model_len:
            raise PromptTooLongError(
                f"prompt of {n} tokens leaves no room to generate within max_model_len "
                f"{self.max_model_len}"
            )
        if -(-(n + 1) // self.config.block_size) * self.config.block_size > self.kv_tokens:
            raise PromptTooLongError(
                f"prompt of {n} tokens does not fit the KV pool ({self.kv_tokens} tokens)")

    def enqueue(self, request: EngineRequest) -> None:
        """Queue a request check() passed already (AsyncEngine.submit checks it in the caller's
        thread)."""
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        ids, params = list(request.prompt_token_ids), request.params
        stop = frozenset(params.stop_token_ids)
        if not params.ignore_eos:
            stop |= self.tokenizer.stop_token_ids
        req = Request(
            request_id=request.request_id,
            prompt_token_ids=ids,
            params=params,
            stop_token_ids=stop,
            max_tokens=min(params.max_tokens, self.max_model_len - len(ids)),
            generator=make_generator(params, self.config.seed, self.config.device),
            metrics=RequestMetrics(arrival_time=time.perf_counter()),
            session_id=request.session_id,
            deadline=request.deadline,
            cache_salt=request.cache_salt,
            prompt_deadline=request.prompt_deadline,
            tenant=request.tenant,
            short=request.short,
            heal_left=params.heal.encode(),
        )
        self.requests[request.request_id] = req
        self.scheduler.add(req)

    def abort(self, request_id: str) -> bool:
        """Finish a request in any state, its blocks back to the pool now; False if it is not."""
        req = self.requests.get(request_id)
        if req is None or req.finished:
            return False
        self.scheduler.abort(req)
        self._finished_unreported.append(req)
        return True

    def warm_up(self, r: EngineRequest, keystroke: bool = True) -> None:
        """A prompt computed at the lowest priority for its session's next request (Scheduler.
        warm_up): a keystroke refused unrun (its session counted as quick if its prompt was nearly
        all cached), or a client's own warm-up (/infill's n_predict 0: no keystroke)."""
        if keystroke:
            self.scheduler.note_arrival(r.session_id, r.prompt_token_ids, r.cache_salt)
        self.scheduler.warm_up(r.request_id, r.prompt_token_ids, r.session_id, r.cache_salt,
                               r.tenant)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._finished_unreported)

    # -- one step ----------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        start = time.perf_counter()
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running_requests(), self.scheduler.num_waiting
                                    > 0)
        batch = self.scheduler.schedule()
        finished = self._finished_unreported + batch.finished
        self._finished_unreported = []
        progressed = []
        if batch.chunks:
            t = time.perf_counter()
            for c in batch.chunks:
                c.request.metrics.first_scheduled_time = c.request.metrics.first_scheduled_time or t
            sampling = [c for c in batch.chunks if c.sample]
            try:
                seqs = self._inputs(batch)
                logits = self.runner.forward(seqs)
                if self.speculator and all(len(x.token_ids) == 1 for x in seqs):
                    # what such a step costs here
                    self.speculator.decode_times.record(len(seqs), time.perf_counter() - t)
                tokens, logprobs = self._sample(sampling, logits)
                # the step's whole time, once
                self.cost.record(batch.num_tokens, time.perf_counter() - start)
            except Exception as e:
                # fail this step's requests, not the engine: the others keep running
                log.exception("step failed; finishing its %d requests with an error",
                              len(batch.chunks))
                for c in batch.chunks:
                    self.scheduler.finish(c.request, FinishReason.ERROR,
                                          f"internal error in the model step: {e!r}")
                    finished.append(c.request)
                self.num_steps += 1
                return self._report([], finished)
            before = [len(c.request.output_token_ids) for c in sampling]
            finished += self.scheduler.update(batch, tokens)
            for c, n, lps in zip(sampling, before, logprobs, strict=True):
                kept = len(c.request.output_token_ids) - n
                if lps is not None:
                    c.request.output_logprobs += lps[:kept]
            for c in batch.chunks:
                c.request.draft_token_ids = []
            progressed = [c.request for c in sampling if not c.request.finished]
            self.num_steps += 1
        return self._report(progressed, finished)

    def _inputs(self, batch: StepBatch) -> list[SeqInput]:
        """The step's sequences for the runner. A verified decode is its last token and its guesses
        as decode rows, one per position, each attending over the context before it: the numbers a
        plain decode of each of those tokens would compute (every backend writes a step's K/V before
        reading it), so a guess is kept exactly where the model without speculation would have
        produced it."""
        seqs = []
        for c in batch.chunks:
            req = c.request
            if c.num_drafts:
                seqs += [
                    SeqInput([t], req.num_computed_tokens + j, req.block_ids)
                    for j, t in enumerate(c.token_ids)
                ]
            else:
                seqs.append(SeqInput(c.token_ids, req.num_computed_tokens, req.block_ids, c.sample))
        return seqs

    @functools.cached_property
    def healer(self) -> Healer:
        # built at the first request that heals, or by the server at its start
        return Healer(self.tokenizer.token_bytes)

    def _sample(self, sampling: list,
                logits: torch.Tensor) -> tuple[list[list[int]], list[list | None]]:
        """Per sampling chunk: its tokens (one; or for a verified decode, each guess kept while it
        equals what is sampled at its position, then the sampled token that differs or follows: the
        model's own distribution, guess or not) and their logprobs when asked for."""
        rows, row = [], 0
        for c in sampling:
            rows.append(range(row, row + 1 + c.num_drafts))
            row += 1 + c.num_drafts
        plain = [i for i, c in enumerate(sampling) if not c.num_drafts]
        tokens: list[list[int]] = [[] for _ in sampling]
        if plain:
            # rows: a copy
            first, reqs = logits[[rows[i][0] for i in plain]], [sampling[i].request for i in plain]
            healing = any(r.heal_left for r in reqs) and self.healer
            if healing:
                healing.mask(first, reqs)
            picked = sample(first, [r.params for r in reqs], [r.generator for r in reqs])
            if healing:
                healing.spelled(reqs, picked)
            for i, tok in zip(plain, picked, strict=True):
                tokens[i] = [tok]
        for i, c in enumerate(sampling):
            if c.num_drafts:
                tokens[i] = self.speculator.verify(c.request, logits[rows[i].start:rows[i].stop],
                                                   c.token_ids[1:])
        logprobs = [None if c.request.params.logprobs is None else token_logprobs(
            logits[r.start : r.start + len(t)], [c.request.params] * len(t), t)
            for c, r, t in zip(sampling, rows, tokens, strict=True)]
        return tokens, logprobs

    def _report(self, progressed: list[Request], finished: list[Request]) -> list[RequestOutput]:
        progressed, finished = [r for r in progressed
                                if not r.warmup], [r for r in finished if not r.warmup]
        outputs = [self._output(r) for r in progressed] + [self._output(r) for r in finished]
        for r in finished:
            self.requests.pop(r.request_id, None)
            if self.speculator is not None:
                self.speculator.finished(r)
        return outputs

    def _output(self, req: Request) -> RequestOutput:
        new = req.output_token_ids[req.num_sent_tokens :]
        new_logprobs = (req.output_logprobs[req.num_sent_tokens:]
                        if req.params.logprobs is not None else None)
        req.num_sent_tokens = len(req.output_token_ids)
        text = ""
        if req.finished:
            shown = req.output_token_ids
            if req.finish_reason == FinishReason.STOP:
                shown = shown[:-1]  # the stop token itself is not text
            text = self.tokenizer.decode(shown, skip_special_tokens=True)
        return RequestOutput(
            request_id=req.request_id,
            prompt_token_ids=req.prompt_token_ids,
            token_ids=list(req.output_token_ids),
            new_token_ids=new,
            new_logprobs=new_logprobs,
            text=text,
            finished=req.finished,
            finish_reason=req.finish_reason,
            num_cached_tokens=max(req.num_cached_tokens, 0),
            metrics=req.metrics,
            error=req.error,
            num_tier_tokens=req.num_tier_tokens,
        )

    def stats(self) -> dict:
        s, pool, disk = self.scheduler.stats, self.pool, self.tier.disk if self.tier else None
        return {
            "prefix_cache_queried_tokens": s.prefix_cache_queried_tokens,
            "prefix_cache_hit_tokens": s.prefix_cache_hit_tokens,
            "prefix_cache_tier_hit_tokens": s.prefix_cache_tier_hit_tokens,
            "kv_tier_blocks": disk.num_blocks if disk else 0,
            "kv_tier_bytes": disk.num_bytes if disk else 0,
            "kv_tier_rejected": disk.stats.blocks_rejected if disk else 0,
            "kv_tier_write_errors": disk.stats.write_errors if disk else 0,
            "kv_tier_dropped": disk.stats.blocks_dropped if disk else 0,
            "kv_tier_evicted": disk.stats.blocks_evicted if disk else 0,
            "kv_tier_stale_keys_pruned": disk.root.stale_keys_pruned if disk else 0,
            "kv_tier_queued_bytes": disk.queued_bytes if disk else 0,
            "num_preemptions": s.num_preemptions,
            "num_aborted": s.num_aborted,
            "num_deadline_expired": s.num_deadline_expired,
            "num_computed_tokens": s.num_computed_tokens,
            "warm_up_tokens": self.scheduler.warm_up_tokens,
            "warm_ups_dropped_tenant": s.warm_ups_dropped_tenant,
            "warm_ups_dropped_total": s.warm_ups_dropped_total,
            "num_evictions": pool.num_evictions,
            "num_blocks": pool.num_blocks,
            "block_size": pool.block_size,
            "free_blocks": pool.num_free,
            "cached_blocks": len(pool.cached),
            "used_blocks": pool.num_used,
            "num_running": self.scheduler.num_running,
            "num_waiting": self.scheduler.num_waiting,
            "num_steps": self.num_steps,
            "heap_trims": self.heap.trims,
            "heap_released_bytes": self.heap.released_bytes,
            "spec_method": self.config.speculative_method,
            "spec_draft_tokens": self.speculator.proposed if self.speculator else 0,
            "spec_accepted_tokens": self.speculator.accepted if self.speculator else 0,
            "weight_bytes": self.weight_bytes,
            "kv_cache_bytes": self.runner.kv_cache.numel() * self.runner.kv_cache.element_size(),
        }
