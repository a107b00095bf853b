"""The reorder fault (sim; local in test_frame_reorder.py): on chosen links, messages delivered late, behind later
ones, and some twice; healed by removing it. Detection figures are benchmarks
(docs/variants.md); these tests show what the network does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemesis.faults import unsupported
from tests.nemesis.test_sim_hold import _ready_platform


def _record_flights(platform: Any) -> list[tuple[int, str, str]]:
    """(flight id, src, dst) of each delivery: ids grow in the order messages were sent."""
    delivered: list[tuple[int, str, str]] = []
    deliver = platform.sim.deliver_flight

    def recording(flight: Any) -> None:
        delivered.append((flight.id, flight.message.src, flight.message.dst))
        deliver(flight)

    platform.sim.deliver_flight = recording
    return delivered


def _overtaken(delivered: list[tuple[int, str, str]], src: str, dst: str) -> int:
    ids = [i for i, s, d in delivered if (s, d) == (src, dst)]
    return sum(1 for a, b in zip(ids, ids[1:], strict=False) if b < a)


def test_reordered_links_deliver_late_and_twice_and_the_heal_restores_order(
        tmp_path: Path) -> None:
    platform = _ready_platform(tmp_path)
    leader = platform.leader()
    follower, other = [n for n in platform.sim.alive() if n != leader]
    delivered = _record_flights(platform)
    platform.set_reorder(leader, follower, 0.5)
    for _ in range(300):
        platform.advance()
    assert _overtaken(delivered, leader, follower) > 0
    assert platform.sim.faults.get("duplicate", 0) > 0, platform.sim.faults
    assert _overtaken(delivered, leader, other) == 0  # a link without the fault keeps order
    assert platform.leader() == leader  # late heartbeats are still heartbeats

    platform.heal_link(leader, follower)
    for _ in range(30):  # what was late when it healed arrives
        platform.advance()
    delivered.clear()
    for _ in range(300):
        platform.advance()
    assert _overtaken(delivered, leader, follower) == 0
    assert sum(1 for _, s, d in delivered if (s, d) == (leader, follower)) > 10


def test_reorder_runs_on_the_simulator_and_local_and_says_why_not_elsewhere_in_one_line(
        ) -> None:
    assert unsupported(["reorder"], "sim") is None
    assert unsupported(["reorder"], "local") is None
    line = unsupported(["reorder"], "docker")
    assert line is not None and "\n" not in line and "--platform sim or local" in line
    assert "iptables" in line
