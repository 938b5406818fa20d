"""Flattens one step's sequences into tensors (ids, positions, slot mapping, block tables), runs the model."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from warmpath.kernels.native import NativeDecoder
from warmpath.models.attention import AttentionMetadata, PrefillSpan
from warmpath.models.llama import LlamaForCausalLM


@dataclass
class SeqInput:
    """One sequence's share of a step."""

    token_ids: list[int]  # the new tokens computed this step (a prompt chunk, or the last sampled token)
    num_computed: int  # tokens of this sequence already in the KV cache
    block_table: list[int]  # its blocks, in order; must cover num_computed + len(token_ids) tokens
    sample: bool = True  # want logits for the last new token (False for a non-final prefill chunk)


@dataclass
class StepInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_rows: torch.Tensor


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, kv_cache: torch.Tensor, block_size: int,
                 native: NativeDecoder | None = None):
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.device = kv_cache.device
        self.native = native  # when set, computes the step's sequences that native.takes() picks

    def _slots(self, block_table: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return block_table[positions // self.block_size] * self.block_size + positions % self.block_size

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
                if s.num_computed:  # bottom-right causal: new token j sees context up to num_computed + j
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
        """fp32 logits [number of seqs with sample=True, vocab], in the order of seqs."""
        native = self.native
        short = [s for s in seqs if native.takes(len(s.token_ids), s.num_computed)] if native is not None else []
        if not short:
            return self._torch_forward(seqs)
        # Sequences are independent (each attends only to its own blocks): decodes, a few new tokens over a
        # warm prefix and short prompts (every sequence, with int8 activations) go through the native kernel,
        # prompt chunks over long contexts through torch, and the logits are put back in order.
        for s in short:
            self._check(s)
        logits = native.forward([s.token_ids for s in short], [s.num_computed for s in short],
                                [s.block_table for s in short])
        long = [s for s in seqs if not native.takes(len(s.token_ids), s.num_computed)]
        from_native = iter(logits)
        from_torch = iter(self._torch_forward(long) if long else ())
        rows = []
        for s in seqs:
            if native.takes(len(s.token_ids), s.num_computed):
                row = next(from_native)
            else:
                row = next(from_torch) if s.sample else None
            if s.sample:
                rows.append(row)
        return torch.stack(rows) if rows else logits[:0]

    def _torch_forward(self, seqs: list[SeqInput]) -> torch.Tensor:
        x = self.prepare(seqs)
        return self.model(x.input_ids, x.positions, x.meta, self.kv_cache, x.logits_rows)
