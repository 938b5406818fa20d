"""How many threads a native-only step uses: every core, unless another process holds one. A step
spread over every core then waits, at each of its ~300 parallel regions, for the thread that lost
its core (four times the time with one of two cores taken on one CPU, no request done at all in 20 s
on another: benchmarks/competing_load.py), while one thread runs at the speed of the core it has.
What the OS counts tells which case this is, with no trial steps: over a window of steps, the CPU
time that neither this process got nor the machine left idle (another process took it: go to one
thread), and the machine's idle time while one thread runs (a free core: go back to every core).
This process's own serial stretches (one decode row's Python work) leave cores idle, not taken, so
they never read as another process. Only for steps whose numbers do not depend on the thread count
(the native kernel's: each output and each attention span is computed by one thread, merged in a
fixed order)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

WINDOW_S = 0.5  # seconds of steps per decision
TAKEN = 0.25  # share of the machine's CPU time others took above which another process holds a core
FREE_CORE = 0.5  # idle cores (per second of steps) above this while on one thread: a core came free


def machine_idle_s() -> float | None:
    """Seconds all cores have been idle (the `cpu` line of /proc/stat: idle + iowait), None where
    unknown."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        return (int(fields[4]) + int(fields[5])) / 100.0  # USER_HZ
    except (OSError, IndexError, ValueError):
        return None


def others_share(wall_s: float, own_cpu_s: float, idle0: float | None, idle1: float | None,
                 cores: int) -> float:
    """The share of the machine's CPU time over wall_s seconds that other processes took: what
    neither this process used nor the machine left idle (idle0, idle1: machine_idle_s() at the start
    and end; unknown: only what this process left unused counts)."""
    if wall_s <= 0:
        return 0.0
    idle = idle1 - idle0 if idle0 is not None and idle1 is not None else 0.0
    return max(0.0, 1 - (own_cpu_s + idle) / (wall_s * cores))


@dataclass
class Sample:
    wall: float
    cpu: float
    idle: float | None


def sample() -> Sample:
    return Sample(time.perf_counter(), time.process_time(), machine_idle_s())


@dataclass
class ThreadChoice:
    cores: int
    threads: int = 0  # the choice now (0: every core, set in __post_init__)
    wall: float = 0.0  # this window's step seconds, CPU seconds and machine idle seconds
    cpu: float = 0.0
    idle: float = 0.0
    switches: int = 0

    def __post_init__(self):
        self.threads = self.threads or self.cores

    def record(self, start: Sample, end: Sample, threads: int) -> None:
        """One step run with `threads` threads, from start to end."""
        if threads != self.threads:
            return
        self.wall += end.wall - start.wall
        self.cpu += end.cpu - start.cpu
        if start.idle is not None and end.idle is not None:
            self.idle += end.idle - start.idle
        if self.wall < WINDOW_S:
            return
        if self.threads > 1 and others_share(self.wall, self.cpu, 0.0, self.idle,
                                             self.cores) > TAKEN:
            self.threads, self.switches = 1, self.switches + 1
        elif self.threads == 1 and self.idle / self.wall > FREE_CORE:
            self.threads, self.switches = self.cores, self.switches + 1
        self.wall = self.cpu = self.idle = 0.0
