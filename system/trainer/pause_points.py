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
import signal
import threading
from collections.abc import Callable

ARM_FILE_VARIABLE = "TRAINER_PAUSE_ARM_FILE"
_fired: set[str] = set()
_continued = threading.Event()
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
    if _enabled():
        signal.signal(signal.SIGCONT, lambda signum, frame: _continued.set())


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
    os.kill(os.getpid(), signal.SIGSTOP)
    _continued.wait(timeout=600)  # until SIGCONT has really been delivered
