"""Speculative decoding in one engine (EngineConfig.speculative_method): before a step, guesses for
the decoding requests and how many of them the step verifies; after it, which guesses the model
kept. The proposers are in proposers.py; the engine computes a verified decode as decode rows
(engine.py `_inputs`)."""

from __future__ import annotations

import torch

from warmpath.config import EngineConfig
from warmpath.engine.draft import DraftProposer
from warmpath.engine.proposers import (
    NgramProposer,
    Speculation,
    StepTimes,
    SuffixProposer,
    choose_drafts,
)
from warmpath.engine.request import Request
from warmpath.engine.sampler import sample

PROPOSERS = {"ngram": NgramProposer, "suffix": SuffixProposer, "draft": DraftProposer}


class Speculator:
    def __init__(self, config: EngineConfig, max_model_len: int, vocab_size: int):
        if config.num_speculative_tokens < 1 or config.speculative_max_seqs < 1:
            raise ValueError("num_speculative_tokens and speculative_max_seqs must be >= 1")
        if config.speculative_method == "draft":
            if not config.speculative_draft_model:
                raise ValueError("speculative_method draft needs speculative_draft_model")
            self.proposer = DraftProposer(config.speculative_draft_model, vocab_size,
                                          config.speculative_draft_blocks, config.block_size)
        else:
            self.proposer = PROPOSERS[config.speculative_method]()
        self.max_tokens, self.max_seqs = config.num_speculative_tokens, config.speculative_max_seqs
        self.max_model_len = max_model_len
        self.decode_times = StepTimes(config.scheduler.max_num_seqs *
                                      (1 + config.num_speculative_tokens))
        self.proposed = self.accepted = 0  # guessed tokens verified, and kept

    def propose(self, running: list[Request], waiting: bool = False) -> None:
        """Guesses for the decoding requests: the proposer offers up to num_speculative_tokens each,
        choose_drafts keeps what this machine verifies faster than it decodes; none in a step with
        more decoding requests than speculative_max_seqs, and none while a prompt waits or is being
        computed (`waiting`: requests queued): a step carrying someone's prompt is their time to
        first token, and guesses would make it longer."""
        decoding = [r for r in running if r.decoding]
        if len(decoding) > self.max_seqs or waiting or len(decoding) < len(running):
            return
        ks = []
        for r in decoding:
            spec = r.speculation = r.speculation or Speculation(acceptance=self._prior())
            room = min(r.max_tokens - len(r.output_token_ids) - 1,
                       self.max_model_len - r.num_tokens)
            k = min(self.max_tokens, room)
            # healing: one constrained token
            ks.append(k if k > 0 and spec.wants() and not r.heal_left else 0)
            if not ks[-1] or isinstance(self.proposer, DraftProposer):
                continue
            if isinstance(self.proposer, SuffixProposer):
                r.draft_token_ids = self.proposer.propose(r.all_token_ids, spec, k, r.session_id)
            else:
                r.draft_token_ids = self.proposer.propose(r.all_token_ids, spec, k)
        if isinstance(self.proposer, DraftProposer):
            # one batched draft forward per guessed position
            if self.proposer.guess_seconds is not None:
                # guess only as far as it pays, the guessing counted
                ks = choose_drafts(len(decoding), [r.speculation.acceptance for r in decoding], ks,
                                   self.decode_times, self.proposer.guess_seconds)
            for r, guesses in zip(decoding, self.proposer.propose(decoding, ks, running),
                                  strict=True):
                r.draft_token_ids = guesses
        offered = [len(r.draft_token_ids) for r in decoding]
        if any(offered):
            taken = choose_drafts(len(decoding), [r.speculation.acceptance for r in decoding],
                                  offered, self.decode_times)
            for r, n in zip(decoding, taken, strict=True):
                r.draft_token_ids = r.draft_token_ids[:n]

    def _prior(self) -> float:
        """A new request's expected acceptance: 1 for a lookup (a guess costs nothing, so try); for
        a draft model (a guess costs a forward, and its first one a catch-up prefill) what its
        guesses have earned so far."""
        if isinstance(self.proposer, DraftProposer) and self.proposed:
            return self.accepted / self.proposed
        return 1.0

    def verify(self, req: Request, rows: torch.Tensor, drafts: list[int]) -> list[int]:
        """Sample position by position with the request's own generator (one draw per token kept, as
        without speculation); stop at the first guess the model did not sample. Greedy: the guesses
        that match the argmax, then the argmax."""
        out = []
        for j in range(len(drafts) + 1):
            tok = sample(rows[j : j + 1], [req.params], [req.generator])[0]
            out.append(tok)
            if j == len(drafts) or tok != drafts[j]:
                break
        req.speculation.record(len(drafts), len(out) - 1)
        self.proposed += len(drafts)
        self.accepted += len(out) - 1
        return out

    def finished(self, req: Request) -> None:
        """What the request's session saw, for its next requests (the suffix proposer)."""
        if isinstance(self.proposer, SuffixProposer):
            self.proposer.learn(req.session_id, req.all_token_ids)
        elif isinstance(self.proposer, DraftProposer):
            self.proposer.forget(req.request_id)
