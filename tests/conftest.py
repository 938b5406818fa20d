import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tiny_model import write_tiny_hf  # noqa: E402

DATA = Path(__file__).parent / "data"
# What the tests read from the user's $WARMPATH_HOME: downloads, each checked against a pinned hash,
# fetched once and never written by a test. Everything else under it (kernels, plans, packed
# weights, model hashes, calibrations) is derived and rebuilt when missing: the tests write theirs
# into a home of their own.
FETCHED = ("models", "wheels", "llama-vocab", "npm", "corpus", "sdists", "baselines")


@pytest.fixture(scope="session", autouse=True)
def warmpath_home(tmp_path_factory) -> Path:
    """$WARMPATH_HOME for the whole session (servers started as subprocesses inherit it): a fresh
    directory outside the user's home, its fetched directories links to the user's, so no model is
    fetched again (the models are found where `warmpath fetch-model` put them) and nothing the tests
    compute lands in ~/.cache/warmpath."""
    from warmpath.config import warmpath_home as user_home
    from warmpath.store import private_dir

    user, home = user_home(), private_dir(tmp_path_factory.mktemp("warmpath-home"))
    for name in FETCHED:
        (home / name).symlink_to(private_dir(user / name), target_is_directory=True)
    before = os.environ.get("WARMPATH_HOME")
    os.environ["WARMPATH_HOME"] = str(home)
    yield home
    if before is None:
        os.environ.pop("WARMPATH_HOME", None)
    else:
        os.environ["WARMPATH_HOME"] = before


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    return write_tiny_hf(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory) -> Path:
    return write_tiny_hf(tmp_path_factory.mktemp("tiny-qwen2"), "qwen2")


@pytest.fixture(scope="session")
def tiny_long_dir(tmp_path_factory) -> Path:
    """The tiny Llama with an 8k context, for long-prompt engine tests."""
    return write_tiny_hf(tmp_path_factory.mktemp("tiny-long"), "llama",
                         max_position_embeddings=8192)


@pytest.fixture(scope="module")
def server_kv_blocks() -> int:
    """KV blocks of the `server` fixture's engine; a test module overrides this fixture to size its
    pool."""
    return 1024


@pytest.fixture(scope="module")
def server_config(tiny_long_dir, server_kv_blocks):
    """The tiny long-context model in fp32 with a small token budget per step: a ~700-token prompt
    takes ~11 steps, so a test can act while it is in flight."""
    from warmpath.config import EngineConfig, SchedulerConfig

    return EngineConfig(model=str(tiny_long_dir), dtype="float32", num_kv_blocks=server_kv_blocks,
                        scheduler=SchedulerConfig(max_num_batched_tokens=64))


@pytest.fixture(scope="module")
def server(server_config):
    """(url, app): a real server on loopback over `server_config`, one per test module."""
    from server_harness import running_server

    with running_server(server_config) as (url, app):
        yield url, app
