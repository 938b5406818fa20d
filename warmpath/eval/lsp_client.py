"""The real-repository set through `warmpath lsp`: a real LSP client (pygls') starts the language
server on stdio, pointed at the target, opens each hole's buffer (and, for the cross-file slice with
context, the defining file, which the server sends along as another open document), asks
`textDocument/inlineCompletion` at the cursor and closes them again. What the item says is what the
editor inserts at the cursor."""

from __future__ import annotations

import sys

from warmpath.client.completion import Target
from warmpath.eval.holes import Hole


def _position(text: str, offset: int):
    from lsprotocol import types

    before = text[:offset]
    line = before.count("\n")
    col = before[before.rfind("\n") + 1:]
    return types.Position(line=line, character=len(col.encode("utf-16-le")) // 2)


class LspAsker:
    def __init__(self, target: Target, max_tokens: int = 128):
        self.target, self.max_tokens, self.client = target, max_tokens, None

    async def start(self) -> None:
        from lsprotocol import types
        from pygls.lsp.client import LanguageClient

        self.client = LanguageClient("warmpath-eval", "1")
        argv = ["-m", "warmpath.cli", "--log-level", "WARNING", "lsp", "--url", self.target.url,
                "--max-tokens", str(self.max_tokens)]
        if self.target.api_key:
            argv += ["--api-key", self.target.api_key]
        await self.client.start_io(sys.executable, *argv)
        await self.client.initialize_async(
            types.InitializeParams(
                capabilities=types.ClientCapabilities(), initialization_options={
                    "debounceMs": 0, "deadlineMs": 600000, "model": self.target.model
                }))
        self.client.initialized(types.InitializedParams())

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.shutdown_async(None)
            self.client.exit(None)
            await self.client.stop()

    def _open(self, uri: str, text: str, language: str) -> None:
        from lsprotocol import types

        self.client.text_document_did_open(types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri, language_id=language, version=1, text=text)))

    def _close(self, uri: str) -> None:
        from lsprotocol import types

        self.client.text_document_did_close(
            types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri)))

    async def ask(self, hole: Hole) -> tuple[str, str | None, float | None]:
        from lsprotocol import types

        uri = f"file:///eval/{hole.project}/{hole.path}"
        others = [(f"file:///eval/{hole.project}/{path}", text) for path, text in hole.extra]
        buffer = hole.prefix + hole.suffix
        for other, text in others:
            self._open(other, text, hole.language)
        self._open(uri, buffer, hole.language)
        try:
            result = await self.client.text_document_inline_completion_async(
                types.InlineCompletionParams(
                    text_document=types.TextDocumentIdentifier(uri),
                    position=_position(buffer, hole.start), context=types.InlineCompletionContext(
                        trigger_kind=types.InlineCompletionTriggerKind.Invoked)))
        finally:
            for other, _ in others:
                self._close(other)
            self._close(uri)
        items = result.items if isinstance(result, types.InlineCompletionList) else (result or [])
        if not items:
            return "", None, None
        text = items[0].insert_text
        return (text if isinstance(text, str) else text.value), None, None
