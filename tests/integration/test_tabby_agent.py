"""tabby-agent (npm; the agent behind Tabby's VS Code, JetBrains and Vim extensions) against
`warmpath serve` (a subprocess, the bundled model) and through `warmpath route`, configured with the
README's config.toml snippet: an editor's LSP `textDocument/completion` gets the model's completion,
the one Tabby's /v1/completions answers, and the agent takes the server's settings (no usage
telemetry)."""

import json
import os
import re
import shutil
from pathlib import Path

import httpx
import pytest
from server_harness import running_app, serve_process, total
from tabby_agent import Lsp, agent_cli

from warmpath.config import RouterConfig
from warmpath.router.app import create_router_app

pytestmark = pytest.mark.server

README = Path(__file__).parents[2] / "README.md"
DOC = "def fibonacci(n):\n    if n < 2:\n        return n\n    return "
CURSOR = {"line": 3, "character": len("    return ")}  # the end of the document


def readme_config(endpoint: str) -> str:
    """The README's Tabby config.toml, pointed at `endpoint` (and the agent's debug log on, for a
    failure)."""
    m = re.search(r"```toml\n(# ~/\.tabby-client/agent/config\.toml.*?)```", README.read_text(),
                  re.S)
    assert m, "README: the Tabby config.toml snippet"
    config, n = re.subn(r'(?m)^endpoint = "[^"]*"', f'endpoint = "{endpoint}"', m.group(1))
    assert n == 1
    return config + '\n[logs]\nlevel = "debug"\n'


@pytest.fixture(scope="module")
def cli() -> Path:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("tabby-agent runs on node (and is fetched with npm)")
    return agent_cli()


@pytest.fixture(scope="module")
def served():
    with serve_process("--model", "smollm2", "--dtype", "float32") as (url, _):
        yield url


def agent_completion(cli: Path, endpoint: str, home: Path) -> tuple[list[dict], dict, str]:
    """The items tabby-agent answers an editor's completion request with at CURSOR in DOC, its data
    store (~/.tabby-client/agent/data.json) and its log."""
    config = home / ".tabby-client" / "agent" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(readme_config(endpoint))
    lsp = Lsp(["node", str(cli), "--lsp", "--stdio"],
              {"HOME": str(home), "PATH": os.environ["PATH"]}, home / "stderr.log")
    try:
        init = lsp.request(
            "initialize", {
                "processId": os.getpid(), "rootUri": None, "clientInfo": {
                    "name": "warmpath-test", "version": "1"
                }, "capabilities": {"textDocument": {"completion": {}}}
            })
        assert "completionProvider" in init["capabilities"]
        lsp.notify("initialized", {})
        uri = (home / "fib.py").as_uri()
        lsp.notify(
            "textDocument/didOpen",
            {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": DOC}})
        result = lsp.request("textDocument/completion",
                             {"textDocument": {"uri": uri}, "position": CURSOR}, timeout=180)
    finally:
        lsp.close()
    logs = "".join(p.read_text(errors="replace")[-4000:] for p in sorted(home.rglob("*.log")))
    return result["items"], json.loads((config.parent / "data.json").read_text()), logs


def test_tabby_agent_completes_from_warmpath_serve_and_through_the_router(cli, served, tmp_path):
    # What tabby-agent 1.5.0 sends for this document (TabbyAgent.createSegments: no workspace, no
    # clipboard)
    want = httpx.post(f"{served}/v1/completions", json={"language": "python", "segments": {
        "prefix": DOC, "suffix": ""}}, timeout=180).json()["choices"][0]["text"]
    assert want.strip()
    with running_app(create_router_app(RouterConfig(node=[served],
                                                    health_interval=0.5))) as (rurl, _):
        for via, endpoint in (("serve", served), ("route", rurl)):
            before = total(served, "warmpath_requests_total")
            items, store, logs = agent_completion(cli, endpoint, tmp_path / via)
            assert items, f"{via}: no completion; the agent's log:\n{logs}"
            # it read /v1beta/server_setting (health's version passed its >= 0.9 gate): no telemetry
            # to TabbyML
            assert store["serverConfig"][endpoint] == {"anonymousUsageTracking": {"disable": True}
                                                       }, logs
            # the word before the cursor (none here) + the insertion
            text = items[0]["textEdit"]["newText"]
            # the agent only trims it to a scope
            assert text.strip() and text.strip() in want, (via, text, want)
            # it came from the node, not a cache
            assert total(served, "warmpath_requests_total") > before
