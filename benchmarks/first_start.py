r"""Start to first answer: `warmpath serve` on a $WARMPATH_HOME that has never seen the model (no
compiled kernel, no plan), then a restart on the same home (issue 29, point 3).

    python benchmarks/first_start.py --model qwen2.5-coder-0.5b [--restarts 2] \
        [--out benchmarks/results/...]

The model file is the fetched one (`warmpath fetch-model`, linked into the fresh home so nothing is
downloaded during the timing). Each start's time is from spawning the server to the first FIM
completion's answer; the server's own log lines give the phases (kernel build, load, plan).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).parent))

from common import machine, write_json  # noqa: E402

from warmpath.models.registry import resolve_model  # noqa: E402

PROMPT, SUFFIX = "def fibonacci(n):\n    ", "\n\nprint(fibonacci(10))\n"
PHASES = ("native kernel", "loaded ", "plan", "listening", "Uvicorn running")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_start(model: Path, home: Path, log: Path, timeout_s: float) -> dict:
    port = free_port()
    env = {**os.environ, "WARMPATH_HOME": str(home)}
    cmd = [
        str(Path(sys.executable).with_name("warmpath")), "serve", "--model",
        str(model), "--port",
        str(port)
    ]
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}; see {log}")
            if time.perf_counter() - t0 > timeout_s:
                raise TimeoutError(f"no answer in {timeout_s:.0f} s; see {log}")
            try:
                r = httpx.post(
                    f"http://127.0.0.1:{port}/v1/completions", timeout=120,
                    json={"prompt": PROMPT, "suffix": SUFFIX, "max_tokens": 16, "temperature": 0})
            except httpx.TransportError:
                time.sleep(0.1)
                continue
            r.raise_for_status()
            first = time.perf_counter() - t0
            text = r.json()["choices"][0]["text"]
            if not text.strip():
                raise RuntimeError(f"an empty completion: {r.json()}; see {log}")
            break
    finally:
        proc.terminate()
        proc.wait(30)
    lines = [ln.strip() for ln in log.read_text().splitlines() if any(p in ln for p in PHASES)]
    return {"first_answer_s": round(first, 2), "text": text, "log": lines}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--restarts", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    model = resolve_model(args.model)
    runs = []
    with tempfile.TemporaryDirectory(prefix="warmpath-fresh-") as tmp:
        home = Path(tmp)
        for i in range(1 + args.restarts):
            kind = "first start (fresh home)" if i == 0 else f"restart {i}"
            run = {"start": kind, **one_start(model, home, home / f"serve{i}.log", args.timeout)}
            print(f"{kind}: first answer after {run['first_answer_s']:.1f} s: {run['text']!r}")
            for ln in run["log"]:
                print("   ", ln)
            runs.append(run)
    payload = {"machine": machine(), "model": str(model.name), "runs": runs}
    if args.out:
        write_json(args.out, payload)


if __name__ == "__main__":
    main()
