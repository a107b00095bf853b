"""Test-only pause points: stop this whole process (SIGSTOP to itself) at one named place.

Why: the interesting pause for fencing is the one *between* the lease check and the
write it guards (a GC pause, a swapped-out VM): the coordinator has just confirmed its
lease, then sleeps past it while a standby takes over, then sends a checkpoint CAS that
was correct when it was built. A pause sent from outside almost never lands there. With
`TRAINER_PAUSE_AT=<point>:<step>` and `MAO_ALLOW_UNSAFE=1` in its environment, a
coordinator stops itself exactly there, once; the test resumes it with SIGCONT.

Points: `before-head-cas` (checkpoint_store.write, after the blob is placed and the lease
was checked, before the head record's compare-and-swap).

What it must never do: act without both environment variables.
"""

from __future__ import annotations

import os
import signal
import threading

_fired: set[str] = set()
_continued = threading.Event()


def _enabled() -> bool:
    return bool(os.environ.get("TRAINER_PAUSE_AT")) and os.environ.get("MAO_ALLOW_UNSAFE") == "1"


def install() -> None:
    """Call from the main thread at startup (Python runs signal handlers only there): a
    SIGCONT handler tells the paused thread it may go on. Without it a stop delivered a
    moment late could let the write start before the pause, and its deadline expire in it."""
    if _enabled():
        signal.signal(signal.SIGCONT, lambda signum, frame: _continued.set())


def reach(point: str, step: int) -> None:
    if not _enabled():
        return
    key = f"{point}:{step}"
    if os.environ["TRAINER_PAUSE_AT"] == key and key not in _fired:
        _fired.add(key)
        _continued.clear()
        os.kill(os.getpid(), signal.SIGSTOP)
        _continued.wait(timeout=600)  # until SIGCONT has really been delivered
