"""The hold fault (sim only): a leader's messages delivered late rather than lost.

stale-leader: everything the leader sends stays on the wire until a follower holds an
uncommitted entry of a newer term, then arrives there first (an old-term APPEND where a
receiver that took it for current would overwrite it). overtaken: only what the leader
has on the wire now is held; what it sends later overtakes it. Fast tests on a bare
SimPlatform and on the nemesis with a fake platform; the detection figures are
benchmarks (docs/variants.md), not tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemesis.faults import HOLD_SHAPES, Nemesis, unsupported
from nemesis.platforms.base import ClusterConfig
from nemesis.platforms.sim import SimPlatform
from system.raft.core import Role
from system.raft.messages import MessageType
from tests.nemesis.test_nemesis_schedule import FakePlatform


def _ready_platform(tmp_path: Path, nodes: int = 3, seed: int = 3,
                    unsafe: str | None = None) -> SimPlatform:
    from nemesis.sim_runner import variant_for_run

    platform = SimPlatform(ClusterConfig(nodes=nodes, run_id="t", work_dir=tmp_path), seed=seed,
                           variant=variant_for_run(unsafe))
    for _ in range(1000):
        if platform.ready():
            return platform
        platform.advance()
    raise AssertionError("no leader within 1000 ticks")


def _record_deliveries(platform: SimPlatform) -> list[Any]:
    delivered: list[Any] = []
    deliver = platform.sim.deliver_flight

    def recording(flight: Any) -> None:
        delivered.append(flight.message)
        deliver(flight)

    platform.sim.deliver_flight = recording  # type: ignore[method-assign]
    return delivered


def test_stale_leader_messages_wait_for_a_newer_term_entry_then_arrive_first(
        tmp_path: Path) -> None:
    platform = _ready_platform(tmp_path)
    old = platform.leader()
    assert old is not None
    old_term = platform.sim.core(old).term
    delivered = _record_deliveries(platform)
    platform.hold_from(old)
    released_at = None
    for tick in range(2000):
        platform.advance()
        if platform.released_in_window:
            released_at = tick
            break
    assert released_at is not None, "the window never opened: no newer-term entry reached a follower"
    before = delivered[:next(i for i, m in enumerate(delivered) if m.src == old)]
    # Nothing the old leader sent arrived while held; meanwhile a newer term's leader
    # replicated an entry that some follower holds uncommitted.
    assert before and all(m.src != old for m in before)
    newer = [m for m in before if m.type is MessageType.APPEND and m.term > old_term and m.entries]
    assert newer
    stale = delivered[len(before)]
    assert stale.src == old and stale.term == old_term  # the first delivery after release
    assert not platform.holding and platform.held_term is None
    assert any(platform.sim.core(n).role is Role.LEADER and platform.sim.core(n).term > old_term
               for n in platform.answering())


def test_overtaken_holds_only_what_is_on_the_wire_and_newer_messages_pass(tmp_path: Path) -> None:
    platform = _ready_platform(tmp_path)
    leader = platform.leader()
    assert leader is not None
    for _ in range(200):  # a tick whose heartbeats are still on the wire
        platform.sim.tick_nodes([leader])
        if any(f.message.src == leader for f in platform.sim.network.in_flight.values()):
            break
    held = platform.hold_in_flight(leader)
    assert held > 0
    held_ids = set(platform.held_flights)
    delivered = _record_deliveries(platform)
    for _ in range(30):
        platform.advance()
    assert held_ids <= set(platform.sim.network.in_flight)  # still on the wire
    assert any(m.src == leader for m in delivered)  # later ones overtook them
    delivered.clear()
    assert platform.release_held() == held
    platform.deliver_pending()
    assert delivered[:held] and all(m.src == leader for m in delivered[:held])
    assert not held_ids & set(platform.sim.network.in_flight)


def test_heal_all_releases_what_a_hold_kept(tmp_path: Path) -> None:
    platform = _ready_platform(tmp_path)
    leader = platform.leader()
    assert leader is not None
    platform.hold_from(leader)
    platform.sim.tick_nodes([leader])
    platform.heal_all()
    assert not platform.holding and not platform.held_flights
    assert platform.deliver_pending() > 0


class HoldingPlatform(FakePlatform):
    def __init__(self) -> None:
        super().__init__(3)
        self.held: list[str] = []

    def hold_from(self, node_id: str) -> None:
        self.held.append(f"all {node_id}")

    def hold_in_flight(self, node_id: str) -> int:
        self.held.append(f"in-flight {node_id}")
        return 4

    def release_held(self) -> int:
        count, self.held = len(self.held), []
        return count


def test_the_nemesis_deals_both_shapes_on_the_leader_and_records_the_release() -> None:
    platform = HoldingPlatform()
    platform.name = "sim"  # both shapes there; a byte stream gets stale-leader only
    platform.released_in_window = 0
    events: list[tuple[str, dict[str, Any]]] = []
    nemesis = Nemesis(platform, ["hold"], seed=1, interval_s=1.0,
                      record=lambda f, v: events.append((f, v)))
    shapes = []
    for _ in range(len(HOLD_SHAPES)):
        fault = nemesis._begin("hold")
        assert fault is not None and fault.nodes == ["n1"]  # the fake's leader
        platform.released_in_window = 2
        nemesis._end(fault)
        start, end = events[-2], events[-1]
        assert start[0] == "hold" and end[0] == "release"
        shapes.append(start[1]["shape"])
        assert end[1]["released"] == 3 and end[1]["released_in_window"] == 2
    assert sorted(shapes) == sorted(HOLD_SHAPES)  # a deck: each shape once per round
    assert not platform.held and not nemesis.errors


def test_hold_is_refused_where_nothing_can_delay_a_message_in_one_line() -> None:
    line = unsupported(["hold"], "docker")
    assert line is not None and "\n" not in line
    assert "--platform sim or local" in line and "delays messages" in line
    assert unsupported(["hold"], "sim") is None
    assert unsupported(["hold"], "local") is None  # its proxies keep and deliver late


def _overtaken_write(tmp_path: Path, unsafe: str | None) -> tuple[Any, str, bool]:
    """A write whose APPENDs are held (overtaken), a second write that overtakes them, the
    release at the aimed moment and the leader's crash; then the others elect a leader.
    Three nodes: the aim (a majority of followers) is then every follower, so no node
    but the crashed leader is left with the second write if they drop it. Returns the
    second write, the new leader and whether its log holds that write."""
    platform = _ready_platform(tmp_path, unsafe=unsafe)
    leader = platform.leader()
    assert leader is not None
    platform.hold_in_flight(leader)  # nothing with entries on the wire: the next ones
    platform.sim.put(leader, "k", "first")
    platform.advance()
    assert platform.overtaken is not None and platform.held_flights
    second = platform.sim.put(leader, "k", "second")
    for _ in range(200):
        platform.advance()
        if platform.crashed_by_hold is not None:
            break
    assert platform.crashed_by_hold == leader, "the aimed window never opened"
    assert second.status.name == "OK"  # acknowledged before the leader crashed
    written = second.attempts[-1]
    for _ in range(2000):
        platform.advance()
        new = platform.leader()
        if new is not None and new != leader:
            return second, new, platform.sim.core(new).log.term(written.index) == written.term
    raise AssertionError("no new leader within 2000 ticks")


def test_overtaken_releases_at_the_aimed_moment_and_the_real_core_keeps_the_write(
        tmp_path: Path) -> None:
    _, _, kept = _overtaken_write(tmp_path, None)
    assert kept


def test_overtaken_makes_a_follower_that_truncates_without_a_conflict_lose_the_write(
        tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("MAO_ALLOW_UNSAFE", "1")
    _, _, kept = _overtaken_write(tmp_path, "truncates-without-a-conflict")
    assert not kept


def test_off_the_simulator_both_shapes_count_bytes_and_the_crashed_leader_is_expected_down(
        ) -> None:
    platform = HoldingPlatform()
    platform.name = "local"
    platform.overtaken_landed = True
    events: list[tuple[str, dict[str, Any]]] = []
    nemesis = Nemesis(platform, ["hold"], seed=1, interval_s=1.0,
                      record=lambda f, v: events.append((f, v)))
    for _ in range(len(HOLD_SHAPES)):
        fault = nemesis._begin("hold")
        # The overtaken strike crashes the leader (LocalPlatform.hold_in_flight): not a
        # crash of its own until the heal restarts it.
        shape = [v for f, v in events if f == "hold"][-1]["shape"]
        assert (fault.nodes[0] in nemesis.expected_down) == (shape == "overtaken")
        nemesis._end(fault)
        assert not nemesis.expected_down
    starts = [v for f, v in events if f == "hold"]
    ends = [v for f, v in events if f == "release"]
    assert sorted(s["shape"] for s in starts) == sorted(HOLD_SHAPES)
    assert all("released_bytes" in e and "byte(s)" in e["detail"] for e in ends)
