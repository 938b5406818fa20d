r"""What `warmpath lsp` adds to a completion's latency (issue 32): keystroke to item through the
language server (a real LSP client over stdio, pygls' LanguageClient, debounce off) vs the same
request sent straight to the server over HTTP (the same body, streamed the same way, under a session
of its own as the language server's is), on one `warmpath serve`, alternating which goes first at
each keystroke so both see the same warm prefix cache.

    python benchmarks/lsp_overhead.py --model qwen2.5-coder-0.5b [--keys 60] \
        [--out benchmarks/results/...]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import httpx
from lsprotocol import types
from pygls.lsp.client import LanguageClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).parent))

from common import machine, write_json  # noqa: E402
from first_start import free_port  # noqa: E402
from server_compare import WARMPATH, serve  # noqa: E402

from warmpath.client.completion import RequestRecord, Target, monotonic_clock, stream_completion  # noqa: E402
from warmpath.client.lsp import Settings  # noqa: E402
from warmpath.models.registry import resolve_model  # noqa: E402

URI = "file:///bench/fib.py"
HEAD = "import functools\n\n\n@functools.cache\ndef fib(n):\n    if n < 2:\n        return n\n"
TYPED = ("    return fib(n - 1) + fib(n - 2)\n\n\ndef lucas(n):\n    if n < 2:\n"
         "        return 2 - n\n"
         "    return lucas(n - 1) + lucas(n - 2)\n")
SUFFIX = "\n\nprint(fib(30), lucas(30))\n"
MAX_TOKENS = 16


def end_of(text: str) -> types.Position:
    return types.Position(text.count("\n"), len(text.rsplit("\n", 1)[-1]))


async def measure(url: str, keys: int) -> dict:
    client = LanguageClient("lsp-overhead", "1")
    await client.start_io(sys.executable, "-m", "warmpath.cli", "--log-level", "WARNING", "lsp",
                          "--url", url, "--max-tokens", str(MAX_TOKENS))
    await client.initialize_async(types.InitializeParams(capabilities=types.ClientCapabilities(),
                                                         initialization_options={"debounceMs": 0}))
    client.initialized(types.InitializedParams())
    text = HEAD + SUFFIX
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        types.TextDocumentItem(uri=URI, language_id="python", version=1, text=text)))
    lsp_ms, http_ms, clock = [], [], monotonic_clock()
    async with httpx.AsyncClient(timeout=60) as http:

        async def via_lsp(typed: str):
            t = time.perf_counter()
            await client.text_document_inline_completion_async(
                types.InlineCompletionParams(
                    text_document=types.TextDocumentIdentifier(URI), position=end_of(HEAD + typed),
                    context=types.InlineCompletionContext(
                        trigger_kind=types.InlineCompletionTriggerKind.Automatic)))
            lsp_ms.append((time.perf_counter() - t) * 1000)

        async def via_http(typed: str):  # the request the language server sends, from here
            t = time.perf_counter()
            body = {
                "prompt": HEAD + typed, "suffix": SUFFIX, "max_tokens": MAX_TOKENS,
                "temperature": 0.0
            }
            await stream_completion(http, Target(url), body, RequestRecord("direct", "editor", 0.0),
                                    clock, total_deadline_s=Settings().deadline_ms / 1000,
                                    session="direct")
            http_ms.append((time.perf_counter() - t) * 1000)

        for k in range(keys):
            typed = TYPED[:k + 1]
            at = end_of(HEAD + typed[:-1])
            client.text_document_did_change(
                types.DidChangeTextDocumentParams(
                    types.VersionedTextDocumentIdentifier(uri=URI, version=k + 2), [
                        types.TextDocumentContentChangePartial(range=types.Range(at, at),
                                                               text=typed[-1])
                    ]))
            for run in ((via_lsp, via_http) if k % 2 == 0 else (via_http, via_lsp)):
                await run(typed)
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    return {
        "lsp_ms": lsp_ms, "http_ms": http_ms, "lsp_p50_ms": statistics.median(lsp_ms),
        "http_p50_ms": statistics.median(http_ms),
        "overhead_p50_ms": statistics.median(a - b for a, b in zip(lsp_ms, http_ms, strict=True))
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--keys", type=int, default=60)
    ap.add_argument("--out")
    args = ap.parse_args()
    model, port = str(resolve_model(args.model)), free_port()
    url = f"http://127.0.0.1:{port}"
    proc = serve([WARMPATH, "serve", "--model", model, "--port", str(port)], url)
    try:
        result = asyncio.run(measure(url, min(args.keys, len(TYPED))))
    finally:
        proc.terminate()
        proc.wait(60)
    print(
        f"keystroke to item, p50: through warmpath lsp {result['lsp_p50_ms']:.1f} ms, direct HTTP "
        f"{result['http_p50_ms']:.1f} ms; overhead p50 {result['overhead_p50_ms']:.1f} ms "
        f"({len(result['lsp_ms'])} keystrokes, {Path(model).name})")
    if args.out:
        write_json(args.out, {"machine": machine(), "model": Path(model).name, **result})


if __name__ == "__main__":
    main()
