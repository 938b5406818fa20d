r"""Code quality per configuration, same model file, same tasks, one run: `warmpath eval` (HumanEval
single-line infilling, pass@1 of greedy FIM completions run against the tests) against `warmpath
serve` with the plan this machine chooses, with the exact fp32 torch path, and against llama.cpp's
`llama-server` on the same file (when built: `python benchmarks/baselines/llama_server.py install`)
with the same FIM prompt written out, and through its /infill as llama.vim gets it (llama.cpp's
repo-level prompt, `<|repo_name|>myproject` ...) (issue 29, point 6); each FIM layout (api/fim.py:
anchored, the default, and cursor) on warmpath and on llama.cpp (issue 33); the int8 KV cache
against the default bf16 one (issue 30: `--configs default,kv-int8`); the FIM suffix cut to its
first lines (issue 33: `--configs suffix-all,suffix-32,...`, `--fim-suffix-tokens`).

    python benchmarks/fim_quality.py --model qwen2.5-coder-0.5b [--limit 200] \
        [--out benchmarks/results/...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).parent))

from baselines.llama_server import binary as llama_server_binary  # noqa: E402
from common import machine, write_json  # noqa: E402
from first_start import free_port  # noqa: E402

from warmpath.models.registry import resolve_model  # noqa: E402

WARMPATH = str(Path(sys.executable).with_name("warmpath"))


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready in {timeout_s:.0f} s")


def run_eval(name: str, cmd: list[str], port: int, protocol: str, args, log_dir: Path,
             eval_args: tuple[str, ...] = ()) -> dict:
    url = f"http://127.0.0.1:{port}"
    with open(log_dir / f"{name}.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(url, proc)
        out = log_dir / f"{name}.json"
        subprocess.run([
            WARMPATH, "eval", "--target", url, "--protocol", protocol, "--limit",
            str(args.limit), "--label", name, "--out",
            str(out), "--cursor", args.cursor, *eval_args
        ], check=True)
        report = json.loads(out.read_text())
    finally:
        proc.terminate()
        proc.wait(60)
    return {k: report[k]
            for k in ("tasks", "passed", "pass_at_1", "errors", "mean_seconds")} | {
                "command": " ".join(cmd),
                "completions": {r["task_id"]: r["completion"]
                                for r in report["results"]}
            }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--limit", type=int, default=200)
    ap.add_argument("--configs", default="default,cursor,fp32,llama.cpp,llama.cpp-infill")
    ap.add_argument(
        "--cursor", choices=("line-start", "mid-line"), default="line-start",
        help="`warmpath eval --cursor`: the hole at the line's start, or halfway through its code")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    model = str(resolve_model(args.model))
    threads = str(os.cpu_count() or 2)
    llama = [
        str(llama_server_binary()), "--model", model, "--threads", threads, "--threads-batch",
        threads, "--ctx-size", "8192", "--cache-prompt", "--no-webui"
    ]
    # key: (row name, server command, eval protocol, more `warmpath eval` flags)
    configs = {
        "default": ("warmpath default plan (anchored FIM layout)",
                    [WARMPATH, "serve", "--model", model], "openai", ()),
        "kv-int8": ("warmpath default plan, --kv-cache-dtype int8",
                    [WARMPATH, "serve", "--model", model, "--kv-cache-dtype",
                     "int8"], "openai", ()),
        "cursor": ("warmpath default plan, --fim-layout cursor",
                   [WARMPATH, "serve", "--model", model, "--fim-layout", "cursor"], "openai", ()),
        "fp32": ("warmpath fp32 (torch, the file's exact values)",
                 [WARMPATH, "serve", "--model", model, "--plan", "torch-fp32"], "openai", ()),
        "fp32-cursor": ("warmpath fp32, --fim-layout cursor", [
            WARMPATH, "serve", "--model", model, "--plan", "torch-fp32", "--fim-layout", "cursor"
        ], "openai", ()),
        **{
            f"suffix-{n}": (f"warmpath default plan, --fim-suffix-tokens {n}", [
                WARMPATH, "serve", "--model", model, "--fim-suffix-tokens", n
            ], "openai", ())
            for n in ("all", "16", "32", "48", "64", "96")
        },
        "llama.cpp": ("llama.cpp llama-server, the same FIM prompt (anchored)", llama, "fim-prompt",
                      ()),
        "llama.cpp-cursor": ("llama.cpp llama-server, the cursor FIM prompt", llama, "fim-prompt",
                             ("--fim-layout", "cursor")),
        "llama.cpp-infill": ("llama.cpp llama-server /infill (its repo-level prompt)", llama,
                             "infill", ()),
    }
    rows = {}
    with tempfile.TemporaryDirectory(prefix="fim-quality-") as tmp:
        for key in args.configs.split(","):
            name, cmd, protocol, eval_args = configs[key]
            if key.startswith("llama.cpp") and not llama_server_binary().exists():
                print(
                    "llama-server not built (python benchmarks/baselines/llama_server.py install): "
                    "skipped",
                    file=sys.stderr)
                continue
            port = free_port()
            cmd = [*cmd, "--port", str(port)
                   ] + (["--host", "127.0.0.1"] if key.startswith("llama.cpp") else [])
            rows[name] = run_eval(key, cmd, port, protocol, args, Path(tmp), eval_args)
            print(f"{name}: pass@1 {100 * rows[name]['pass_at_1']:.1f}% of {rows[name]['tasks']}",
                  flush=True)
    print(
        f"\n| configuration ({Path(model).name}) | pass@1 | tasks | s / task |\n|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {100 * r['pass_at_1']:.1f}% | {r['tasks']} | {r['mean_seconds']:.2f} |")
    if args.out:
        write_json(
            args.out, {
                "machine": machine(), "model": Path(model).name,
                "benchmark": "HumanEval single-line infilling", "cursor": args.cursor,
                "limit": args.limit, "rows": rows
            })


if __name__ == "__main__":
    main()
