"""Runs one step: routes each sequence to a backend (route(): the one place that decides), flattens
the torch share into tensors (ids, positions, slot mapping, block tables), runs both, returns the
logits in order."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from warmpath.engine.plan import BackendPlan, single
from warmpath.engine.threads import ThreadChoice, sample
from warmpath.kernels.native import NativeForward
from warmpath.models.attention import AttentionMetadata, PrefillSpan
from warmpath.models.llama import LlamaForCausalLM


@dataclass
class SeqInput:
    """One sequence's share of a step."""

    # the new tokens computed this step (a prompt chunk, or the last sampled token)
    token_ids: list[int]
    num_computed: int  # tokens of this sequence already in the KV cache
    block_table: list[int]  # its blocks, in order; must cover num_computed + len(token_ids) tokens
    sample: bool = True  # want logits for the last new token (False for a non-final prefill chunk)


@dataclass
class StepRoute:
    """How one step runs: which backend computes each sequence, on which weights, with how many
    threads."""

    # indices of the sequences the native kernel computes
    native: list[int] = field(default_factory=list)
    torch: list[int] = field(default_factory=list)  # ... and those the torch model computes
    # torch's share on the half-width weight copies (EngineConfig.gemv_dtype)
    half_width: bool = False
    threads: int = 1
    # the thread count is ThreadChoice's (engine/threads.py): time the step for it
    measured: bool = False


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_rows: torch.Tensor


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM | None, kv_cache: torch.Tensor, block_size: int,
                 native: NativeForward | None = None, half_width_max_rows: int = 0,
                 decode_threads: int | None = None, plan: BackendPlan | None = None,
                 thread_tuning: bool = False):
        self.model = model  # None when the plan computes everything natively
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.device = kv_cache.device
        self.native = native  # computes the sequences route() sends it
        if plan is None and native is not None:
            raise ValueError(
                "a runner with the native kernel needs the plan that says what it computes")
        # which backend computes each shape (engine/plan.py); else torch
        self.plan = plan or single("torch-fp32")
        has_copies = model is not None and model.has_half_width_copies
        self.half_width_max_rows = half_width_max_rows if has_copies else 0
        self.threads = torch.get_num_threads()  # what prompt steps use; the count in force now
        self.all_threads = self.threads
        # decode-only steps (EngineConfig.num_decode_threads)
        self.decode_threads = decode_threads or self.threads
        # Native-only steps: the thread count measured as the engine runs
        # (EngineConfig.thread_tuning).
        tune = (thread_tuning and native is not None and decode_threads is None
                and self.all_threads > 1)
        self.tuner = ThreadChoice(self.all_threads) if tune else None

    def route(self, seqs: list[SeqInput]) -> StepRoute:
        """The one place that decides how a step runs."""
        route = StepRoute()
        decodes = sum(1 for s in seqs if len(s.token_ids) == 1)
        for i, s in enumerate(seqs):
            (route.native if self._native_computes(s, decodes) else route.torch).append(i)
        route.half_width = sum(len(seqs[i].token_ids)
                               for i in route.torch) <= self.half_width_max_rows
        decode_only = all(len(s.token_ids) == 1 for s in seqs)
        route.threads = self.decode_threads if decode_only else self.all_threads
        if self.tuner is not None and not route.torch:
            # the kernel's numbers do not depend on the thread count
            route.threads, route.measured = self.tuner.threads, True
        return route

    def _native_computes(self, s: SeqInput, decodes: int) -> bool:
        n = len(s.token_ids)
        chosen = self.plan.for_decode(decodes, s.num_computed +
                                      1) if n == 1 else self.plan.for_chunk(n, s.num_computed)
        return chosen.startswith("native")

    def _slots(self, block_table: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return block_table[positions //
                           self.block_size] * self.block_size + positions % self.block_size

    def _check(self, s: SeqInput) -> None:
        if not s.token_ids:
            raise ValueError("a scheduled sequence has no new tokens")
        ctx = s.num_computed + len(s.token_ids)
        if len(s.block_table) * self.block_size < ctx:
            raise ValueError(f"block table of {len(s.block_table)} blocks cannot hold {ctx} tokens")

    def prepare(self, seqs: list[SeqInput]) -> StepInputs:
        ids: list[int] = []
        positions: list[torch.Tensor] = []
        slots: list[torch.Tensor] = []
        prefills: list[PrefillSpan] = []
        logits_rows: list[int] = []
        dec_rows: list[int] = []
        dec_tables: list[torch.Tensor] = []
        dec_lens: list[int] = []
        row = 0
        for s in seqs:
            self._check(s)
            n = len(s.token_ids)
            ctx = s.num_computed + n
            table = torch.tensor(s.block_table, dtype=torch.long)
            pos = torch.arange(s.num_computed, ctx)
            ids.extend(s.token_ids)
            positions.append(pos)
            slots.append(self._slots(table, pos))
            if n == 1:
                dec_rows.append(row)
                dec_tables.append(table)
                dec_lens.append(ctx)
            else:
                mask = None
                if s.num_computed:
                    # bottom-right causal: new token j sees context up to num_computed + j
                    mask = (torch.arange(ctx)[None, :] <= pos[:, None]).to(self.device)
                kv_slots = self._slots(table, torch.arange(ctx)).to(self.device)
                prefills.append(PrefillSpan(row, row + n, kv_slots, mask))
            if s.sample:
                logits_rows.append(row + n - 1)
            row += n
        meta = AttentionMetadata(torch.cat(slots).to(self.device), prefills)
        if dec_rows:
            max_len = max(dec_lens)
            width = (max_len + self.block_size - 1) // self.block_size
            tables = torch.zeros(len(dec_rows), width, dtype=torch.long)
            for i, t in enumerate(dec_tables):
                tables[i, : min(len(t), width)] = t[:width]
            key_pos = torch.arange(max_len)
            meta.decode_rows = torch.tensor(dec_rows, device=self.device)
            meta.decode_slots = (
                tables[:, key_pos // self.block_size] * self.block_size + key_pos % self.block_size
            ).to(self.device)
            lens = torch.tensor(dec_lens)
            meta.decode_mask = (key_pos[None, :] < lens[:, None])[:, None, None, :].to(self.device)
        return StepInputs(
            input_ids=torch.tensor(ids, dtype=torch.long, device=self.device),
            positions=torch.cat(positions).to(self.device),
            meta=meta,
            logits_rows=torch.tensor(logits_rows, dtype=torch.long, device=self.device),
        )

    def forward(self, seqs: list[SeqInput]) -> torch.Tensor:
        """fp32 logits [number of seqs with sample=True, vocab], in the order of seqs. Sequences are
        independent (each attends only to its own blocks), so each backend computes its share and
        the rows are put back in order."""
        for s in seqs:
            self._check(s)
        route = self.route(seqs)
        if route.threads != self.threads:
            torch.set_num_threads(route.threads)
            self.threads = route.threads
        logits: dict[int, torch.Tensor] = {}
        if route.native:
            share = [seqs[i] for i in route.native]
            before = sample() if route.measured else None
            rows = self.native.forward([s.token_ids for s in share],
                                       [s.num_computed for s in share],
                                       [s.block_table for s in share])
            if before is not None:
                self.tuner.record(before, sample(), route.threads)
            logits.update(zip(route.native, rows, strict=True))
        if route.torch:
            sampled = [i for i in route.torch if seqs[i].sample]
            x = self.prepare([seqs[i] for i in route.torch])
            rows = self.model(x.input_ids, x.positions, x.meta, self.kv_cache, x.logits_rows,
                              route.half_width)
            logits.update(zip(sampled, rows, strict=True))
        wanted = [logits[i] for i, s in enumerate(seqs) if s.sample]
        if wanted:
            return torch.stack(wanted)
        return torch.empty(0,
                           self.native.vocab if self.model is None else self.model.cfg.vocab_size)
