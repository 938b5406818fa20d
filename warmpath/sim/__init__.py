"""`warmpath simulate`: capacity questions answered in seconds, by driving the engine's own
Scheduler and BlockPool (and the router's own policies for fleets) with a cost model instead of a
model."""

from warmpath.sim.command import add_arguments, chunk_tokenizer, run, simulate, tokenizer_for

__all__ = ["add_arguments", "chunk_tokenizer", "run", "simulate", "tokenizer_for"]
