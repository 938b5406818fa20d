"""`warmpath lsp`: a language server on stdio (pygls) that asks `warmpath serve` or `warmpath route`
for code completions, for editors that speak LSP: `textDocument/inlineCompletion` (LSP 3.18: Neovim
0.12's `vim.lsp.inline_completion`, Helix) and `textDocument/completion` (one item, the same text).

Documents are synced incrementally (pygls keeps them). At a request the text before and after the
cursor goes to /v1/completions as `prompt` and `suffix`, the other open documents (most recently
edited first) as repository context (`extra`), under a session of its own (X-Session-Id, so a router
keeps it on the node where its prefix is warm). A request first waits the debounce; a newer request
for the same document, or `$/cancelRequest`, cancels it, which closes its HTTP stream, so the server
aborts the decode at once. Past the deadline the answer is empty: silence, never an error. Where the
answer ends is the server's completion scope. Settings come from the command's flags, overridden by
the client's `initializationOptions` (`url`, `apiKey`, `model`, `maxTokens`, `debounceMs`,
`deadlineMs`, `contextFiles`, `contextSecrets`, `warm`, `warmAfterMs`). Open documents named like
secrets (`.env`, keys, tokens: secret_files.py) never go as context unless `contextSecrets` is true.

Warm before the first keystroke, as llama.vim and llama.vscode do: a document's prompt is sent as a
warm-up (/infill's `n_predict: 0`; the server computes it in its idle steps, never ahead of a
keystroke) when the document is opened (the cursor at the end of its first `prefix_chars`: LSP does
not say where it is) and once its edits pause for `warmAfterMs` (the cursor where the last edit
ended). A completion request for the document cancels its pending warm-up: it computes the same
prompt. LSP has no message for an editor's focus.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import httpx

from warmpath.client.completion import (
    DROPPED,
    ERROR,
    RequestRecord,
    Target,
    monotonic_clock,
    stream_completion,
)
from warmpath.client.secret_files import looks_secret
from warmpath.config import ClientConfig

if TYPE_CHECKING:
    # pygls and lsprotocol load when the server starts, not with every warmpath command
    from lsprotocol import types
    from pygls.lsp.server import LanguageServer

# initializationOptions keys (the editor's camelCase) -> (Settings field, the JSON types it takes)
TEXT, WHOLE, NUMBER, FLAG = (str, "a string"), (int, "an integer"), (int | float,
                                                                     "a number"), (bool,
                                                                                   "a boolean")
OPTIONS = {"url": ("url", TEXT), "apiKey": ("api_key", TEXT), "model": ("model", TEXT),
           "maxTokens": ("max_tokens", WHOLE), "debounceMs": ("debounce_ms", NUMBER),
           "deadlineMs": ("deadline_ms", NUMBER), "contextFiles": ("context_files", WHOLE),
           "contextSecrets": ("context_secrets", FLAG), "warm": ("warm", FLAG),
           "warmAfterMs": ("warm_after_ms", NUMBER)}


@dataclass(frozen=True)
class Settings:
    url: str = "http://127.0.0.1:8000"  # warmpath serve or warmpath route
    api_key: str | None = None
    model: str | None = None  # None: the server's own
    max_tokens: int = 128
    debounce_ms: float = ClientConfig.debounce_ms
    # the whole answer; forwarded so the server stops too
    deadline_ms: float = ClientConfig.max_time_ms
    context_files: int = 4  # other open documents sent as repository context
    # send documents named like secrets (secret_files.py) as context too
    context_secrets: bool = False
    prefix_chars: int = 8000
    suffix_chars: int = 2000
    context_chars: int = 4000  # of each other document
    warm: bool = True  # warm a document's prompt when it opens and when its edits pause
    warm_after_ms: float = 1000.0  # the pause after a burst of edits

    def updated(self, options: object) -> Settings:
        """These settings with the client's initializationOptions over them (unknown keys are
        ignored)."""
        if not isinstance(options, dict):
            return self
        given = {}
        for key, value in options.items():
            if key not in OPTIONS or value is None:
                continue
            name, (kind, words) = OPTIONS[key]
            if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
                # true is no 1
                raise ValueError(f"initializationOptions.{key} must be {words}, got {value!r}")
            given[name] = value
        return replace(self, **given)


class Completer:
    """What the server does for a request: the prompt around the cursor, one in-flight request per
    document, the HTTP call. Its clients are the LSP handlers below."""

    def __init__(self, settings: Settings):
        self.settings = settings
        # uri -> when last opened or edited (the context's order)
        self.edited: dict[str, float] = {}
        self.inflight: dict[str, asyncio.Task] = {}  # uri -> the request now waiting or streaming
        self.warming: dict[str, asyncio.Task] = {}  # uri -> its warm-up, waiting or sent
        self.session = f"lsp-{os.getpid()}"
        self.clock = monotonic_clock()
        self.http: httpx.AsyncClient | None = None

    def touch(self, uri: str) -> None:
        self.edited[uri] = time.monotonic()

    def forget(self, uri: str) -> None:
        self.edited.pop(uri, None)
        self._stop_warming(uri)

    def _stop_warming(self, uri: str) -> None:
        task = self.warming.pop(uri, None)
        if task is not None:
            task.cancel()

    def warm(self, ls: LanguageServer, uri: str, cursor: int, after_s: float = 0.0) -> None:
        """Send the prompt at `cursor` as a warm-up after `after_s`, unless a newer one for the
        document or a completion request comes first."""
        if not self.settings.warm:
            return
        self._stop_warming(uri)
        self.warming[uri] = asyncio.ensure_future(self._warm(ls, uri, cursor, after_s))

    async def _warm(self, ls: LanguageServer, uri: str, cursor: int, after_s: float) -> None:
        await asyncio.sleep(after_s)
        del self.warming[uri]  # sent: the server's newer request of the session ends it there
        s, body = self.settings, self.body(ls, uri, cursor)
        # llama.cpp's warm-up, /infill's n_predict 0 (OpenAI's completions take no max_tokens 0):
        # the same text as the completion's body makes the same prompt
        warm_up = {"input_prefix": body["prompt"], "input_suffix": body["suffix"], "prompt": "",
                   "input_extra": body.get("extra", []), "n_predict": 0, "cache_prompt": True}
        if s.model:
            warm_up["model"] = s.model
        target = Target(s.url, s.model, s.api_key)
        try:
            await (await self._http()).post(
                f"{target.root}/infill", json=warm_up,
                headers={**target.headers(), "X-Session-Id": self.session}, timeout=10.0)
        except httpx.HTTPError:
            pass  # a warm-up that fails costs the next keystroke its cache, nothing more

    def body(self, ls: LanguageServer, uri: str, cursor: int) -> dict:
        """The request's prompt at `cursor`: the text around it, the other open documents."""
        s, source = self.settings, ls.workspace.get_text_document(uri).source
        body = {
            "prompt": source[max(0, cursor - s.prefix_chars):cursor],
            "suffix": source[cursor:cursor + s.suffix_chars], "max_tokens": s.max_tokens,
            "temperature": 0.0
        }
        extra = self.context(ls, uri)
        if extra:
            body["extra"] = extra
        return body

    def context(self, ls: LanguageServer, uri: str) -> list[dict]:
        s = self.settings
        others = sorted(
            (u for u in self.edited if u != uri and (s.context_secrets or not looks_secret(u))),
            key=self.edited.get, reverse=True)[:s.context_files]
        files = []
        for other in others:
            doc = ls.workspace.get_text_document(other)
            if doc.source:  # an empty one is no context
                files.append({"filename": doc.path or other,
                              "text": doc.source[:s.context_chars]})
        return files

    async def complete(self, ls: LanguageServer, uri: str, position: types.Position) -> str:
        """The completion at `position`, "" when there is none in time. A newer request for the same
        document cancels this one (asyncio.CancelledError out of here, its stream closed)."""
        previous = self.inflight.get(uri)
        if previous is not None and not previous.done():
            previous.cancel()
        self._stop_warming(uri)
        task = asyncio.current_task()
        self.inflight[uri] = task
        try:
            await asyncio.sleep(self.settings.debounce_ms / 1000)
            s = self.settings
            body = self.body(ls, uri,
                             ls.workspace.get_text_document(uri).offset_at_position(position))
            rec = RequestRecord(self.session, "editor", self.clock(),
                                prompt_chars=len(body["prompt"]))
            await stream_completion(await self._http(), Target(s.url, s.model,
                                                               s.api_key), body, rec, self.clock,
                                    total_deadline_s=s.deadline_ms / 1000, session=self.session)
        finally:
            if self.inflight.get(uri) is task:
                del self.inflight[uri]
        if rec.outcome == ERROR:
            from lsprotocol import types

            ls.window_log_message(
                types.LogMessageParams(types.MessageType.Warning, f"warmpath: {rec.error}"))
            return ""
        if rec.outcome == DROPPED or rec.finish_reason in ("deadline", "overloaded",
                                                           "client_deadline"):
            return ""  # late: silence
        return rec.text

    async def _http(self) -> httpx.AsyncClient:
        if self.http is None:
            self.http = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=5.0))
        return self.http

    async def close(self) -> None:
        for task in (*self.inflight.values(), *self.warming.values()):
            task.cancel()
        if self.http is not None:
            await self.http.aclose()


def create_server(settings: Settings) -> LanguageServer:
    from lsprotocol import types
    from pygls.lsp.server import LanguageServer

    server = LanguageServer("warmpath-lsp", "0.1.0",
                            text_document_sync_kind=types.TextDocumentSyncKind.Incremental)
    completer = Completer(settings)
    server.completer = completer  # for tests and embedding

    @server.feature(types.INITIALIZE)
    def initialize(ls: LanguageServer, params: types.InitializeParams) -> None:
        completer.settings = completer.settings.updated(params.initialization_options)

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: LanguageServer, params: types.DidOpenTextDocumentParams) -> None:
        uri = params.text_document.uri
        completer.touch(uri)
        completer.warm(ls, uri, min(len(params.text_document.text),
                                    completer.settings.prefix_chars))

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: LanguageServer, params: types.DidChangeTextDocumentParams) -> None:
        uri = params.text_document.uri
        completer.touch(uri)
        last = params.content_changes[-1] if params.content_changes else None
        doc = ls.workspace.get_text_document(uri)
        # where the last edit ended: the developer's cursor (a whole-text change says nothing)
        cursor = len(doc.source) if last is None or not hasattr(last, "range") else \
            doc.offset_at_position(last.range.start) + len(last.text)
        completer.warm(ls, uri, min(cursor, len(doc.source)),
                       completer.settings.warm_after_ms / 1000)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: LanguageServer, params: types.DidCloseTextDocumentParams) -> None:
        completer.forget(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(ls: LanguageServer, params: types.InlineCompletionParams
                                ) -> types.InlineCompletionList:
        text = await completer.complete(ls, params.text_document.uri, params.position)
        here = types.Range(params.position, params.position)
        return types.InlineCompletionList(
            items=[types.InlineCompletionItem(insert_text=text, range=here)] if text else [])

    @server.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions())
    async def completion(ls: LanguageServer,
                         params: types.CompletionParams) -> types.CompletionList:
        text = await completer.complete(ls, params.text_document.uri, params.position)
        here = types.Range(params.position, params.position)
        items = [
            types.CompletionItem(label=text.strip().split("\n", 1)[0][:80] or text,
                                 detail="warmpath", kind=types.CompletionItemKind.Text,
                                 text_edit=types.TextEdit(here, text))
        ] if text.strip() else []
        # asked again as the developer types
        return types.CompletionList(is_incomplete=True, items=items)

    @server.feature(types.SHUTDOWN)
    async def shutdown(ls: LanguageServer, params: None) -> None:
        await completer.close()

    return server


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = Settings()
    p.add_argument("--url", default=d.url, help="warmpath serve or warmpath route")
    p.add_argument("--api-key", default=d.api_key, help="sent as Authorization: Bearer")
    p.add_argument("--model", default=d.model,
                   help="the model name to send (default: the server's)")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens, help="the longest suggestion")
    p.add_argument("--debounce-ms", type=float, default=d.debounce_ms,
                   help="a request waits this long for the next keystroke")
    p.add_argument("--deadline-ms", type=float, default=d.deadline_ms,
                   help="the whole answer: later, the completion is empty (and the server stops)")
    p.add_argument("--context-files", type=int, default=d.context_files,
                   help="other open documents sent as repository context")
    p.add_argument("--no-warm", dest="warm", action="store_false",
                   help="send no warm-ups (a document's prompt when it opens and when edits pause)")
    p.add_argument("--warm-after-ms", type=float, default=d.warm_after_ms,
                   help="the pause after a burst of edits that sends a warm-up")
    p.add_argument(
        "--context-secrets", action="store_true",
        help="also send open documents named like secrets (.env, *.pem, id_*, *token*) as context")


def run(args: argparse.Namespace) -> int:
    settings = Settings(url=args.url, api_key=args.api_key, model=args.model,
                        max_tokens=args.max_tokens, debounce_ms=args.debounce_ms,
                        deadline_ms=args.deadline_ms, context_files=args.context_files,
                        context_secrets=args.context_secrets, warm=args.warm,
                        warm_after_ms=args.warm_after_ms)
    create_server(settings).start_io()
    return 0
