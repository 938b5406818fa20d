"""`warmpath eval --suite repo` (eval/repo.py): real projects' files from the registries (pinned,
sha256-checked, cached by `make setup`), holes cut with tree-sitter, sent as each editor sends them
and judged as it inserts the answer. End to end on a small slice of the PyPI and npm projects
against a real server (tiny model, loopback)."""

import asyncio
import json
import re
import subprocess
import sys

import pytest

from warmpath.client.completion import Target
from warmpath.eval import editors, repo
from warmpath.eval.corpus import PROJECTS, CorpusError, fetch
from warmpath.eval.holes import KINDS, Hole
from warmpath.eval.judge import judge

STABLE = ["click", "express"]  # PyPI and npm keep every version: the slice a test may rely on


@pytest.fixture(scope="module")
def holes():
    return repo.holes(projects=STABLE)


def test_the_holes_are_the_same_every_time_of_every_kind_and_cut_from_the_real_file(holes):
    assert [h.id for h in holes] == [h.id for h in repo.holes(projects=STABLE)]
    main = [h for h in holes if not h.slice]
    assert {h.kind
            for h in main} == set(KINDS) and {h.language
                                              for h in main} == {"python", "javascript"}
    for h in holes:
        assert h.prefix + h.middle + h.suffix == h.text and h.middle.strip()
        if h.kind in ("line-rest", "line", "call-args", "condition"):
            assert "\n" not in h.middle
        else:
            assert h.middle.count("\n") >= 1
    cross = [h for h in holes if h.slice == "cross-file+context"]
    assert cross and all(len(h.extra) == 1 and h.extra[0][0] != h.path for h in cross)
    for h in cross:  # the middle names something the context defines and its own file does not
        names = set(re.findall(r"[A-Za-z_]\w*", h.middle))
        assert any(n in h.extra[0][1] and not re.search(rf"\b{n}\b", h.prefix + h.suffix)
                   for n in names), h.id


def test_a_pinned_archive_with_another_sha256_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("WARMPATH_HOME", str(tmp_path))
    project = PROJECTS[0]
    with pytest.raises(CorpusError, match="pinned sha256"):
        fetch(project.artifact, download=lambda artifact, dest: dest.write_bytes(b"not the wheel"))
    assert not (tmp_path / "corpus" / project.artifact.file).exists()  # nothing kept


def test_the_right_answer_is_exact_as_each_editor_inserts_it(holes):
    for h in holes:
        b = editors.Buffer(h)
        # llama.vim sends a line of only whitespace empty: the model writes the indentation itself
        vim = b.line_before + h.middle if not (b.line_before + b.line_after).strip() else h.middle
        for ins in (editors.llama_vim_insert(h, vim), editors.zed_insert(h, h.middle),
                    editors.Insertion(h.middle)):
            v = judge(h, ins)
            assert v.exact and v.similarity == 1.0 and v.first_line, h.id


def test_what_llama_vim_discards_and_what_each_judgement_says():
    text = "def f(x):\n    y = x\n    return y\n"
    hole = Hole("t", "p", 2025, "python", "t.py", "line", text, text.index("y = x"),
                text.index(" x\n") + 2)
    assert editors.llama_vim_insert(hole, "    return y").text == ""  # it repeats the next line
    assert editors.llama_vim_insert(hole, "\n\n").text == ""  # nothing but empty lines
    whole = judge(hole, editors.llama_vim_insert(hole, "    y = x\n    z = 1"))
    # right first line, then more
    assert not whole.exact and whole.first_line and 0 < whole.similarity < 1
    assert judge(hole, editors.llama_vim_insert(hole, "    y = x")).exact


def test_continue_and_zed_insert_what_their_filters_keep():
    text = "def f(x):\n    y = g(x)\n    return y\n\nprint(f(1))\n"
    hole = Hole("t", "p", 2025, "python", "t.py", "line", text, text.index("y = g"),
                text.index("(x)\n") + 3)
    # the first blank line ends it
    assert editors.continue_insert(hole, "y = g(x)\n\n    z = 1").text == "y = g(x)"
    # the line below: ends it
    assert editors.continue_insert(hole, "y = g(x)\n    return y\n").text == "y = g(x)"
    # its stop strings
    assert editors.continue_insert(hole, "y = g(x)<|fim_pad|>junk").text == "y = g(x)"
    mid = Hole("m", "p", 2025, "python", "t.py", "call-args", text, text.index("x)\n"),
               text.index(")\n    return"))
    # several lines replace the rest of the line
    assert editors.continue_insert(mid, "x,\n        w)").replaces == 1
    assert editors.zed_insert(hole, "y = g(x)<|endoftext|>more").text == "y = g(x)"
    prefix, suffix = editors.zed_window(
        Hole("z", "p", 2025, "python", "t.py", "line", "a\n" * 2000 + "b\n" * 2000, 4000, 4001))
    assert len((prefix + suffix).encode()) <= editors.ZED_BYTES + 2 and prefix.endswith("a\n") and \
        suffix.startswith("\nb")


@pytest.mark.slow
@pytest.mark.server
def test_the_suite_runs_end_to_end_against_a_server_for_every_client(server, holes, tmp_path):
    url, _ = server
    some = repo.spread([h for h in holes if not h.slice], 5) + [h for h in holes if h.slice][:2]
    for client in editors.CLIENTS:
        results = asyncio.run(repo.run(Target(url), client, some, progress=False))
        assert [r.id for r in results] == [h.id for h in some]
        assert not [r.error for r in results if r.error], client
        assert all(r.seconds > 0 for r in results)
        for r, h in zip(results, some, strict=True):  # judged on what the editor inserted
            assert r.exact == judge(h, editors.CLIENTS[client].insert(h, r.answer)).exact
    out = tmp_path / "repo.json"
    cli = subprocess.run([
        sys.executable, "-m", "warmpath.cli", "eval", "--suite", "repo", "--target", url,
        "--projects", ",".join(STABLE), "--limit", "6", "--out",
        str(out)
    ], capture_output=True, text=True, timeout=600)
    assert cli.returncode == 0, cli.stderr
    assert "| **all** | 6 |" in cli.stdout and "exact as inserted" in cli.stdout
    data = json.loads(out.read_text())
    assert data["suite"] == "repo" and data["client"] == "llama.vim" and len(data["results"]) == 6
    assert data["summary"]["overall"]["holes"] + sum(
        r["holes"] for r in data["summary"].get("cross_file", {}).values()) == 6
    # the server reports each answer's confidence
    assert data["summary"]["confidence"][0]["threshold"] == 0.0
