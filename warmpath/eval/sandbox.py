"""Running a model's answer without trusting it. `run_python()` starts eval/confine.py (as the
evaluator's user), which shuts the answer in and execs it in a bare interpreter (`python -I`, no
venv); this side bounds its time and output, reads the report of what held, and ends the run.

Where the kernel allows namespaces (root, or user namespaces for anyone else) the answer has no
network, a PID namespace whose PID 1 takes everything along when the answer exits or the run is
stopped, and every mount read-only, nodev and nosuid but its scratch tmpfs, $WARMPATH_HOME under an
empty one. Root's answer runs as nobody (where it can), so RLIMIT_NPROC binds it; anyone else's is
that user without capabilities. Without namespaces the answer keeps the user's files and network
(`Isolation` says so): the rlimits, the process group and an environment whose HOME, WARMPATH_HOME,
XDG_* and TMPDIR are the scratch directory are all that stand between."""

from __future__ import annotations

import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from warmpath.eval.confine import ARGS, ERROR, HELD

CHILD = Path(__file__).with_name("confine.py")  # the inside, run as a script
FACETS = ("network", "processes", "files", "unprivileged")


@dataclass(frozen=True)
class Limits:
    # wall clock; the whole process group (and PID namespace) is killed at it
    timeout_s: float = 10.0
    cpu_s: int | None = None  # RLIMIT_CPU per process (default: the timeout rounded up, plus one)
    memory_bytes: int = 2 << 30  # RLIMIT_AS
    processes: int = 64  # RLIMIT_NPROC: binds any user but root, so root's answers run as nobody
    file_bytes: int = 16 << 20  # RLIMIT_FSIZE
    scratch_bytes: int = 64 << 20  # the tmpfs it works in
    output_bytes: int = 1 << 20  # stdout and stderr kept; more stops the run as a failure


@dataclass(frozen=True)
class Isolation:
    network: bool = False  # own network namespace: nothing to connect to, not even 127.0.0.1
    processes: bool = False  # own PID namespace: nothing it starts outlives the run
    files: bool = False  # every mount read-only but its scratch tmpfs; $WARMPATH_HOME covered
    unprivileged: bool = False  # neither root nor capable: its rlimits hold, RLIMIT_NPROC too
    why: str = ""  # what the system refused

    def describe(self) -> str:
        held = [k for k in FACETS if getattr(self, k)]
        missing = [k for k in FACETS if not getattr(self, k)]
        text = f"isolated: {', '.join(held) or 'nothing'}"
        return text + (f"; NOT isolated: {', '.join(missing)} ({self.why})" if missing else "")


@dataclass(frozen=True)
class Outcome:
    returncode: int  # 128 + N: killed by signal N
    timed_out: bool
    output: bytes  # the first Limits.output_bytes of stdout and stderr together
    output_overflow: bool
    isolation: Isolation

    @property
    def passed(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.output_overflow


def probe() -> Isolation:
    """What the sandbox holds on this machine, as this user (an empty program run in it)."""
    return run_python("").isolation


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the answer): every run would fail, so it is raised, not
    scored."""


def run_python(program: str, limits: Limits = Limits()) -> Outcome:
    """`program` run by `python -I -c` in the sandbox, stopped at the limits."""
    with tempfile.TemporaryDirectory(prefix="warmpath-eval-") as scratch:
        status_r, status_w = os.pipe()
        try:
            args = {
                "program": program, "python": os.path.realpath(
                    getattr(sys, "_base_executable",
                            sys.executable)), "prefix": os.path.realpath(sys.base_prefix),
                "scratch": scratch, "hide": _warmpath_home(), "parent": os.getpid(),
                "status_fd": status_w, "cpu_s": limits.cpu_s or math.ceil(limits.timeout_s) + 1,
                "memory_bytes": limits.memory_bytes, "processes": limits.processes,
                "file_bytes": limits.file_bytes, "scratch_bytes": limits.scratch_bytes
            }
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S",
                 str(CHILD), *(str(args[k]) for k in ARGS)], cwd=scratch, env=_environment(scratch),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                pass_fds=(status_w, ), start_new_session=True)
        finally:
            os.close(status_w)
        with proc:
            return _watch(proc, status_r, limits)


def _warmpath_home() -> str:
    home = os.environ.get("WARMPATH_HOME") or os.path.join(os.path.expanduser("~"), ".cache",
                                                           "warmpath")
    return os.path.realpath(home)


def _environment(scratch: str) -> dict[str, str]:
    """The answer's environment: every place a program looks for a home is the scratch directory."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    for name in ("HOME", "WARMPATH_HOME", "TMPDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME",
                 "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR"):
        env[name] = scratch
    return env


def _ready(fds: list[int], timeout_s: float) -> set[int]:
    """Those of `fds` readable (or at their end; a pidfd: its process exited) within `timeout_s`.
    poll, not select: an evaluator with many files open may hand out descriptors past select's
    1024."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return {fd for fd, _ in poller.poll(max(0.0, timeout_s) * 1000)}


class _Pipe:
    """What came through a pipe: the first `cap` bytes kept, all of them counted."""

    def __init__(self, fd: int, cap: int):
        self.fd, self.cap, self.kept, self.total, self.open = fd, cap, bytearray(), 0, True

    def read(self) -> None:
        data = os.read(self.fd, 1 << 16)
        self.open = bool(data)
        self.total += len(data)
        self.kept += data[:max(0, self.cap - len(self.kept))]

    def drain(self) -> None:
        """What is left in it without waiting (a process that escaped may hold it open)."""
        while self.open and self.total <= self.cap and _ready([self.fd], 0):
            self.read()


def _watch(proc: subprocess.Popen, status_r: int, limits: Limits) -> Outcome:
    """Read the output (capped) and the child's report until it exits, the timeout or the cap; then
    stop it."""
    assert proc.stdout is not None
    out, status = _Pipe(proc.stdout.fileno(), limits.output_bytes), _Pipe(status_r, 4096)
    pidfd = os.pidfd_open(proc.pid)
    deadline, timed_out = time.monotonic() + limits.timeout_s, False
    try:
        while out.total <= out.cap:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            pipes = [p for p in (out, status) if p.open]
            ready = _ready([*(p.fd for p in pipes), pidfd], left)
            if pidfd in ready:
                break
            for pipe in pipes:
                if pipe.fd in ready:
                    pipe.read()
        _stop(proc, pidfd, gently=getattr(_isolation(status.kept), "processes", False))
        status.drain()
        out.drain()
    finally:
        os.close(pidfd)
        os.close(status_r)
    isolation, errors = _isolation(status.kept), _lines(status.kept, ERROR)
    if errors:
        raise SandboxError(errors[0])
    if isolation is None and not timed_out and out.total <= out.cap:
        raise SandboxError(
            f"the sandbox did not start: {bytes(out.kept[-2000:]).decode(errors='replace')}")
    # as PID 1 relays a signal
    code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    return Outcome(code, timed_out, bytes(out.kept), out.total > out.cap,
                   isolation or Isolation(why="stopped before the sandbox reported"))


def _lines(status: bytearray, kind: str) -> list[str]:
    lines = bytes(status).decode(errors="replace").split("\n")[:-1]  # whole lines only
    return [line.removeprefix(kind) for line in lines if line.startswith(kind)]


def _isolation(status: bytearray) -> Isolation | None:
    """The launcher's report (confine.py): what held, and what the system refused."""
    reports = _lines(status, HELD)
    if not reports:
        return None
    held, _, why = reports[0].partition("\t")
    return Isolation(*(name in held.split() for name in FACETS), why)


def _stop(proc: subprocess.Popen, pidfd: int, gently: bool) -> None:
    """End the run: with a PID namespace its launcher kills PID 1, so all of it, and exits once it
    is gone; then SIGKILL to the process group, before the launcher is reaped (its group id cannot
    have been reused)."""
    if gently and not _ready([pidfd], 0):
        os.kill(proc.pid, signal.SIGTERM)
        _ready([pidfd], 2.0)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:  # the group is empty
        pass
    proc.wait()
