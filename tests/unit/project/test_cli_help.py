"""Every subcommand's --help renders: a stray % in a help string (argparse formats them) made
`warmpath simulate --help` crash with a traceback."""

import subprocess
import sys

import pytest

COMMANDS = ["fetch-model", "serve", "plan", "route", "bench", "simulate", "eval", "complete", "lsp"]


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_renders(command):
    argv = [sys.executable, "-m", "warmpath.cli", *([command] if command else []), "--help"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage: " in done.stdout and "Traceback" not in done.stderr


def test_every_flag_of_every_subcommand_says_what_it_does():
    import argparse
    import re

    from warmpath.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(COMMANDS) <= set(sub.choices)
    bare = [(name, a.option_strings or a.dest) for name, sp in sub.choices.items()
            for a in sp._actions if not isinstance(a, argparse._HelpAction) and
            not re.sub(r"\(default: [^)]*\)|\(repeatable\)", "", a.help or "").strip()]
    assert bare == []


def test_serve_and_route_flags_read_their_help_from_the_config_fields_comments():
    from warmpath.config import EngineConfig, RouterConfig, ServerConfig
    from warmpath.config_help import field_docs

    for cls in (EngineConfig, ServerConfig, RouterConfig):
        docs = field_docs(cls)
        assert all(docs.values()), [k for k, v in docs.items() if not v]
    assert field_docs(ServerConfig)["header_timeout"].startswith(
        "seconds to send a request's headers")  # inherited
    # lines above
    assert field_docs(EngineConfig)["memory_budget"].startswith("One budget for resident weights")
    # its own line's
    assert field_docs(RouterConfig)["first_byte_timeout"].startswith("seconds from sending")
    done = subprocess.run([sys.executable, "-m", "warmpath.cli", "serve", "--help"],
                          capture_output=True, text=True, timeout=120)
    text = " ".join(done.stdout.split())  # argparse wraps lines at the terminal's width
    assert "tokens per KV block" in text and "Where a fill-in-the-middle answer ends" in text
