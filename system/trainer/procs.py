"""Starting and stopping the trainer's child processes (workers, coordinators).

What it must never do: leave a process behind. Every child runs in its own process group
(start_new_session), asks the kernel to SIGKILL it when its parent dies
(system/child_processes.py: PR_SET_PDEATHSIG from TRAINER_PARENT_PID, forked by one
long-lived thread, since the signal follows the forking thread's death), and `kill_group`
SIGKILLs the whole group and reaps it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from system import child_processes
from system.trainer.blas import BLAS_THREAD_VARIABLES

REPO_ROOT = Path(__file__).resolve().parents[2]


def die_with_parent() -> None:
    child_processes.die_with_parent("TRAINER_PARENT_PID")


def spawn(args: Sequence[str], log_path: Path, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    env = dict(os.environ)
    env.update(extra_env or {})
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["TRAINER_PARENT_PID"] = str(os.getpid())
    for name in BLAS_THREAD_VARIABLES:
        env[name] = "1"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return child_processes.popen([sys.executable, "-m", "system.trainer", *args], cwd=REPO_ROOT,
                                env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL, timeout_s: float = 10.0) -> int | None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
            if sig != signal.SIGKILL:
                os.killpg(proc.pid, signal.SIGCONT)  # a stopped process cannot handle it
    with contextlib.suppress(subprocess.TimeoutExpired):
        return proc.wait(timeout=timeout_s)
    return None


# A busy loop that dies with the process that started it (even if that one is SIGKILLed).
_HOG = ("import sys; sys.path.insert(0, sys.argv[1]); from system import child_processes; "
        "child_processes.die_with_parent('TRAINER_PARENT_PID')\nwhile True: pass")


@contextlib.contextmanager
def cpu_hog(processes: int) -> Iterator[list[subprocess.Popen]]:
    """For tests and benchmarks: `processes` busy-loop processes for the duration of the
    block — a machine with no spare CPU — all SIGKILLed and reaped when it ends, however it
    ends."""
    env = {**os.environ, "TRAINER_PARENT_PID": str(os.getpid())}
    hogs: list[subprocess.Popen] = []
    try:
        for _ in range(processes):
            hogs.append(child_processes.popen([sys.executable, "-c", _HOG, str(REPO_ROOT)], env=env,
                                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL, start_new_session=True))
        yield hogs
    finally:
        for proc in hogs:
            kill_group(proc)
