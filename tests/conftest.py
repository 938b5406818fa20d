import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny_model import write_tiny_hf  # noqa: E402

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    return write_tiny_hf(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory) -> Path:
    return write_tiny_hf(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2")


@pytest.fixture(scope="session")
def tiny_long_dir(tmp_path_factory) -> Path:
    """The tiny Llama with an 8k context, for long-prompt engine tests."""
    return write_tiny_hf(tmp_path_factory.mktemp("tiny-long"), "llama", max_position_embeddings=8192)


@pytest.fixture(scope="module")
def server_kv_blocks() -> int:
    """KV blocks of the `server` fixture's engine; a test module overrides this fixture to size its pool."""
    return 1024


@pytest.fixture(scope="module")
def server_config(tiny_long_dir, server_kv_blocks):
    """The tiny long-context model in fp32 with a small token budget per step: a ~700-token prompt takes ~11
    steps, so a test can act while it is in flight."""
    from warmpath.config import EngineConfig, SchedulerConfig

    return EngineConfig(model=str(tiny_long_dir), dtype="float32", num_kv_blocks=server_kv_blocks,
                        scheduler=SchedulerConfig(max_num_batched_tokens=64))


@pytest.fixture(scope="module")
def server(server_config):
    """(url, app): a real server on loopback over `server_config`, one per test module."""
    from server_harness import running_server

    with running_server(server_config) as (url, app):
        yield url, app
