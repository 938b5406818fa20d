"""A real uvicorn server on a loopback socket, in a thread of the test process (so tests can also
look at the engine behind it); waiting on engine steps without sleeping; reading a server's
Prometheus counters; the code sample the server, router and client tests prompt with. The fixtures
built on these are in conftest.py."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO

import httpx
import uvicorn

from warmpath.config import EngineConfig, ServerConfig

CODE = "def add(a, b):\n    return a + b\n\nclass Point:\n    def __init__(self, x, y):\n"


@contextmanager
def running_server(engine_config: EngineConfig, server_config: ServerConfig | None = None):
    from warmpath.engine.engine import Engine
    from warmpath.server.app import create_app

    engine = Engine(engine_config)
    with running_app(create_app(engine, server_config)) as (url, app):
        yield url, app


@contextmanager
def running_app(app):
    """Any ASGI app (a server, the router) on a fresh loopback port, in a thread; under its config's
    connection limits as `warmpath serve` / `warmpath route` run it (api/serving.py), when it has
    one."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    limits = getattr(app.state, "http_config", None) if hasattr(app, "state") else None
    if limits is not None:
        from warmpath.api.serving import uvicorn_config

        config = uvicorn_config(app, limits, log_level="warning", lifespan="on")
    else:
        config = uvicorn.Config(app, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    ready = time.monotonic() + 30
    while not server.started:  # readiness, bounded: uvicorn exposes no event for it
        if time.monotonic() > ready or not thread.is_alive():
            raise RuntimeError("server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@contextmanager
def running_router(urls, **kwargs):
    """(url, app): `warmpath route` over these nodes on loopback, checking them every 0.2 s unless
    told."""
    from warmpath.config import RouterConfig
    from warmpath.router.app import create_router_app

    cfg = RouterConfig(node=list(urls), health_interval=kwargs.pop("health_interval", 0.2),
                       **kwargs)
    with running_app(create_router_app(cfg)) as (url, app):
        yield url, app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServeProcess:
    """A `warmpath serve` subprocess on a loopback port, its output kept in a file (read when it
    fails)."""

    url: str
    proc: subprocess.Popen
    log: IO[str]

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def wait_serving(self, timeout: float = 180.0) -> None:
        """Until /health answers 200 (bounded: a fresh process imports torch and loads the
        model)."""
        ready = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > ready:
                raise RuntimeError(f"warmpath serve did not come up:\n{self.output()}")
            time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.log.close()


def start_serve(*args: str, env: dict[str, str] | None = None) -> ServeProcess:
    """`warmpath serve ARGS` as a user runs it, started on a free port (not waited for: servers
    started together start at the same moment). `env`: the whole environment, for another
    $WARMPATH_HOME or $CC."""
    port = free_port()
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([
        sys.executable, "-m", "warmpath.cli", "--log-level", "warning", "serve", "--port",
        str(port), *args
    ], stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
    return ServeProcess(f"http://127.0.0.1:{port}", proc, log)


@contextmanager
def serve_process(*args: str, timeout: float = 180.0):
    """`warmpath serve ARGS` in a subprocess: (url, process) once its /health answers 200. Stopped
    on exit if still alive."""
    server = start_serve(*args)
    try:
        server.wait_serving(timeout)
        yield server.url, server.proc
    finally:
        server.stop()


def stream_then_signal(router_url: str, session: str, node: str, pid: int,
                       sig: int) -> tuple[list[str], float]:
    """A long streamed completion through the router to `node`; after its second event the node's
    process gets `sig` (a kill, a freeze). Returns the stream's data payloads and when the signal
    was sent."""
    import os

    body = {"prompt": CODE * 20, "max_tokens": 4000, "stream": True}
    events, sent = [], 0.0
    with httpx.stream("POST", f"{router_url}/v1/completions", json=body,
                      headers={"X-Session-Id": session}, timeout=60) as r:
        assert r.headers["x-warmpath-node"] == node
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 2:
                    os.kill(pid, sig)
                    sent = time.monotonic()
    return events, sent


def wait_for_step(app, condition, timeout: float = 60.0) -> None:
    """Block until condition(engine) holds after some engine step."""
    event = threading.Event()

    def listener(engine):
        if condition(engine):
            event.set()

    async_engine = app.state.async_engine
    async_engine.step_listeners.append(listener)
    try:
        if not (condition(app.state.engine) or event.wait(timeout)):
            raise TimeoutError("condition not reached")
    finally:
        async_engine.step_listeners.remove(listener)


def computed_since(app, start: int, timeout: float = 60.0) -> None:
    """Block until the engine has computed tokens past `start` (stats' num_computed_tokens) and has
    nothing left to run or warm: a warm-up, answered at once, computed."""
    def done(engine) -> bool:
        s = engine.stats()
        return s["num_computed_tokens"] > start and not (s["num_running"] or s["num_waiting"]
                                                         or s["warm_up_tokens"])

    wait_for_step(app, done, timeout)


def counter(url: str, name: str, label: str = "") -> float:
    """A counter's value on a server's /metrics: the sample with exactly these labels, or the
    unlabelled one."""
    text = httpx.get(f"{url}/metrics").text
    prefix = f"{name}{{{label}}}" if label else name
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(prefix + " "))


def total(url: str, name: str) -> float:
    """A counter summed over all its labels."""
    lines = httpx.get(f"{url}/metrics").text.splitlines()
    return sum(float(x.split()[-1]) for x in lines if x.startswith((name + " ", name + "{")))
