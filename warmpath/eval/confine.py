"""The inside of eval's sandbox: eval/sandbox.py runs this file as a script, as the evaluator's
user, once a task. It sets up the namespaces, mounts and rlimits, says on the status pipe what held,
then becomes PID 1 of the new namespace with the answer under it. The standard library only, and
lean (no json, no re): it starts every time."""

from __future__ import annotations

import ctypes
import os
import resource
import select
import signal
import stat
import sys

# The script's arguments, in order (eval/sandbox.py writes them).
ARGS = ("program", "python", "prefix", "scratch", "hide", "parent", "status_fd",
        "cpu_s", "memory_bytes", "processes", "file_bytes", "scratch_bytes")
# Its report, one line on the status pipe: "held <what held, space-separated>\t<what was refused>",
# or, from the answer's process before its exec, "error <why>".
HELD, ERROR = "held ", "error "
NOBODY = 65534
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
MS_NOATIME, MS_NODIRATIME, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = (1024, 2048, 1 << 18, 1 << 21,
                                                                      1 << 24)
# A remount in a user namespace must keep the flags the mount had (the kernel locks them): read
# back, kept.
KEPT_FLAGS = {
    "noexec": MS_NOEXEC, "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME
}
# the only devices it may open
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _mount(source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    enc = [None if s is None else os.fsencode(s) for s in (source, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]))


def _die_with_parent() -> None:
    _check(_libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0))


def _mounts() -> list[tuple[str, int]]:
    """Every mount point, with the flags a remount of it must keep, from /proc/self/mountinfo."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            path = fields[4]
            for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
                path = path.replace(code, char)
            options = fields[5].split(",")
            flags = sum(v for k, v in KEPT_FLAGS.items() if k in options)
            found.append(
                (path, flags if flags & (MS_NOATIME | MS_RELATIME) else flags | MS_STRICTATIME))
    return found


def _blocked(path: str) -> str | None:
    """The first directory above `path` that nobody may not enter (e.g. /root, above a pyenv)."""
    parts = path.split("/")
    for i in range(2, len(parts)):
        above = "/".join(parts[:i])
        if not os.stat(above).st_mode & stat.S_IXOTH:
            return above
    return None


def _lock_files(cfg: dict, as_nobody: bool) -> None:
    """In the new mount namespace: every mount read-only, nosuid and nodev, the scratch directory a
    tmpfs, $WARMPATH_HOME under an empty one."""
    # nothing done here reaches the evaluator's namespace
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    prefix, scratch, hide = cfg["prefix"], cfg["scratch"], cfg["hide"]
    if as_nobody and (top := _blocked(prefix)):
        # an empty tmpfs over it, the interpreter bound back in place
        keep = os.open(prefix, os.O_PATH)
        _mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        os.makedirs(prefix, 0o755)
        _mount(f"/proc/self/fd/{keep}", prefix, None, MS_BIND | MS_REC)
        os.close(keep)
    owner = f",uid={NOBODY},gid={NOBODY}" if as_nobody else ""
    _mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={cfg['scratch_bytes']},mode=0700{owner}")
    if os.path.isdir(hide) and not any(
            os.path.commonpath([hide, p]) == hide for p in (prefix, scratch)):
        _mount("tmpfs", hide, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "size=4k,mode=0555")
    for device in filter(os.path.exists, DEVICES):
        # bound over themselves: mounts of their own, usable below
        _mount(device, device, None, MS_BIND)
    for path, flags in _mounts():
        if path != scratch:
            nodev = 0 if path in DEVICES else MS_NODEV
            try:
                _mount(None, path, None,
                       MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | nodev | flags)
            except FileNotFoundError:  # under a tmpfs laid over it: out of reach already
                pass


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def _become_the_answer(cfg: dict, as_nobody: bool) -> None:
    """Limits, identity, exec: never returns (a failure is reported on the status pipe)."""
    try:
        for limit, value in ((resource.RLIMIT_CPU, cfg["cpu_s"]), (resource.RLIMIT_AS,
                                                                   cfg["memory_bytes"]),
                             (resource.RLIMIT_NPROC,
                              cfg["processes"]), (resource.RLIMIT_FSIZE,
                                                  cfg["file_bytes"]), (resource.RLIMIT_CORE, "0")):
            # soft and hard: it cannot raise them back
            resource.setrlimit(limit, (int(value), int(value)))
        os.chdir(cfg["scratch"])  # the tmpfs now over it, where there is one
        if as_nobody:
            os.chown(".", NOBODY, NOBODY)  # the plain directory where no tmpfs was laid over it
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
        elif os.geteuid() == 0:
            # root that cannot be nobody: a user namespace takes its capabilities at exec
            try:
                _check(_libc.unshare(CLONE_NEWUSER))
            except OSError:
                pass
        # closed by the exec: the evaluator's cue it started
        os.set_inheritable(int(cfg["status_fd"]), False)
        python = cfg["python"]
        os.execve(python, [python, "-I", "-c", cfg["program"]], dict(os.environ))
    except OSError as e:
        os.write(int(cfg["status_fd"]), f"{ERROR}cannot start the answer: {e}\n".encode())
    os._exit(127)


def _launch(cfg: dict) -> None:
    """Namespaces, mounts, the report, then PID 1 and the answer under it."""
    _die_with_parent()
    if os.getppid() != int(cfg["parent"]):  # the evaluator died before the line above
        os._exit(1)
    uid, gid = os.geteuid(), os.getegid()
    root, why = uid == 0, []
    spaced = locked = False
    try:
        _check(
            _libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID
                          | (0 if root else CLONE_NEWUSER)))
        spaced = True
    except OSError as e:
        why.append(f"no namespaces: {e.strerror}")
    # Root's answer runs as nobody: an interpreter out of nobody's reach is bound into it (needs the
    # namespace).
    as_nobody = root and (spaced or _blocked(cfg["prefix"]) is None)
    if spaced:
        try:
            if not root:
                # the user as itself in its namespace: files it creates on the tmpfs need an owner
                # there
                for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                                   ("gid_map", f"{gid} {gid} 1")):
                    with open(f"/proc/self/{name}", "w") as f:
                        f.write(text)
            _lock_files(cfg, as_nobody)
            locked = True
        except OSError as e:
            why.append(f"files not locked: {e}")
            as_nobody = as_nobody and _blocked(cfg["prefix"]) is None
    if root and not as_nobody:
        why.append(
            "runs as uid 0 (without capabilities where a user namespace is allowed): RLIMIT_NPROC "
            "is void"
        )
    held = [name for name, ok in (("network", spaced), ("processes", spaced), ("files", locked),
                                  ("unprivileged", as_nobody or not root)) if ok]
    status = int(cfg["status_fd"])
    os.write(status, f"{HELD}{' '.join(held)}\t{'; '.join(why)}\n".encode())
    if not spaced:
        _become_the_answer(cfg, as_nobody)
    # PID 1 sees the launcher die between its fork and its PR_SET_PDEATHSIG
    alive_r, alive_w = os.pipe()
    init = os.fork()
    if init == 0:
        # PID 1 of the new namespace: when it exits, the kernel kills everything else in it
        os.close(alive_w)
        _die_with_parent()
        if select.select([alive_r], [], [], 0)[0]:
            os._exit(1)
        os.close(alive_r)
        answer = os.fork()
        if answer == 0:
            _become_the_answer(cfg, as_nobody)
        os.close(status)
        while True:  # orphans are reparented here: reap them until the answer itself exits
            pid, wait_status = os.waitpid(-1, 0)
            if pid == answer:
                os._exit(_exit_code(wait_status))
    os.close(alive_r)
    os.close(status)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(init, signal.SIGKILL))  # the evaluator's stop
    os._exit(_exit_code(os.waitpid(init, 0)[1]))


if __name__ == "__main__":
    _launch(dict(zip(ARGS, sys.argv[1:], strict=True)))
