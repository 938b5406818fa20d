import pytest

from warmpath import LLM


@pytest.fixture(scope="session")
def smollm2_fp32() -> LLM:
    """The bundled model in fp32 (the correctness configuration). Fetched by `make setup`."""
    return LLM("smollm2", dtype="float32", kv_cache_memory=1 << 30)
