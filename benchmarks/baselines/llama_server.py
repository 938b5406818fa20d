r"""llama.cpp's own C++ `llama-server` as a real engine behind warmpath's router (issue 22).

    python benchmarks/baselines/llama_server.py install  # build it once, cached
    python benchmarks/baselines/llama_server.py serve --port 8003 --threads 2 \
        [--ctx 8192] [--parallel 4]

Not llama-cpp-python's Python server (that one is llama_cpp_python.py): this is the server llama.cpp
ships, with /health, /props, /slots, /metrics, /infill and /v1/completions. `install` builds just
the `llama-server` target with cmake (Release, static, no web UI, no curl/openssl) from the
llama.cpp that the cached llama-cpp-python sdist vendors ($WARMPATH_HOME/sdists, fetched again with
pip when absent) into $WARMPATH_HOME/baselines/llama-server/bin; it skips the build when that binary
exists. On AMX machines it takes llama_cpp_python.py's flags (the native build crashes in
llama.cpp's AMX path). `serve` runs the bundled GGUF with metrics and slots on, alias `smollm2`,
continuous batching and prompt caching, one unified KV buffer for all slots (`--model
qwen2.5-coder-0.5b` or a GGUF path for another file); any other flag goes to llama-server as it is
(`--cache-reuse 256`). No offline API: offline() says so. Never part of `make test`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

if not __package__:  # run by path: python benchmarks/baselines/llama_server.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from baselines import command_line, home  # noqa: E402
from baselines.llama_cpp_python import VERSION, cmake_args  # noqa: E402
from warmpath.config import warmpath_home  # noqa: E402

SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
VENDOR = f"llama_cpp_python-{VERSION}/vendor/llama.cpp"


def root() -> Path:
    return home() / "llama-server"


def binary() -> Path:
    return root() / "bin" / "llama-server"


def installed() -> bool:
    return binary().exists()


def sdist() -> Path:
    """The llama-cpp-python sdist (it vendors llama.cpp), from warmpath's cache or pip."""
    cached = warmpath_home() / "sdists" / SDIST
    if cached.exists():
        return cached
    cached.parent.mkdir(parents=True, exist_ok=True)
    print(f"downloading {SDIST} with pip ...", flush=True)
    subprocess.run([
        sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:", "--no-deps",
        "--dest",
        str(cached.parent), f"llama-cpp-python=={VERSION}"
    ], check=True)
    return cached


def source(into: Path) -> Path:
    """Unpack only the vendored llama.cpp; it must have the server (tools/server, or examples/server
    before)."""
    with tarfile.open(sdist()) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(VENDOR + "/")]
        tar.extractall(into, members=members, filter="data")
    src = into / VENDOR
    if not any((src / d / "server" / "CMakeLists.txt").exists() for d in ("tools", "examples")):
        sys.exit(f"{SDIST} vendors a llama.cpp without its server")
    return src


def install() -> None:
    exe = binary()
    if exe.exists():
        print(f"llama-server already built: {exe}")
        return
    jobs = str(os.cpu_count() or 2)
    with tempfile.TemporaryDirectory(prefix="llama-server-") as tmp:
        src = source(Path(tmp))
        build = Path(tmp) / "build"
        # LLAMA_USE_PREBUILT_UI=OFF: the web UI would be downloaded from Hugging Face; the server
        # runs without it.
        flags = [
            "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_SERVER=ON",
            "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
            *cmake_args().split()
        ]
        print(f"building llama-server from {SDIST}'s llama.cpp with -j{jobs} (a few minutes) ...",
              flush=True)
        subprocess.run(["cmake", "-S", str(src), "-B", str(build), *flags], check=True)
        subprocess.run([
            "cmake", "--build",
            str(build), "--config", "Release", "--target", "llama-server", "-j", jobs
        ], check=True)
        exe.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(build / "bin" / "llama-server", exe.with_suffix(".tmp"))
        exe.with_suffix(".tmp").rename(exe)
    subprocess.run([str(exe), "--version"], check=True)


def serve_cmd(model: str, port: int, threads: int, ctx: int = 8192, parallel: int = 4,
              extra: Sequence[str] = ()) -> tuple[list[str], dict[str, str]]:
    """llama-server on `model` (a registry name or a GGUF path, served under that name) at its
    serving settings; `extra`: more llama-server flags, appended as they are."""
    from warmpath.models.registry import resolve_model

    argv = [
        str(binary()), "--model",
        str(resolve_model(model)), "--alias", model, "--host", "127.0.0.1", "--port",
        str(port), "--threads",
        str(threads), "--threads-batch",
        str(threads), "--ctx-size",
        str(ctx), "--parallel",
        str(parallel), "--kv-unified", "--cont-batching", "--cache-prompt", "--metrics", "--slots",
        "--no-webui", *extra
    ]
    return argv, dict(os.environ)


def offline(job: dict, model: str, threads: int) -> dict:
    raise NotImplementedError(
        "llama-server is a server only: llama.cpp's offline rows are "
        "baselines.llama_cpp_python.offline (the same llama.cpp through its Python API)")


def main() -> None:
    def flags(s) -> None:
        s.add_argument("--ctx", type=int, default=8192)
        s.add_argument("--parallel", type=int, default=4)
        s.add_argument("--model", default="smollm2",
                       help="a `warmpath fetch-model` name or a GGUF path")

    # serve: flags this script does not know go to llama-server as they are (--cache-reuse 256)
    command_line(__doc__, "llama-server", install, installed, 8003, flags,
                 lambda a, extra: serve_cmd(a.model, a.port, a.threads, a.ctx, a.parallel, extra),
                 extra_ok=True)


if __name__ == "__main__":
    main()
