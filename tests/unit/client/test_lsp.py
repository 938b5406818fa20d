"""`warmpath lsp` driven over stdio by a real LSP client (pygls' LanguageClient) against a real
`warmpath serve` (tiny model, loopback HTTP): inline completion and completion give the text the
server gives over HTTP; incremental edits are followed; a keystroke burst yields one completion
while the stale requests abort on the server, as `$/cancelRequest` does; past the deadline the
answer is empty, never an error; the other open documents go along as repository context, those
named like secrets only when asked; shutdown and exit end the process."""

import asyncio
import sys

import httpx
import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcRequestCancelled
from pygls.lsp.client import LanguageClient
from server_harness import CODE, computed_since, counter

DOC = "file:///work/app.py"
OTHER = "file:///work/util.py"
# ~700 tokens: with the fixture's 64-token step budget, a request is in flight for ~11 steps
TEXT = CODE * 20
END = types.Position(line=TEXT.count("\n"), character=0)


async def started(url: str, max_tokens: int = 8, **options) -> LanguageClient:
    client = LanguageClient("warmpath-test", "1")
    await client.start_io(sys.executable, "-m", "warmpath.cli", "--log-level", "WARNING", "lsp",
                          "--url", url, "--max-tokens", str(max_tokens))
    await client.initialize_async(
        types.InitializeParams(capabilities=types.ClientCapabilities(),
                               initialization_options={"debounceMs": 0, "warm": False, **options}))
    client.initialized(types.InitializedParams())
    return client


async def stopped(client: LanguageClient) -> int | None:
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    return client._server.returncode if client._server else None


def open_doc(client: LanguageClient, uri: str, text: str) -> None:
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))


def type_at_end(client: LanguageClient, uri: str, version: int, text: str,
                at: types.Position) -> None:
    """An incremental change: `text` inserted at `at`."""
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        [types.TextDocumentContentChangePartial(range=types.Range(at, at), text=text)]))


def inline(client: LanguageClient, uri: str, at: types.Position):
    return client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri), position=at,
            context=types.InlineCompletionContext(
                trigger_kind=types.InlineCompletionTriggerKind.Automatic)))


def direct(url: str, prompt: str, suffix: str = "", max_tokens: int = 8) -> str:
    body = {"prompt": prompt, "suffix": suffix, "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]


@pytest.mark.server
def test_inline_completion_and_completion_give_the_servers_text_after_incremental_edits(server):
    url, _ = server

    async def run():
        client = await started(url)
        open_doc(client, DOC, TEXT + "\nprint(1)\n")
        type_at_end(client, DOC, 2, "def sub(a, b):\n", END)
        at = types.Position(line=END.line + 1, character=0)
        got = await inline(client, DOC, at)
        listed = await client.text_document_completion_async(types.CompletionParams(
            text_document=types.TextDocumentIdentifier(DOC), position=at))
        return got, listed, await stopped(client)

    got, listed, code = asyncio.run(run())
    want = direct(url, TEXT + "def sub(a, b):\n", "\nprint(1)\n")
    assert want and [(i.insert_text, i.range.start, i.range.end) for i in got.items] == [
        (want, types.Position(END.line + 1, 0), types.Position(END.line + 1, 0))]
    assert listed.is_incomplete and [i.text_edit.new_text for i in listed.items] == [want]
    assert code == 0


async def running_alone(url: str, aborted_before: float, stale: int) -> None:
    """Until the newest request runs on the server and the `stale` ones before it have been aborted:
    whatever the CPU's speed, the next keystroke then finds it in flight (an answer of 300 tokens
    lasts far longer than a poll)."""
    for _ in range(2000):
        running = await asyncio.to_thread(counter, url, "warmpath_num_requests_running")
        gone = await asyncio.to_thread(counter, url, "warmpath_requests_aborted_total",
                                       'reason="client"')
        if running >= 1 and gone - aborted_before >= stale:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"the request after {stale} stale ones never ran alone on the server")


@pytest.mark.server
def test_a_keystroke_burst_yields_one_completion_and_the_stale_ones_abort_on_the_server(server):
    url, _ = server
    aborted, ended = counter(url, "warmpath_requests_aborted_total", 'reason="client"'), \
        counter(url, "warmpath_requests_total", 'finish_reason="length"') + \
        counter(url, "warmpath_requests_total", 'finish_reason="stop"')

    async def run():
        # each answer streams for a while: the next key finds it
        client = await started(url, max_tokens=300)
        open_doc(client, DOC, TEXT)
        asked, at = [], END
        for version, key in enumerate("def f", start=2):
            type_at_end(client, DOC, version, key, at)
            at = types.Position(at.line, at.character + 1)
            asked.append(asyncio.ensure_future(inline(client, DOC, at)))
            # the next key comes while this one is in flight
            await running_alone(url, aborted, stale=version - 2)
        results = await asyncio.gather(*asked, return_exceptions=True)
        await stopped(client)
        return results

    results = asyncio.run(run())
    assert all(isinstance(r, JsonRpcRequestCancelled) for r in results[:-1]), results
    assert isinstance(results[-1], types.InlineCompletionList) and results[-1].items
    assert results[-1].items[0].insert_text == direct(url, TEXT + "def f", max_tokens=300)
    stale = counter(url, "warmpath_requests_aborted_total", 'reason="client"') - aborted
    finished = counter(url, "warmpath_requests_total", 'finish_reason="length"') + \
        counter(url, "warmpath_requests_total", 'finish_reason="stop"') - ended
    assert stale >= 3 and finished == 2  # the burst's last request, and the direct one


@pytest.mark.server
def test_cancel_request_aborts_the_request_on_the_server(server):
    url, _ = server
    before = counter(url, "warmpath_requests_aborted_total", 'reason="client"')

    async def run():
        client = await started(url, max_tokens=300)
        open_doc(client, DOC, TEXT + "x")
        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(DOC), position=END,
            context=types.InlineCompletionContext(
                trigger_kind=types.InlineCompletionTriggerKind.Invoked))
        pending = client.protocol.send_request_async(types.TEXT_DOCUMENT_INLINE_COMPLETION, params,
                                                     msg_id=77)
        await asyncio.sleep(0.1)  # on the server by now, and streaming
        client.cancel_request(types.CancelParams(id=77))
        with pytest.raises(JsonRpcRequestCancelled):
            await pending
        await stopped(client)

    asyncio.run(run())
    assert counter(url, "warmpath_requests_aborted_total", 'reason="client"') >= before + 1


@pytest.mark.server
def test_past_the_deadline_the_answer_is_empty_not_an_error(server):
    url, _ = server

    async def run():
        client = await started(url, deadlineMs=5)  # a 700-token cold prompt takes longer
        open_doc(client, DOC, TEXT.replace("add", "mul"))
        got = await inline(client, DOC, END)
        await stopped(client)
        return got

    assert not asyncio.run(run()).items


@pytest.mark.server
def test_the_other_open_documents_go_along_as_repository_context(server):
    url, _ = server
    helper = "def helper(x):\n    return x * 2\n" * 30

    async def prompt_tokens(with_other: bool) -> float:
        before = counter(url, "warmpath_prompt_tokens_total")
        client = await started(url)
        open_doc(client, DOC, "import util\n")
        if with_other:
            open_doc(client, OTHER, helper)
        await inline(client, DOC, types.Position(1, 0))
        await stopped(client)
        return counter(url, "warmpath_prompt_tokens_total") - before

    alone, with_other = asyncio.run(prompt_tokens(False)), asyncio.run(prompt_tokens(True))
    assert with_other > alone + 200  # util.py's ~300 tokens came along


@pytest.mark.server
def test_open_documents_named_like_secrets_stay_out_of_the_context_unless_asked(server):
    """A `.env` open beside the code is not sent with every keystroke; `contextSecrets: true` sends
    it."""
    url, _ = server
    env = "API_TOKEN=hunter2\nDATABASE_URL=postgres://admin:pw@db/app\n" * 20

    async def prompt_tokens(**options) -> float:
        before = counter(url, "warmpath_prompt_tokens_total")
        client = await started(url, **options)
        open_doc(client, DOC, "import util\n")
        open_doc(client, "file:///work/.env", env)
        await inline(client, DOC, types.Position(1, 0))
        await stopped(client)
        return counter(url, "warmpath_prompt_tokens_total") - before

    kept_out, sent = asyncio.run(prompt_tokens()), asyncio.run(prompt_tokens(contextSecrets=True))
    assert sent > kept_out + 200  # the .env's ~600 tokens went only when asked
    from warmpath.client.secret_files import looks_secret

    assert all(
        map(looks_secret,
            (".env.local", "server.pem", "id_ed25519", "github_token", "db-credentials.json")))
    assert not any(map(looks_secret, ("util.py", "tokenizer.py", "id_utils.py", "environment.py")))


def test_bad_initialization_options_are_an_error_the_editor_sees():
    from warmpath.client.lsp import Settings

    assert Settings().updated({"url": "http://h:1", "debounceMs": 10,
                               "other": 1}).url == "http://h:1"
    with pytest.raises(ValueError, match="maxTokens must be an integer"):
        Settings().updated({"maxTokens": "many"})
    with pytest.raises(ValueError, match="contextSecrets must be a boolean"):
        Settings().updated({"contextSecrets": 1})
    assert Settings().updated({"contextSecrets": True}).context_secrets


@pytest.mark.server
def test_a_document_is_warm_before_its_first_keystroke(server):
    # As llama.vim and llama.vscode warm theirs: the prompt is sent as a warm-up when the document
    # opens and when its edits pause, computed in the server's idle steps; the first keystroke after
    # the pause finds all of it cached. Without warm-ups it computes it.
    url, app = server
    hits = "warmpath_prefix_cache_hit_tokens_total"

    async def first_keystroke(warm: bool) -> tuple[float, float]:
        """(prompt tokens found cached, warm-ups the server was asked for)."""
        asked = counter(url, "warmpath_warm_ups_asked_total")
        start = app.state.engine.stats()["num_computed_tokens"]
        client = await started(url, warm=warm, warmAfterMs=50)
        open_doc(client, DOC, f"# warm: {warm}\n" + TEXT)
        at = types.Position(END.line, 0)  # the document's one-before-last line (its first is new)
        type_at_end(client, DOC, 2, "x = 1\n", at)
        if warm:  # the open's warm-up, then the edit's, which replaces it
            for _ in range(500):
                if counter(url, "warmpath_warm_ups_asked_total") >= asked + 2:
                    break
                await asyncio.sleep(0.02)
            await asyncio.to_thread(computed_since, app, start)
        else:
            await asyncio.sleep(0.5)
        before = counter(url, hits)
        got = await inline(client, DOC, types.Position(at.line + 1, 0))  # where the edit ended
        found = counter(url, hits) - before
        await stopped(client)
        assert isinstance(got, types.InlineCompletionList)
        return found, counter(url, "warmpath_warm_ups_asked_total") - asked

    (cold, cold_asked), (warm, warm_asked) = asyncio.run(first_keystroke(False)), \
        asyncio.run(first_keystroke(True))
    assert cold_asked == 0 and warm_asked == 2
    assert warm > cold + 500, (cold, warm)  # the prompt is TEXT's ~700 tokens
