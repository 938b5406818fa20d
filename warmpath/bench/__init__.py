"""`warmpath bench`: one trace of real-code traffic replayed against a target and, one after the
other on the same machine, each baseline; a table with the ratios, JSON, and a PNG."""

from warmpath.bench.command import add_arguments, run

__all__ = ["add_arguments", "run"]
