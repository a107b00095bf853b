"""What the machine was doing while the benchmark ran: load average and the latency of an
fdatasync in the benchmark's own directory. Both stores that fsync are bound by the
latter, and on a shared machine it moves by several times, so the report states it
beside the figures.

Reads and writes only inside the directory it is given; never changes anything else.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FsyncLatency:
    p50_ms: float
    p99_ms: float

    def __str__(self) -> str:
        return f"p50 {self.p50_ms:.2f} ms, p99 {self.p99_ms:.2f} ms"


_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process, all its threads (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def fdatasync_latency(directory: Path, count: int = 100, block_bytes: int = 4096) -> FsyncLatency:
    """Append block_bytes and fdatasync, count times, in a scratch file (removed after)."""
    path = directory / "fsync-probe.tmp"
    samples = []
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
    try:
        block = b"\0" * block_bytes
        for _ in range(count):
            started = time.perf_counter()
            os.write(fd, block)
            os.fdatasync(fd)
            samples.append((time.perf_counter() - started) * 1000)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    samples.sort()
    return FsyncLatency(samples[len(samples) // 2], samples[min(len(samples) - 1, int(len(samples) * 0.99))])
