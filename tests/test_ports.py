"""Ports handed to child processes come from outside the kernel's ephemeral range, so no
`connect()` or `bind(port 0)` elsewhere on the machine can take one before the child binds
it (a local run in CI lost a node at start-up that way)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from system.ports import ephemeral_range, free_ports, port_band


def test_free_ports_are_distinct_free_and_outside_the_ephemeral_range() -> None:
    low, high = ephemeral_range()
    for _ in range(20):
        ports = free_ports(6)
        assert len(set(ports)) == 6
        assert not any(low <= p <= high for p in ports), (ports, (low, high))
        held = []
        try:
            for port in ports:  # each one is bindable now
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
        finally:
            for s in held:
                s.close()


@pytest.mark.parametrize(("text", "expected"), [
    ("32768\t60999\n", range(20000, 32768)),
    ("1024 50000", range(50001, 65536)),   # nothing left below: above it
    ("1024 65000", None),                  # neither band is wide enough: the kernel's choice
    ("garbage", range(20000, 32768)),      # unreadable: Linux's default range
])
def test_the_band_lies_beside_the_ephemeral_range(tmp_path: Path, text: str, expected) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    assert port_band(path) == expected


def test_a_port_in_use_is_never_handed_out() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"found only 0 of 1 free ports on 127.0.0.1 in {port}-{port}"):
            free_ports(1, band=range(port, port + 1))
        with socket.socket() as probe:  # the neighbour, if free, is the only answer
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                pytest.skip(f"port {port + 1} is in use here")
        assert free_ports(1, band=range(port, port + 2)) == [port + 1]
