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

from warmpath.config import ServerConfig

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
