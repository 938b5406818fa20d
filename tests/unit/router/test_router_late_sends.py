"""The router's connections to a node when requests are given up while it connects: a request past
its deadline (X-Deadline-Ms of a few ms) stops waiting at any point of the node's connection setup.
Cancelled there, the upstream client (httpcore) would leave the new connection open and unusable for
the router's whole life, never sending its request (the hour soak found ~60 such descriptors a
flood, in CLOSE-WAIT once the node's header timeout closed them): a send given up before it writes
its request finishes alone and is closed then (router/sending.py)."""

import asyncio
import time

import httpx
import psutil
import pytest
from server_harness import CODE, running_server
from server_harness import running_router as router

from warmpath.api.asgi import unless_disconnected
from warmpath.config import ServerConfig
from warmpath.router.nodes import Node
from warmpath.router.watch import Watch

pytestmark = pytest.mark.server


async def _late_requests(url: str, n: int) -> None:
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=None)) as http:
        async def one(i: int) -> None:
            r = await http.post(
                f"{url}/v1/completions",
                json={"prompt": CODE, "max_tokens": 2, "stream": i % 2 == 0},
                headers={"X-Deadline-Ms": str(1 + i % 7), "X-Session-Id": f"late-{i}"})
            assert r.status_code == 200, r.text  # silence, never an error

        for start in range(0, n, 50):
            await asyncio.gather(*(one(i) for i in range(start, start + 50)))


def _closed_by(port: int) -> set[int]:
    """Local ports of this process's connections to `port` that the node has closed and we have
    not."""
    return {c.laddr.port for c in psutil.Process().net_connections("tcp")
            if c.raddr and c.raddr.port == port and c.status == psutil.CONN_CLOSE_WAIT}


def test_requests_given_up_while_the_router_connects_leave_no_connection_behind(server_config):
    # The node closes a connection that sends no request within 1 s (its header timeout, also what
    # an idle keep-alive connection gets): after 2 s every connection the router never used is
    # closed by the node. An idle one the router reaps at its next use of the pool (a health check
    # every 0.2 s); a stuck one stays.
    with running_server(server_config,
                        ServerConfig(header_timeout=1.0)) as (node, _), router([node]) as (url, _):
        port = int(node.rsplit(":", 1)[1])
        asyncio.run(_late_requests(url, 600))
        time.sleep(2.0)
        first = _closed_by(port)
        time.sleep(1.0)
        assert first & _closed_by(port) == set()


async def _answer_streams(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A node on a real socket: every request gets one chunked event, then the stream's end."""
    try:
        while (await reader.readuntil(b"\r\n\r\n")):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n"
                         b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


class _NoRequest:
    async def receive(self) -> dict:  # a client that stays
        await asyncio.Event().wait()


async def _a_deadline_inside_the_close(read_in: str) -> tuple[int, list[str]]:
    """Reads one streamed answer to its end under a 20 ms deadline while httpx's close of it (at
    the stream's end) takes 100 ms: the deadline falls inside the close. Returns the requests still
    holding a connection of the pool, and the connections' states."""
    server = await asyncio.start_server(_answer_streams, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    async def slow_close(event: str, info: dict) -> None:
        if event == "http11.response_closed.started":
            await asyncio.sleep(0.1)

    async with server, httpx.AsyncClient() as http:
        request = http.build_request("GET", f"http://127.0.0.1:{port}/",
                                     extensions={"trace": slow_close})
        resp = await http.send(request, stream=True)
        node = Node(f"http://127.0.0.1:{port}", healthy=True)

        async def to_the_end() -> None:
            async for _ in resp.aiter_raw():
                pass

        try:
            async with Watch(node).until(time.monotonic() + 0.02, time.monotonic() + 10, "it"):
                if read_in == "this task":
                    await to_the_end()
                else:  # as the router waits on a stream's first event
                    await unless_disconnected(_NoRequest(), to_the_end())
        except TimeoutError:
            pass
        await resp.aclose()
        pool = http._transport._pool
        return len(pool._requests), [c.info() for c in pool.connections]


@pytest.mark.parametrize("read_in", ["this task", "a task of its own"])
def test_a_deadline_that_falls_while_httpx_closes_a_connection_leaves_it_usable(read_in):
    # The race the test above loses now and then, made certain: a plain Task.cancel() at the
    # deadline stopped httpx's close halfway (the request kept its connection, ACTIVE for good).
    held, connections = asyncio.run(_a_deadline_inside_the_close(read_in))
    assert held == 0
    assert all("ACTIVE" not in c for c in connections), connections
