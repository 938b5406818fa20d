"""The user documentation stays short, true to the repository and self-contained: README.md and
docs/*.md name only files that exist, link only to files and headings that exist, and cite no path
outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[3]
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]

# A repository path in backticks: relative, made of path characters, a source file or a folder.
REPO_PATH = re.compile(r"`([A-Za-z0-9_][A-Za-z0-9_./-]*/(?:[A-Za-z0-9_.-]+\.(?:py|c|h))?)`")
# Any file of the repository named in backticks (a script, a data file, a result), or a benchmark
# script anywhere.
REPO_FILE = re.compile(
    r"`([A-Za-z0-9_][A-Za-z0-9_./-]*/[A-Za-z0-9_.-]+\.(?:py|c|h|sh|json|md|png|toml))`")
SCRIPT = re.compile(r"(?<![\w/])benchmarks/[A-Za-z0-9_/.-]+\.(?:py|sh)")
RESULT = re.compile(r"benchmarks/results/[A-Za-z0-9_.-]+\.(?:json|png|md)")
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"```.*?```", re.S)


def doc_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_readme_is_short():
    assert README.stat(
    ).st_size <= 25 * 1024, "README.md: move reference detail to docs/, measurements to benchmarks"


def test_architecture_is_short():
    assert ARCHITECTURE.stat().st_size <= 12 * 1024


def test_architecture_names_paths_that_exist():
    paths = REPO_PATH.findall(ARCHITECTURE.read_text())
    assert len(paths) > 20  # the page names modules by their repository paths
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_cited_results_exist(doc: Path):
    missing = sorted({r for r in RESULT.findall(doc.read_text()) if not (ROOT / r).exists()})
    assert not missing, f"{doc_id(doc)} cites result files that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_named_files_and_scripts_exist(doc: Path):
    text = doc.read_text()
    named = {*REPO_FILE.findall(FENCE.sub("", text)), *SCRIPT.findall(text)}
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"{doc_id(doc)} names files that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_no_path_outside_the_repository(doc: Path):
    assert "../shared" not in doc.read_text()


def github_anchors(text: str) -> set[str]:
    """The heading anchors GitHub makes: lower case, punctuation dropped, spaces as hyphens, repeats
    numbered."""
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n, candidate = 0, slug
        while candidate in anchors:
            n += 1
            candidate = f"{slug}-{n}"
        anchors.add(candidate)
    return anchors


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_relative_links_resolve(doc: Path):
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in github_anchors(dest.read_text()):
            broken.append(target)
    assert not broken, f"{doc_id(doc)}: broken links {broken}"


def test_readme_keeps_the_tabby_snippet_the_integration_test_reads():
    # tests/integration/test_tabby_agent.py configures the real tabby-agent with this block, its
    # endpoint replaced.
    m = re.search(r"```toml\n(# ~/\.tabby-client/agent/config\.toml.*?)```", README.read_text(),
                  re.S)
    assert m, "README: the Tabby config.toml snippet"
    assert len(re.findall(r'(?m)^endpoint = "[^"]*"', m.group(1))) == 1
