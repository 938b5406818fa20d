"""llama.cpp's OpenAI-compatible server as a baseline for `warmpath bench --baseline`.

    python benchmarks/llama_cpp_server.py install           # own venv under $WARMPATH_HOME/baselines
    python benchmarks/llama_cpp_server.py serve --port 8001  # same GGUF as warmpath, same threads

It runs `llama-cpp-python[server]` (llama.cpp compiled from source for this CPU) on the bundled GGUF with
prompt caching on, so both servers get the chance to reuse a warm prefix, plus a `/metrics` route with the
prompt tokens it reused (llama_cpp_launch.py), so the bench can report its hit rate. Never part of `make test`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import venv
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from warmpath.config import warmpath_home  # noqa: E402

VERSION = "0.3.36"


def venv_dir() -> Path:
    return warmpath_home() / "baselines" / "llama-cpp-python"


def cmake_args() -> str:
    """AMX machines: the native build crashes in llama.cpp's AMX path (anchors.md), so build without it."""
    flags = Path("/proc/cpuinfo").read_text()
    if "amx_tile" not in flags:
        return ""
    return ("-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON "
            "-DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF")


def install() -> Path:
    d = venv_dir()
    python = d / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", "import llama_cpp.server"],
                                          capture_output=True).returncode == 0:
        print(f"llama-cpp-python already installed in {d}")
        return python
    venv.create(d, with_pip=True, clear=True)
    env = dict(os.environ, CMAKE_ARGS=cmake_args(), CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
    print(f"building llama-cpp-python {VERSION} from source into {d} (about 10 minutes on 2 cores) ...",
          flush=True)
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
    subprocess.run([python, "-m", "pip", "install", f"llama-cpp-python[server]=={VERSION}"], check=True, env=env)
    return python


def serve(port: int, threads: int, ctx: int) -> None:
    from warmpath.models.registry import resolve_model

    python = venv_dir() / "bin" / "python"
    if not python.exists():
        sys.exit(f"llama-cpp-python is not installed; run: python {sys.argv[0]} install")
    gguf = resolve_model("smollm2")
    # --interrupt_requests False: the default lets every new request interrupt the running one (anchors.md).
    launcher = Path(__file__).with_name("llama_cpp_launch.py")  # the server plus a /metrics of its cache reuse
    cmd = [str(python), str(launcher), "--model", str(gguf), "--host", "127.0.0.1",
           "--port", str(port), "--n_threads", str(threads), "--n_threads_batch", str(threads),
           "--n_ctx", str(ctx), "--n_batch", "512", "--cache", "True", "--cache_type", "ram",
           "--interrupt_requests", "False", "--logits_all", "False", "--model_alias", "smollm2"]
    print(" ".join(cmd), flush=True)
    os.execv(cmd[0], cmd)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install")
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, default=8001)
    s.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    s.add_argument("--ctx", type=int, default=8192)
    args = p.parse_args()
    if args.cmd == "install":
        install()
    else:
        serve(args.port, args.threads, args.ctx)


if __name__ == "__main__":
    main()
