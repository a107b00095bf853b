"""Test-only pause points: stop this whole process (SIGSTOP to itself) at one named place.

Why: the interesting pause for fencing is the one *between* the lease check and the
write it guards (a GC pause, a swapped-out VM): the coordinator has just confirmed its
lease, then sleeps past it while a standby takes over, then sends a checkpoint CAS that
was correct when it was built. A pause sent from outside almost never lands there (the
window is well under a millisecond of a checkpoint cycle). Two ways to place it:

- `TRAINER_PAUSE_AT=<point>:<step>`: stop there once, at that step (the tests);
- `TRAINER_PAUSE_ARM_FILE=<path>`: stop at the next `<point>` written in that file, once per
  arming. The harness arms it (workloads/trainer.py: the nemesis's `coordinator-mid-write`
  pause and kill, and the `coordinator-reply-lost` partition) by creating the file; the
  coordinator writes the step in `<path>.step` and takes the arming by renaming the file to
  `<path>.fired` before it stops, and the harness
  disarms by renaming it away — one rename wins, so an arming is taken at most once and
  the harness knows whether it was.

Either needs `MAO_ALLOW_UNSAFE=1` too. Whoever placed the pause resumes it with SIGCONT.

Points: `before-head-cas` (checkpoint_store.write, after the blob is placed and the lease
was checked, before the head record's compare-and-swap).

What it must never do: act without both environment variables (an unarmed coordinator
pays one failed open() per checkpoint write, nothing else).
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Callable

ARM_FILE_VARIABLE = "TRAINER_PAUSE_ARM_FILE"
_fired: set[str] = set()
_continued = threading.Event()
# Read end of the pipe Python's C-level signal handler writes each caught signal's number
# into (signal.set_wakeup_fd). That write happens in whichever thread the kernel delivers
# SIGCONT to, at once; the Python-level handler that sets `_continued` runs only in the
# main thread and only when it next executes bytecode — never, while the main thread sits
# in a C call that retries on EINTR (gRPC's waits do), which left a resumed coordinator
# waiting out the whole 600 s.
_wakeup_read: int | None = None
# Called with (point, step) just before the process stops itself (the coordinator records
# it as an event, so the history says where the pause landed).
on_pause: Callable[[str, int], None] | None = None


def _enabled() -> bool:
    return (bool(os.environ.get("TRAINER_PAUSE_AT") or os.environ.get(ARM_FILE_VARIABLE))
            and os.environ.get("MAO_ALLOW_UNSAFE") == "1")


def install() -> None:
    """Call from the main thread at startup (Python runs signal handlers only there): a
    SIGCONT handler tells the paused thread it may go on. Without it a stop delivered a
    moment late could let the write start before the pause, and its deadline expire in it."""
    global _wakeup_read
    if _enabled():
        signal.signal(signal.SIGCONT, lambda signum, frame: _continued.set())
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        _wakeup_read = read


def _drain_wakeups() -> bytes:
    if _wakeup_read is None:
        return b""
    got = b""
    while True:
        try:
            chunk = os.read(_wakeup_read, 4096)
        except BlockingIOError:
            return got
        if not chunk:
            return got
        got += chunk


def _wait_continued(timeout: float) -> None:
    """Until SIGCONT has really been delivered (by either path), or `timeout`."""
    deadline = time.monotonic() + timeout
    while not _continued.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        if _wakeup_read is None:
            _continued.wait(timeout=left)
            continue
        ready, _, _ = select.select([_wakeup_read], [], [], min(left, 1.0))
        if ready and bytes([signal.SIGCONT]) in _drain_wakeups():
            return


def _take_arming(point: str, step: int) -> bool:
    path = os.environ.get(ARM_FILE_VARIABLE)
    if not path:
        return False
    try:
        with open(path) as f:
            if f.read().strip() != point:
                return False
        with open(path + ".step", "w") as f:  # which write it stops (read once it has fired)
            f.write(str(step))
        os.rename(path, path + ".fired")
    except OSError:  # not armed, or the harness disarmed it first
        return False
    return True


def reach(point: str, step: int) -> None:
    if not _enabled():
        return
    key = f"{point}:{step}"
    once = os.environ.get("TRAINER_PAUSE_AT") == key and key not in _fired
    if not (once or _take_arming(point, step)):
        return
    _fired.add(key)
    if on_pause is not None:
        on_pause(point, step)
    _continued.clear()
    _drain_wakeups()  # an old SIGCONT's byte must not end this pause early
    os.kill(os.getpid(), signal.SIGSTOP)
    _wait_continued(timeout=600)
