"""Starting and stopping the trainer's child processes (workers, coordinators).

What it must never do: leave a process behind. Every child runs in its own process group
(start_new_session), asks the kernel to SIGKILL it when its parent dies
(PR_SET_PDEATHSIG, set by the child itself from TRAINER_PARENT_PID, as system/kv does:
no preexec_fn, which would fork a process with live gRPC threads), and `kill_group`
SIGKILLs the whole group and reaps it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from system.trainer.blas import BLAS_THREAD_VARIABLES

REPO_ROOT = Path(__file__).resolve().parents[2]


def die_with_parent() -> None:
    parent = os.environ.get("TRAINER_PARENT_PID")
    if not parent:
        return
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != int(parent):
        sys.exit(0)  # the parent died before the request took effect


def spawn(args: Sequence[str], log_path: Path, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    env = dict(os.environ)
    env.update(extra_env or {})
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["TRAINER_PARENT_PID"] = str(os.getpid())
    for name in BLAS_THREAD_VARIABLES:
        env[name] = "1"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "system.trainer", *args], cwd=REPO_ROOT,
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
