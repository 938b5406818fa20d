"""The real-repository set's source files: real projects in Python, JavaScript / TypeScript, Go and
Rust, fetched from the package registries at pinned versions (PyPI wheels, npm tarballs, Debian's
golang-*-dev and librust-*-dev packages, which carry the source), each archive's sha256 checked,
cached in $WARMPATH_HOME/corpus, read from the archive without installing anything.

Half the projects were first published in 2025 or later, after Qwen2.5-Coder's training data was
collected, so a score on them is not a score on memorised code (`Project.since`). Debian's files
come from its pool: an unstable package's pinned version leaves the pool once a newer one replaces
it, and the fetch then says so."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from warmpath.models.registry import pip_download
from warmpath.store import home_dir

DEBIAN = "http://deb.debian.org/debian/"
NPM = "https://registry.npmjs.org/"
LANGUAGES = ("python", "javascript", "typescript", "go", "rust")
EXTENSIONS = {".py": "python", ".js": "javascript", ".ts": "typescript", ".go": "go", ".rs": "rust"}


class CorpusError(RuntimeError):
    pass


@dataclass(frozen=True)
class Artifact:
    """One archive on a registry: `registry` pypi (a wheel: `ref` is the pip spec), npm or debian
    (`ref` is the path under the registry's root); `file` its name; `sha256` pinned."""

    registry: str
    ref: str
    file: str
    sha256: str

    @property
    def url(self) -> str:
        return (NPM if self.registry == "npm" else DEBIAN) + self.ref


@dataclass(frozen=True)
class Project:
    name: str  # as its registry names it
    since: int  # the year it was first published
    artifact: Artifact
    root: str  # the folder inside the archive its files' paths start from
    files: tuple[str, ...]  # the files holes are cut in, under root
    # under root: where its other files are (repository context, the cross-file slice)
    context: str = ""


PROJECTS = (
    Project(
        "click", 2014,
        Artifact("pypi", "click==8.1.8", "click-8.1.8-py3-none-any.whl",
                 "63c132bbbed01578a06712a2d1f497bb62d9c1c0d329b7903a866228027263b2"), "",
        ("click/parser.py", "click/utils.py", "click/formatting.py", "click/termui.py"), "click/"),
    Project(
        "openai-agents", 2025,
        Artifact("pypi", "openai-agents==0.6.9", "openai_agents-0.6.9-py3-none-any.whl",
                 "9e05a96b7610a7a89d6fd9ba379ff840a1aebca150eebcc4d505743ee458f50b"), "",
        ("agents/guardrail.py", "agents/function_schema.py", "agents/handoffs/history.py",
         "agents/tracing/processors.py"), "agents/"),
    Project(
        "a2a-sdk", 2025,
        Artifact("pypi", "a2a-sdk==0.3.4", "a2a_sdk-0.3.4-py3-none-any.whl",
                 "423f72334b4a4b34cb4da07d5db3b786975de2fbc527236e3ca713b0d08c27e1"), "",
        ("a2a/client/transports/jsonrpc.py",
         "a2a/server/request_handlers/default_request_handler.py", "a2a/utils/telemetry.py"),
        "a2a/"),
    Project(
        "express", 2010,
        Artifact("npm", "express/-/express-4.21.2.tgz", "express-4.21.2.tgz",
                 "fc43a91e7dc7affb53c6ad7123a4f35485ed3c45226ae7a3847b7738e783e008"), "package/",
        ("lib/router/index.js", "lib/response.js", "lib/request.js", "lib/application.js",
         "lib/utils.js"), "lib/"),
    Project(
        "@tanstack/db", 2025,
        Artifact("npm", "@tanstack/db/-/db-0.15.2.tgz", "tanstack-db-0.15.2.tgz",
                 "18682e004ce628f78fd144409e8780c9cca774eaac141f953d1a146a573738b9"), "package/",
        ("src/utils/btree.ts", "src/collection/changes.ts", "src/scheduler.ts", "src/SortedMap.ts",
         "src/collection/lifecycle.ts"), "src/"),
    Project(
        "github.com/spf13/cobra", 2013,
        Artifact(
            "debian",
            "pool/main/g/golang-github-spf13-cobra/golang-github-spf13-cobra-dev_1.8.1-1_all.deb",
            "golang-github-spf13-cobra-dev_1.8.1-1_all.deb",
            "139ec86efbe938a99ae70a7d695334fdc7c691a617c5739f36932b0de4ecdfd9"),
        "usr/share/gocode/src/github.com/spf13/cobra/",
        ("args.go", "flag_groups.go", "completions.go", "command.go"), ""),
    Project(
        "github.com/google/jsonschema-go", 2025,
        Artifact(
            "debian", "pool/main/g/golang-github-google-jsonschema-go/"
            "golang-github-google-jsonschema-go-dev_0.4.3-1_all.deb",
            "golang-github-google-jsonschema-go-dev_0.4.3-1_all.deb",
            "a3539e41d958c41f1c10b6323d7b2155c8873b3b9de4cced077ad16f9ad996d0"),
        "usr/share/gocode/src/github.com/google/jsonschema-go/",
        ("jsonschema/validate.go", "jsonschema/infer.go", "jsonschema/resolve.go",
         "jsonschema/util.go"), "jsonschema/"),
    Project(
        "semver", 2015,
        Artifact("debian", "pool/main/r/rust-semver/librust-semver-dev_1.0.23-1_amd64.deb",
                 "librust-semver-dev_1.0.23-1_amd64.deb",
                 "971d718b2bbc0feb08cfa931c1eb76e5d3f1e7713ead75d2e4cc784675ab1487"),
        "usr/share/cargo/registry/semver-1.0.23/",
        ("src/parse.rs", "src/eval.rs", "src/identifier.rs", "src/impls.rs"), "src/"),
    Project(
        "anyhow", 2019,
        Artifact("debian", "pool/main/r/rust-anyhow/librust-anyhow-dev_1.0.95-1_amd64.deb",
                 "librust-anyhow-dev_1.0.95-1_amd64.deb",
                 "a92915413743ca59cabb2f433564a8f8ad001d867f5a89d47c8dc703941b0f99"),
        "usr/share/cargo/registry/anyhow-1.0.95/", ("src/context.rs", "src/error.rs"), "src/"),
    Project(
        "rmcp", 2025,
        Artifact("debian", "pool/main/r/rust-rmcp/librust-rmcp-dev_3.3.0-1_amd64.deb",
                 "librust-rmcp-dev_3.3.0-1_amd64.deb",
                 "537800601e04389575adaef1cae379c7fe30958af951a9b215f2ad9bc0d900b1"),
        "usr/share/cargo/registry/rmcp-3.3.0/",
        ("src/handler/server.rs", "src/transport/worker.rs", "src/transport/async_rw.rs",
         "src/model/content.rs"), "src/"),
)


@dataclass(frozen=True)
class SourceFile:
    project: str
    since: int
    path: str  # under the project's root, e.g. "lib/router/index.js"
    language: str
    text: str


def language_of(path: str) -> str | None:
    return EXTENSIONS.get(Path(path).suffix)


def corpus_dir() -> Path:
    return home_dir("corpus")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _http_get(url: str, dest: Path) -> None:
    with httpx.Client(timeout=httpx.Timeout(60.0), follow_redirects=True) as http:
        r = http.get(url)
    if r.status_code == 404:
        raise CorpusError(
            f"{url} is gone from its registry (404): the pin in warmpath/eval/corpus.py needs the "
            "version the registry now serves")
    r.raise_for_status()
    dest.write_bytes(r.content)


def fetch(artifact: Artifact, download: Callable[[Artifact, Path], None] | None = None) -> bytes:
    """The archive's bytes, downloaded once into corpus_dir(); its sha256 checked at every read."""
    path = corpus_dir() / artifact.file
    if not path.is_file():
        with tempfile.TemporaryDirectory(dir=corpus_dir(), prefix=".fetch-") as tmp:
            got = Path(tmp) / artifact.file
            if download is not None:
                download(artifact, got)
            elif artifact.registry == "pypi":
                pip_download(artifact.ref, Path(tmp))
            else:
                _http_get(artifact.url, got)
            if not got.is_file():
                raise CorpusError(f"fetching {artifact.ref} gave no {artifact.file}")
            if _sha256(got.read_bytes()) != artifact.sha256:
                raise CorpusError(
                    f"{artifact.file} from {artifact.registry} does not have the pinned sha256")
            # whole or not at all: a torn download is never read as the archive
            os.replace(got, path)
    data = path.read_bytes()
    if _sha256(data) != artifact.sha256:
        raise CorpusError(f"{path} does not have the pinned sha256; delete it and run again")
    return data


def _deb_data(deb: bytes) -> bytes:
    """The data.tar.* member of a Debian package (an `ar` archive)."""
    if not deb.startswith(b"!<arch>\n"):
        raise CorpusError("not a Debian package")
    at = 8
    while at + 60 <= len(deb):
        name, size = deb[at:at + 16].decode().strip().rstrip("/"), int(deb[at + 48:at +
                                                                           58].decode().strip())
        if name.startswith("data.tar"):
            return deb[at + 60:at + 60 + size]
        at += 60 + size + (size & 1)
    raise CorpusError("a Debian package without data.tar")


def members(artifact: Artifact, data: bytes) -> dict[str, str]:
    """Every source file of a known language in the archive, by its path in the archive, as text."""
    out: dict[str, str] = {}
    if artifact.registry == "pypi":
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            for name in zf.namelist():
                if language_of(name):
                    out[name] = zf.read(name).decode("utf-8")
        return out
    raw = _deb_data(data) if artifact.registry == "debian" else data
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        for m in tar.getmembers():
            name = m.name.removeprefix("./")
            if m.isfile() and language_of(name):
                out[name] = tar.extractfile(m).read().decode("utf-8", "replace")
    return out


def load(project: Project,
         download: Callable[[Artifact, Path], None] | None = None) -> list[SourceFile]:
    """The project's files that holes are cut in, in its list's order."""
    found = members(project.artifact, fetch(project.artifact, download))
    files = []
    for path in project.files:
        text = found.get(project.root + path)
        if text is None:
            raise CorpusError(f"{project.artifact.file} has no {project.root + path}")
        files.append(SourceFile(project.name, project.since, path, language_of(path), text))
    return files


def neighbours(project: Project,
               download: Callable[[Artifact, Path], None] | None = None) -> list[SourceFile]:
    """The project's other source files (its repository context): every file of the holes' languages
    under its context folder, tests and examples left out."""
    langs = {language_of(p) for p in project.files}
    found = members(project.artifact, fetch(project.artifact, download))
    out = []
    for name, text in sorted(found.items()):
        path = name.removeprefix(project.root)
        if not name.startswith(project.root + project.context) or language_of(path) not in langs:
            continue
        if any(part in ("tests", "test", "examples", "benches") for part in Path(path).parts) or \
                path.endswith(("_test.go", ".test.ts", ".d.ts", ".pyi")):
            continue
        out.append(SourceFile(project.name, project.since, path, language_of(path), text))
    return out


def fetch_all() -> None:
    """Every pinned archive into the cache (`make setup`). A Debian pin gone from the pool only
    warns: the rest of the set still runs, and `warmpath eval --suite repo` names the missing
    project."""
    import sys

    for project in PROJECTS:
        try:
            fetch(project.artifact)
        except (CorpusError, httpx.HTTPError) as e:
            print(f"warning: the repository set's {project.name} is not available: {e}",
                  file=sys.stderr)
