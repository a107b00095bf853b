"""Free TCP ports for processes started later: nodes, proxies, benchmark peers.

Why not bind port 0 and hand the number on: the kernel picks that port from its ephemeral
range, the same range every `connect()` and every other `bind(port 0)` on the machine draws
from. Between releasing the port and the child binding it (a Python start, hundreds of ms)
any of those can take it; in CI a local run lost a node that way at start-up (it exited 2,
"the port is in use"). Ports chosen below the ephemeral range are never handed out by the
kernel, so only a process that asks for that very port can collide, and the node's own
start-up check names it if one does.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_DEFAULT_RANGE = (32768, 60999)
FLOOR = 20000  # clear of the well-known and registered ports most services listen on
MIN_BAND = 1000  # a band smaller than this is too easy to exhaust; use the kernel's choice
MAX_TRIES = 200


def ephemeral_range(path: Path = RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (inclusive), or Linux's default where unreadable."""
    try:
        low, high = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return LINUX_DEFAULT_RANGE
    return low, high


def port_band(path: Path = RANGE_FILE) -> range | None:
    """The ports to choose from: below the ephemeral range, else above it; None when the
    ephemeral range leaves neither band wide enough."""
    low, high = ephemeral_range(path)
    if low - FLOOR >= MIN_BAND:
        return range(FLOOR, low)
    if 65535 - high >= MIN_BAND:
        return range(high + 1, 65536)
    return None


def free_ports(count: int, host: str = "127.0.0.1", *, band: range | None = None) -> list[int]:
    """`count` distinct ports on `host` that are free now and outside the kernel's ephemeral
    range (see the module docstring); random, so two harnesses on one machine rarely pick
    alike. Falls back to the kernel's choice when no band outside the range is wide enough."""
    band = port_band() if band is None else band
    held: list[socket.socket] = []
    try:
        if band is None:
            for _ in range(count):
                held.append(_bound(host, 0))
            return [s.getsockname()[1] for s in held]
        rng = random.SystemRandom()  # not the run's seed: concurrent runs must not agree
        for _ in range(MAX_TRIES):
            if len(held) == count:
                break
            try:
                held.append(_bound(host, rng.choice(band)))
            except OSError:
                continue  # taken (or a port already held here): draw again
        if len(held) < count:
            raise OSError(f"found only {len(held)} of {count} free ports on {host} in "
                          f"{band.start}-{band.stop - 1} after {MAX_TRIES} tries")
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def _bound(host: str, port: int) -> socket.socket:
    # No SO_REUSEADDR: a port with connections still in TIME_WAIT is skipped too.
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((host, port))
    except OSError:
        s.close()
        raise
    return s
