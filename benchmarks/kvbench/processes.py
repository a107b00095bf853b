"""Child processes of the benchmark: start them in their own process group, stop them for
sure, pick free loopback ports, and sample their resident memory.

Every process the benchmark starts goes through `ManagedProcess`, and every
`ManagedProcess` is stopped in a `finally` (SIGTERM to the whole group, then SIGKILL), so a
Ctrl-C or a failure never leaves a server behind. This module must never signal a process
it did not start.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# The kernel's parent-death signal (PR_SET_PDEATHSIG): a child is SIGKILLed when the
# benchmark dies, so even a SIGKILLed benchmark (which runs no finally) leaves no server
# behind. Set by util-linux's `setpriv` just before it execs the child, rather than by a
# preexec_fn, which would run Python in a forked copy of a process that has gRPC threads.
_SETPRIV = shutil.which("setpriv")


def dying_with_parent(argv: Sequence[str]) -> list[str]:
    """argv, prefixed so that the process is SIGKILLed when its parent dies (unchanged
    where setpriv is missing: the finally blocks still stop it)."""
    if _SETPRIV is None:
        return list(argv)
    return [_SETPRIV, "--pdeathsig", "KILL", "--", *argv]


def child_environment() -> dict[str, str]:
    """The environment for Python children: this checkout first on the import path, so a
    worktree runs its own code and not an editable install made elsewhere."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env["PYTHONUNBUFFERED"] = "1"
    return env


class ManagedProcess:
    """One child process in its own session (so its process group is its own), with its
    output in a log file."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, cwd: Path | None = None):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._log_file = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            dying_with_parent(self.argv),
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=str(cwd or REPO_ROOT),
            env=child_environment(),
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill_hard(self) -> None:
        """SIGKILL the whole group at once: the crash the leader-kill row measures."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM the group, wait up to grace_s, then SIGKILL it. Safe to call twice."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=grace_s)
        # The group may hold children of the child even after the child itself exited.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=grace_s)
        if not self._log_file.closed:
            self._log_file.close()

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as error:
            return f"(log {self.log_path} unreadable: {error})"
        return "\n".join(text.splitlines()[-lines:])


def rss_bytes(pid: int) -> int | None:
    """Resident set size of a live process from /proc/PID/status (VmRSS), None if gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


class RssSampler:
    """Samples the RSS of a set of processes every period_s in a background thread and keeps
    the peak of the largest one. Use as a context manager around one measured row."""

    def __init__(self, pids: Sequence[int], period_s: float = 0.2):
        self._pids = list(pids)
        self._period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self.peak_member_rss_bytes = 0
        self.start_member_rss_bytes: int | None = None  # the largest member's, at the start

    def _sample(self) -> None:
        sizes = [rss for rss in (rss_bytes(pid) for pid in self._pids) if rss is not None]
        if not sizes:
            return
        if self.start_member_rss_bytes is None:
            self.start_member_rss_bytes = max(sizes)
        self.peak_member_rss_bytes = max(self.peak_member_rss_bytes, *sizes)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self._period_s)

    def __enter__(self) -> RssSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


class ClusterError(RuntimeError):
    """A cluster did not come up or lost its way; the message says where its logs are."""


def wait_until(condition, timeout_s: float, period_s: float = 0.05, what: str = "condition"):
    """Poll condition() until it returns something other than None or False (returned; 0
    counts, it is a member index) or timeout_s passes (TimeoutError naming what was
    awaited). Exceptions from condition() count as not yet."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while True:
        try:
            value = condition()
            if value is not None and value is not False:
                return value
        except ClusterError:
            raise
        except Exception as error:  # the cluster may still be starting
            last_error = error
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}{detail}")
        time.sleep(period_s)
