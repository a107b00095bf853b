"""Child processes that die with their supervisor, and only with it.

A supervisor (system/kv/local_cluster.py's LocalCluster, which `python -m system.kv
cluster` and the harness use; the trainer's launcher) puts its pid in the child's
environment; the child asks Linux to SIGKILL it when its parent dies (PR_SET_PDEATHSIG),
so a SIGKILLed supervisor leaves no node behind. No
preexec_fn does it: that forces a plain fork() of a process with live gRPC threads, whose
fork handlers sometimes abort the child.

The catch (prctl(2)): the "parent" whose death sends the signal is the *thread* that forked
the child, not the process. A node restarted from the nemesis's thread was SIGKILLed the
moment that thread ended at the end of the run — every node a fault had restarted died at
once, unseen, just before the final heal. So every child is forked by one thread that lives
as long as the supervisor process: `popen` hands the fork to it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

_PR_SET_PDEATHSIG = 1
_lock = threading.Lock()
_spawner: ThreadPoolExecutor | None = None


def popen(*args, **kwargs) -> subprocess.Popen:  # noqa: ANN002, ANN003 - as subprocess.Popen
    """subprocess.Popen(*args, **kwargs), forked by the process's one long-lived spawner
    thread (see the module's docstring)."""
    global _spawner
    with _lock:
        if _spawner is None:
            _spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spawner")
    future = _spawner.submit(subprocess.Popen, *args, **kwargs)
    try:
        return future.result()
    except BaseException:
        # Interrupted (Ctrl-C) while the spawner forked: the child exists but the caller
        # will never record it, so it must not outlive this call.
        with contextlib.suppress(BaseException):
            child = future.result(timeout=30)
            if kwargs.get("start_new_session"):
                os.killpg(child.pid, signal.SIGKILL)
            else:
                child.kill()
            child.wait(timeout=10)
        raise


def die_with_parent(variable: str) -> None:
    """In the child: if `variable` names the supervisor's pid, ask to be SIGKILLed when it
    dies; exit now if it is already gone (it died before the request took effect)."""
    parent = os.environ.get(variable)
    if not parent:
        return
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(parent):
        sys.exit(0)
