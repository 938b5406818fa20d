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
