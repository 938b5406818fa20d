"""Every subcommand's --help renders: a stray % in a help string (argparse formats them) made `warmpath simulate
--help` crash with a traceback."""

import subprocess
import sys

import pytest

COMMANDS = ["fetch-model", "serve", "plan", "route", "bench", "simulate", "eval", "complete"]


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_renders(command):
    argv = [sys.executable, "-m", "warmpath.cli", *([command] if command else []), "--help"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage: " in done.stdout and "Traceback" not in done.stderr
