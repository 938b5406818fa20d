"""The `draft` proposer: a second, smaller model with the same tokenizer guesses each request's next
k tokens greedily. One batched forward per guessed position over every guessing request, in the
draft's own paged KV cache (its own blocks, freed with the request).

The draft's cache holds K/V for the tokens it was fed: the request's real tokens, then its own
guesses. Before the next proposal, the part that still agrees with the request (its real tokens, and
the guesses the target kept) stays; the rest is fed again. So a rejected guess's K/V is never read,
and nothing needs rolling back. The draft runs on the native kernel (int8 activations) where it
builds; what one guess costs is measured, and the speculator guesses only as far as that pays
(speculative.choose_drafts).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from warmpath.engine.plan import single
from warmpath.engine.request import Request
from warmpath.engine.runner import ModelRunner, SeqInput
from warmpath.kernels.build import NativeKernelError
from warmpath.kernels.native import NativeForward
from warmpath.models.kv_cache import allocate_kv_cache
from warmpath.models.llama import LlamaForCausalLM
from warmpath.models.loader import load_checkpoint
from warmpath.stats import MovingAverage

log = logging.getLogger(__name__)

# The draft sees a request's last WINDOW tokens when it starts guessing for it, not its whole
# prompt: a 2,000-token agent prompt would cost the draft a prefill longer than the decode it
# shortens. Local context guesses code well.
WINDOW = 128


@dataclass
class DraftState:
    """One request in the draft's cache."""

    # the request's first token in the draft's cache (its context: WINDOW tokens at most at first)
    start: int = 0
    blocks: list[int] = field(default_factory=list)
    # the token ids whose K/V the draft's cache holds, in order
    fed: list[int] = field(default_factory=list)
    # how many of `fed` were the request's own tokens (the rest: guesses) when last fed
    real: int = 0


class DraftProposer:
    def __init__(self, model: str, vocab_size: int, num_blocks: int = 1024, block_size: int = 16):
        ckpt = load_checkpoint(model, torch.float32)
        if ckpt.config.vocab_size != vocab_size:
            raise ValueError(
                f"the draft model {model!r} has {ckpt.config.vocab_size} tokens, the model "
                f"{vocab_size}: a draft must share the model's tokenizer")
        self.runner = _draft_runner(ckpt, num_blocks, block_size)
        self.block_size, self.max_len = block_size, ckpt.config.max_position_embeddings
        self.free = list(range(num_blocks))
        self.states: dict[str, DraftState] = {}
        # one batched guess (a draft forward), as measured: what a guess costs
        self._guess_time = MovingAverage()


    @property
    def guess_seconds(self) -> float | None:
        return self._guess_time.value

    def propose(self, requests: list[Request], ks: list[int],
                running: list[Request]) -> list[list[int]]:
        """Up to ks[i] greedy guesses for requests[i] (fewer when the draft's pool or context has no
        room)."""
        alive = {r.request_id for r in running}
        for rid in [rid for rid in self.states if rid not in alive]:  # finished, aborted, preempted
            self.forget(rid)
        guesses: list[list[int]] = [[] for _ in requests]
        seqs, who = [], []
        for i, (r, k) in enumerate(zip(requests, ks, strict=True)):
            if k <= 0:
                continue
            st = self.states.setdefault(r.request_id, DraftState(max(0, r.num_tokens - WINDOW)))
            tokens = r.all_token_ids[st.start:]
            if len(tokens) + k > self.max_len or not self._room(st, len(tokens) + k - 1):
                continue
            valid = st.real + _agree(st.fed[st.real:], tokens[st.real:])
            valid = min(valid, len(tokens) - 1)  # the last token is fed to get the first guess
            st.fed, st.real = tokens[:valid], len(tokens)
            seqs.append(SeqInput(tokens[valid:], valid, st.blocks))
            who.append(i)
        while seqs:
            t = time.perf_counter()
            with torch.inference_mode():
                picked = self.runner.forward(seqs).argmax(-1).tolist()
            took = time.perf_counter() - t
            if all(len(x.token_ids) == 1 for x in seqs):
                # a guess (a request's first feed computes its prompt)
                self._guess_time.add(took)
            nxt, nxt_who = [], []
            for s, i, tok in zip(seqs, who, picked, strict=True):
                st = self.states[requests[i].request_id]
                st.fed += s.token_ids
                guesses[i].append(tok)
                if len(guesses[i]) < ks[i]:
                    nxt.append(SeqInput([tok], s.num_computed + len(s.token_ids), st.blocks))
                    nxt_who.append(i)
            seqs, who = nxt, nxt_who
        return guesses

    def _room(self, st: DraftState, tokens: int) -> bool:
        """Blocks for `tokens` tokens of the request, taken from the draft's pool; False if it has
        too few."""
        need = -(-tokens // self.block_size) - len(st.blocks)
        if need > len(self.free):
            return False
        for _ in range(max(0, need)):
            st.blocks.append(self.free.pop())
        return True

    def forget(self, request_id: str) -> None:
        st = self.states.pop(request_id, None)
        if st is not None:
            self.free += st.blocks


def _draft_runner(ckpt, num_blocks: int, block_size: int) -> ModelRunner:
    """The draft's forward: the native kernel with int8 activations over a bf16 cache where it runs
    (a guess must cost a small part of the model's own decode step, or drafting cannot pay), else
    torch in fp32."""
    try:
        kv = allocate_kv_cache(ckpt.config, num_blocks, block_size, torch.bfloat16, "cpu")
        native = NativeForward(ckpt.config, ckpt.weights, ckpt.quantized, kv, block_size,
                               activations="int8", source=ckpt.source)
        return ModelRunner(None, kv, block_size, native, plan=single("native-int8"))
    except NativeKernelError as e:
        log.warning("the draft model runs in torch (slower): %s", e)
    net = LlamaForCausalLM.from_weights(ckpt.config, ckpt.weights, torch.float32, "cpu")
    return ModelRunner(net,
                       allocate_kv_cache(ckpt.config, num_blocks, block_size, torch.float32, "cpu"),
                       block_size)


def _agree(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
