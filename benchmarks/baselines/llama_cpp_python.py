"""llama-cpp-python (llama.cpp compiled from source for this CPU, in its own venv under
$WARMPATH_HOME/baselines): its OpenAI-compatible server, a baseline for `warmpath bench --baseline`,
and its Python API for compare_cpu.py's offline rows.

    # own venv under $WARMPATH_HOME/baselines
    python benchmarks/baselines/llama_cpp_python.py install
    # same GGUF as warmpath, same threads
    python benchmarks/baselines/llama_cpp_python.py serve --port 8001

The server runs `llama-cpp-python[server]` on the bundled GGUF (`--model` for another) with prompt
caching on, so both servers get the chance to reuse a warm prefix, plus a `/metrics` route with the
prompt tokens it reused (llama_cpp_launch.py), so the bench can report its hit rate. offline() runs
llama_cpp_speed.py in that venv. Never part of `make test`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

if not __package__:  # run by path: python benchmarks/baselines/llama_cpp_python.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from baselines import DECODE_TOKENS, HERE, command_line, home, new_venv, run_job  # noqa: E402

VERSION = "0.3.36"


def venv_dir() -> Path:
    return home() / "llama-cpp-python"


def installed() -> bool:
    return (venv_dir() / "bin" / "python").exists()


def cmake_args() -> str:
    """AMX machines: the native build crashed in llama.cpp's AMX path on a Sapphire Rapids, so build
    without it."""
    flags = Path("/proc/cpuinfo").read_text()
    if "amx_tile" not in flags:
        return ""
    return (
        "-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON "
        "-DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF "
        "-DGGML_AMX_BF16=OFF"
    )


def install() -> None:
    d = venv_dir()
    python = d / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", "import llama_cpp.server"],
                                          capture_output=True).returncode == 0:
        print(f"llama-cpp-python already installed in {d}")
        return
    env = dict(os.environ, CMAKE_ARGS=cmake_args(), CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or
                                                                                   2))
    python = new_venv(
        d,
        f"building llama-cpp-python {VERSION} from source into {d} (about 10 minutes on 2 cores) "
        "..."
    )
    subprocess.run([python, "-m", "pip", "install", f"llama-cpp-python[server]=={VERSION}"],
                   check=True, env=env)


def serve_cmd(model: str, port: int, threads: int,
              ctx: int = 8192) -> tuple[list[str], dict[str, str]]:
    """llama-cpp-python's server (through llama_cpp_launch.py: the server plus a /metrics of its
    cache reuse) on `model` (a registry name or a GGUF path, served under that name), its RAM prompt
    cache on."""
    from warmpath.models.registry import resolve_model

    # --interrupt_requests False: llama-cpp-python's default lets every new request interrupt the
    # running one.
    argv = [
        str(venv_dir() / "bin" / "python"),
        str(HERE / "llama_cpp_launch.py"), "--model",
        str(resolve_model(model)), "--host", "127.0.0.1", "--port",
        str(port), "--n_threads",
        str(threads), "--n_threads_batch",
        str(threads), "--n_ctx",
        str(ctx), "--n_batch", "512", "--cache", "True", "--cache_type", "ram",
        "--interrupt_requests", "False", "--logits_all", "False", "--model_alias", model
    ]
    return argv, dict(os.environ)


def offline(job: dict, model: str, threads: int) -> dict:
    """compare_cpu.py's rows through llama-cpp-python's API (llama_cpp_speed.py, in its venv) on the
    same GGUF."""
    from warmpath.models.registry import resolve_model

    payload = {
        "decode_tokens": DECODE_TOKENS, **job, "model": str(resolve_model(model)),
        "threads": threads
    }
    return run_job(venv_dir() / "bin" / "python", "llama_cpp_speed.py", payload)


def main() -> None:
    def flags(s) -> None:
        s.add_argument("--ctx", type=int, default=8192)
        s.add_argument("--model", default="smollm2", help="a registry name or a GGUF path")

    command_line(__doc__, "llama-cpp-python", install, installed, 8001, flags,
                 lambda a, extra: serve_cmd(a.model, a.port, a.threads, a.ctx))


if __name__ == "__main__":
    main()
