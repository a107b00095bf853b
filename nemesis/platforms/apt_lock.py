"""Waiting for the host's package manager before the image build runs `apt-get`.

The build installs debootstrap with `apt-get` when it is missing. apt and dpkg take
fcntl write locks on a few files; while another process holds one (an unattended upgrade,
a person's `apt-get install`, another build's install) apt-get fails at once with
`Could not get lock ...`. The build instead says who holds which lock, waits for it
(bounded: APT_LOCK_WAIT_S, saying every PROGRESS_EVERY_S that it still waits) and then
runs apt-get; a lock that apt-get still finds taken (it was taken in between) is waited
for again within the same bound. A lock held past the bound is one error that says whose
it is and what to do.

What it must never do: take a lock itself (it only asks the kernel who holds one, with
F_GETLK, so it can never stand in apt's way), or wait without saying so.
"""

from __future__ import annotations

import fcntl
import os
import struct
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from nemesis.platforms.base import PlatformUnavailable
from nemesis.platforms.build_progress import PROGRESS_EVERY_S, Stage, stream

# dpkg's frontend lock (apt takes it first), dpkg's own, the lists' and the archives'.
APT_LOCKS = (Path("/var/lib/dpkg/lock-frontend"), Path("/var/lib/dpkg/lock"),
             Path("/var/lib/apt/lists/lock"), Path("/var/cache/apt/archives/lock"))
APT_LOCK_WAIT_S = 300.0  # an unattended upgrade may hold it for minutes
POLL_S = 1.0
# How apt-get and dpkg say that the lock was taken.
LOCK_REFUSALS = ("Could not get lock", "Unable to acquire the dpkg frontend lock",
                 "Unable to lock directory", "dpkg frontend lock was locked by another process")

_FLOCK = "hhqqi4x"  # struct flock on Linux x86-64/arm64: type, whence, start, len, pid

Log = Callable[[str], None]


def lock_holder(paths: Sequence[Path] | None = None) -> tuple[Path, int] | None:
    """The first of `paths` (default APT_LOCKS) that another process holds a lock on, with
    that process's pid (0 when the kernel does not say); None when all are free."""
    for path in APT_LOCKS if paths is None else paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # absent (no apt here) or unreadable: nothing to wait for
        try:
            query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
            answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
        except OSError:
            continue
        finally:
            os.close(fd)
        kind, _, _, _, pid = struct.unpack(_FLOCK, answer)
        if kind != fcntl.F_UNLCK:
            return path, max(pid, 0)
    return None


def describe_process(pid: int) -> str:
    """`pid 1234 (apt-get install -y foo)`, or `another process` when unknown."""
    if pid <= 0:
        return "another process"
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        command = " ".join(" ".join(w.decode(errors="replace") for w in words).split())[:80]
    except OSError:
        command = ""
    return f"pid {pid} ({command})" if command else f"pid {pid}"


def wait_for_package_manager(log: Log, deadline: float, poll_s: float = POLL_S,
                             every_s: float = PROGRESS_EVERY_S,
                             paths: Sequence[Path] | None = None) -> None:
    """Return once no package-manager lock is held (at once if none is); say that it waits,
    and every `every_s` that it still does. PlatformUnavailable at `deadline`."""
    held = lock_holder(paths)
    if held is None:
        return
    t0 = last_said = time.monotonic()
    path, pid = held
    log(f"  waiting for the package manager: {describe_process(pid)} holds its lock {path} "
        f"(waiting up to {max(0.0, deadline - t0):.0f} s)")
    while held is not None:
        path, pid = held
        now = time.monotonic()
        if now >= deadline:
            raise PlatformUnavailable(
                f"the package manager's lock {path} was still held by {describe_process(pid)} "
                f"after {now - t0:.0f} s of waiting; let that process finish (or stop it), "
                f"then build again")
        if now - last_said >= every_s:
            last_said = now
            log(f"  still waiting for the package manager's lock {path} "
                f"({describe_process(pid)}), {now - t0:.0f} s")
        time.sleep(min(poll_s, max(0.0, deadline - now)))
        held = lock_holder(paths)
    log(f"  the package manager's lock is free after {time.monotonic() - t0:.0f} s")


def refused_for_lock(output: Sequence[str]) -> bool:
    return any(refusal in line for line in output for refusal in LOCK_REFUSALS)


def apt_get(args: Sequence[str], log: Log, deadline: float, check: bool = True,
            command: Sequence[str] = ("apt-get",), poll_s: float = POLL_S,
            paths: Sequence[Path] | None = None) -> bool:
    """`apt-get *args` (non-interactive), its output condensed on `log`, after waiting for
    the package manager's locks until `deadline`. True if it succeeded; False if it failed
    for another reason than the lock (PlatformUnavailable with its output when `check`);
    PlatformUnavailable when the lock is still taken at `deadline`."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = [*command, *args]
    while True:
        wait_for_package_manager(log, deadline, poll_s=poll_s, paths=paths)
        with Stage(" ".join(["apt-get", *args]), log) as stage:
            code, tail = stream(cmd, stage, env=env)
        if code == 0:
            return True
        if not refused_for_lock(tail):
            if check:
                raise PlatformUnavailable(
                    f"`{' '.join(cmd)}` failed (exit {code}); its last output:\n"
                    + "\n".join(tail))
            return False
        # Taken between our look and apt-get's: wait again, within the same bound.
        if time.monotonic() >= deadline:
            raise PlatformUnavailable(
                f"`{' '.join(cmd)}` found the package manager's lock taken until the end of "
                f"the wait; let the process that holds it finish, then build again "
                f"({tail[-1] if tail else 'no output'})")
        log("  apt-get found the package manager's lock taken; waiting for it")
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
