"""One node's lazy disk on this machine: a `python -m nemesis.lazyfs mount` process and its mount.

The local platform keeps the layer mounted exactly while its node may use it: `start`
mounts it over the backing directory and waits until it serves; a process crash of the
node is followed by `flush` (the page cache of a real machine survives a process crash)
and `stop`; a power cut is `power_off`: SIGKILL of the layer (its memory — every
unsynced write — is gone) and a lazy unmount of what it leaves.

What it must never do: leave a mount or a layer process behind. The layer unmounts on
SIGTERM and gets SIGTERM when this process dies (PR_SET_PDEATHSIG, through its
environment); a SIGKILLed layer leaves a dead mount that `force_unmount` removes, and
`nemesis clean` finds those by their type (`lazy_mounts`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from nemesis.lazyfs import FS_TYPE, PARENT_ENV, LazyFSError, request
from nemesis.platforms.base import PlatformError, last_line
from system import child_processes

REPO_ROOT = Path(__file__).resolve().parents[2]
SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes


def _unescape(field: str) -> str:
    # /proc/mounts writes space, tab, newline and backslash as octal escapes.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def lazy_mounts() -> list[Path]:
    """Mount points of every lazy layer mounted in this mount namespace (live or dead)."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) >= 3 and fields[2] == FS_TYPE:
                found.append(Path(_unescape(fields[1])))
    return found


def force_unmount(mountpoint: Path) -> None:
    """Detach a lazy mount, dead or alive (lazily: a process still inside keeps its files)."""
    if mountpoint not in lazy_mounts():
        return
    if shutil.which("fusermount3"):
        cmd = ["fusermount3", "-u", "-z", str(mountpoint)]
    else:
        cmd = ["umount", "-l", str(mountpoint)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 and mountpoint in lazy_mounts():
        raise PlatformError(f"could not unmount the lazy disk at {mountpoint}: "
                            f"{last_line(proc.stderr)} — try `umount -l {mountpoint}` as root")


class LazyMount:
    def __init__(self, mountpoint: Path, backing: Path, control: Path, log_file: Path,
                 env: Mapping[str, str] | None = None, max_pending_mb: int | None = None) -> None:
        if len(str(control)) > SOCKET_PATH_MAX:
            raise PlatformError(f"the control socket path {control} is longer than "
                                f"{SOCKET_PATH_MAX} bytes; use a shorter run id")
        self.mountpoint = mountpoint
        self.backing = backing
        self.control = control
        self.log_file = log_file
        self.env = dict(env or {})
        self.max_pending_mb = max_pending_mb
        self.proc: subprocess.Popen | None = None
        self.fsync_delay_ms = (0.0, 0.0)  # the slow-disk fault's, reapplied at each start

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout_s: float = 60.0) -> None:
        """Mount the layer and return once it serves; PlatformError if it cannot."""
        if self.running:
            raise PlatformError(f"the lazy disk at {self.mountpoint} is already mounted")
        force_unmount(self.mountpoint)  # a dead mount of an earlier layer
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.control.unlink()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
        env.update(self.env)
        env[PARENT_ENV] = str(os.getpid())
        with open(self.log_file, "ab") as log:
            self.proc = child_processes.popen(
                [sys.executable, "-m", "nemesis.lazyfs", "mount", str(self.mountpoint),
                 "--backing", str(self.backing), "--control", str(self.control),
                 *([] if self.max_pending_mb is None else
                   ["--max-pending-mb", str(self.max_pending_mb)])],
                cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while not (self.mountpoint in lazy_mounts() and self.control.exists()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.power_off()
                why = last_line(self.log_file.read_text(errors="replace")) or "no output"
                raise PlatformError(f"the lazy disk at {self.mountpoint} did not mount: {why}")
            time.sleep(0.02)
        if self.fsync_delay_ms != (0.0, 0.0):
            self.slow(*self.fsync_delay_ms)

    def slow(self, low_ms: float, high_ms: float) -> None:
        """Each fsync waits a uniform draw from [low_ms, high_ms] first (0, 0: restored);
        kept for the next `start` too (a node killed during the fault comes back slow)."""
        self.fsync_delay_ms = (low_ms, high_ms)
        if self.running:
            try:
                request(self.control, f"slow {low_ms:g} {high_ms:g}")
            except (LazyFSError, OSError) as exc:
                raise PlatformError(f"slowing the lazy disk at {self.mountpoint} failed: "
                                    f"{exc}") from None

    def flush(self) -> None:
        """Every pending write reaches the backing files (the layer writes through after)."""
        if not self.running:
            return
        try:
            request(self.control, "flush")
        except (LazyFSError, OSError) as exc:
            raise PlatformError(f"flushing the lazy disk at {self.mountpoint} failed: "
                                f"{exc}") from None

    def stop(self, timeout_s: float = 20.0) -> None:
        """Unmount (SIGTERM); what was not flushed is dropped."""
        if self.running:
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout_s)  # else power_off SIGKILLs it
        self.power_off()

    def power_off(self) -> None:
        """SIGKILL the layer (its unsynced writes die with it) and detach its mount."""
        if self.proc is not None:
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=20)
        force_unmount(self.mountpoint)
