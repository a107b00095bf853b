"""The nemesis against an in-memory platform: what it records, that a seed repeats it, that
each round of shapes and targets leads with the leader, and that the end heals everything."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from nemesis import partitions
from nemesis.faults import SLOW_FSYNC_MS, Nemesis, parse_faults
from nemesis.platforms.base import ClusterConfig, Platform


class FakePlatform(Platform):
    """Records what was done to it; n1 always leads."""

    def __init__(self, nodes: int) -> None:
        super().__init__(ClusterConfig(nodes=nodes, run_id="fake", work_dir=Path("/nonexistent")))
        self.cut_set: set[tuple[str, str]] = set()
        self.loss: dict[tuple[str, str], float] = {}
        self.down: set[str] = set()
        self.paused: set[str] = set()
        self.voters: set[str] = set(self.node_ids)
        self.learners: set[str] = set()
        self.wiped: set[str] = set()
        self.calls: list[str] = []  # membership-related steps, in order
        self.fail_promote = False
        self.slow: dict[str, tuple[float, float]] = {}  # slow-disk: node -> fsync delay ms

    def start(self) -> None: ...
    def close(self) -> None: ...

    @property
    def client_addresses(self) -> dict[str, str]:
        return {n: f"127.0.0.1:{7000 + i}" for i, n in enumerate(self.node_ids)}

    def start_node(self, node_id: str) -> None:
        self.calls.append(f"start {node_id}")
        self.down.discard(node_id)

    def stop_node(self, node_id: str) -> None:
        self.down.add(node_id)

    def kill(self, node_id: str) -> None:
        self.calls.append(f"kill {node_id}")
        self.down.add(node_id)

    def slow_disk(self, node_id: str, low_ms: float, high_ms: float) -> None:
        if (low_ms, high_ms) == (0.0, 0.0):
            self.slow.pop(node_id, None)
        else:
            self.slow[node_id] = (low_ms, high_ms)

    def wipe(self, node_id: str) -> None:
        assert node_id in self.down, "wiped while running"
        self.calls.append(f"wipe {node_id}")
        self.wiped.add(node_id)

    def member_address(self, node_id: str) -> str:
        return self.client_addresses[node_id]

    def change_membership(self, action: str, node_id: str, *, timeout_s: float = 30.0) -> None:
        from system.kv.member_client import MembershipRefused, MembershipTimeout

        self.calls.append(f"{action} {node_id}")
        if action == "remove":
            self.voters.discard(node_id)
            self.learners.discard(node_id)
        elif action == "add":
            if node_id in self.voters | self.learners:
                raise MembershipRefused(f"{node_id} is already a member")
            self.learners.add(node_id)
        elif action == "promote":
            if self.fail_promote or node_id in self.down:
                raise MembershipTimeout(f"{node_id} did not catch up")
            if node_id not in self.learners:
                raise MembershipRefused(f"{node_id} is not a learner")
            self.learners.discard(node_id)
            self.voters.add(node_id)

    def membership(self, *, timeout_s: float = 10.0) -> tuple[set[str], set[str]]:
        return set(self.voters), set(self.learners)

    def pause(self, node_id: str) -> None:
        self.paused.add(node_id)

    def resume(self, node_id: str) -> None:
        self.paused.discard(node_id)

    def is_running(self, node_id: str) -> bool:
        return node_id not in self.down

    def exit_code(self, node_id: str) -> int | None:
        return -9 if node_id in self.down else None

    def cut(self, src: str, dst: str) -> None:
        self.cut_set.add((src, dst))

    def heal_link(self, src: str, dst: str) -> None:
        self.cut_set.discard((src, dst))
        self.loss.pop((src, dst), None)

    def set_loss(self, src: str, dst: str, probability: float) -> None:
        self.loss[(src, dst)] = probability

    def status(self, node_id: str, timeout_s: float = 0.5):  # noqa: ANN201
        return None

    def leader(self) -> str | None:
        return "n1"

    def ready(self) -> str | None:
        return self.leader()

    def collect_logs(self) -> dict[str, Path]:
        return {}


def _drive(faults: str, seed: int, rounds: int, nodes: int = 5) -> tuple[list[tuple[str, dict]], FakePlatform]:
    platform = FakePlatform(nodes)
    events: list[tuple[str, dict[str, Any]]] = []
    nemesis = Nemesis(platform, parse_faults(faults), seed=seed, interval_s=0.01,
                      record=lambda f, v: events.append((f, v)))
    nemesis.member_shapes = ("remove-and-rejoin",)  # the aimed shapes: test_member_shapes.py
    nemesis.zombie_s = 0.0
    for _ in range(rounds):
        kind = nemesis.rng.choice(nemesis.faults)
        fault = nemesis._begin(kind)
        assert fault is not None
        nemesis._end(fault)
    return events, platform


def test_every_start_has_an_end_with_the_same_id_and_nodes() -> None:
    events, platform = _drive("partition,kill,pause,packet", seed=3, rounds=20)
    starts = {v["id"]: v for f, v in events if v["phase"] == "start"}
    ends = {v["id"]: v for f, v in events if v["phase"] == "end"}
    assert starts.keys() == ends.keys() and len(starts) == 20
    for i, start in starts.items():
        assert ends[i]["nodes"] == start["nodes"] and ends[i]["fault"] == start["fault"]
    assert not platform.cut_set and not platform.loss and not platform.down and not platform.paused


def test_slow_disk_slows_every_node_kills_the_leader_and_the_heal_undoes_both() -> None:
    platform = FakePlatform(3)
    events: list = []
    nemesis = Nemesis(platform, ["slow-disk"], seed=1, interval_s=0.01,
                      record=lambda f, v: events.append((f, v)))
    nemesis.slow_before_kill_s = 0.0
    fault = nemesis.begin_next()
    assert fault is not None and fault.kind == "slow-disk"
    assert platform.slow == dict.fromkeys(platform.node_ids, SLOW_FSYNC_MS)
    assert platform.down == {"n1"} and "n1" in nemesis.expected_down  # n1 leads here
    start = events[-1][1]
    assert events[-1][0] == "slow-disk" and start["killed"] == ["n1"]
    nemesis.end(fault)
    assert not platform.slow and not platform.down and not nemesis.expected_down
    assert events[-1][0] == "restore-disk"


def test_same_seed_same_schedule_other_seed_another() -> None:
    def shape(events: list) -> list:
        return [(f, v.get("shape"), v.get("target"), v.get("probability")) for f, v in events]

    a, _ = _drive("partition,kill,pause,packet", seed=7, rounds=12)
    b, _ = _drive("partition,kill,pause,packet", seed=7, rounds=12)
    c, _ = _drive("partition,kill,pause,packet", seed=8, rounds=12)
    assert shape(a) == shape(b)
    assert shape(a) != shape(c)


def test_each_round_of_shapes_leads_with_isolating_the_leader_and_covers_all() -> None:
    events, _ = _drive("partition", seed=5, rounds=8)
    shapes = [v["shape"] for f, v in events if f == "start-partition"]
    assert shapes[0] == shapes[4] == "isolate-leader"
    assert set(shapes[:4]) == set(partitions.SHAPES) == set(shapes[4:])
    first = next(v for f, v in events if f == "start-partition")
    assert first["graph"]["n1"] == [] and sorted(first["cut"]) == sorted(
        [["n1", n] for n in ("n2", "n3", "n4", "n5")] + [[n, "n1"] for n in ("n2", "n3", "n4", "n5")])


def test_kill_and_pause_rounds_lead_with_the_leader() -> None:
    events, _ = _drive("kill", seed=2, rounds=6)
    kills = [v for f, v in events if f == "kill"]
    assert kills[0]["target"] == kills[3]["target"] == "leader" and kills[0]["nodes"] == ["n1"]
    minority = [v for v in kills if v["target"] == "minority"]
    assert minority and all(len(v["nodes"]) == 2 for v in minority)
    events, _ = _drive("pause", seed=2, rounds=6)
    targets = [v["target"] for f, v in events if f == "pause"]
    assert targets[::3] == ["leader", "leader"] and set(targets) == {
        "leader", "isolated-leader", "random"}


def test_an_isolated_leader_is_frozen_cut_off_then_resumed_before_its_links_heal() -> None:
    """The zombie leader: resumed while still cut from its peers, so what it answers then
    comes from a leader that has not heard of its successor."""
    steps: list[str] = []

    class Recording(FakePlatform):
        def pause(self, node_id: str) -> None:
            steps.append(f"pause {node_id} cut={len(self.cut_set)}")
            super().pause(node_id)

        def resume(self, node_id: str) -> None:
            steps.append(f"resume {node_id} cut={len(self.cut_set)}")
            super().resume(node_id)

    platform = Recording(5)
    events: list[tuple[str, dict[str, Any]]] = []
    nemesis = Nemesis(platform, ["pause"], seed=2, interval_s=0.01,
                      record=lambda f, v: events.append((f, v)))
    nemesis.zombie_s = 0.0
    while True:
        fault = nemesis._begin("pause")
        assert fault is not None
        if "isolated-leader" in fault.description:
            break
        nemesis._end(fault)
    steps.clear()
    assert platform.paused == {"n1"}
    assert platform.cut_set == {(a, b) for a in platform.node_ids for b in platform.node_ids
                                if a != b and "n1" in (a, b)}
    nemesis._end(fault)
    assert steps == ["resume n1 cut=8"]  # resumed with all 8 links still cut
    assert not platform.cut_set and not platform.paused
    start, end = [v for f, v in events if v.get("target") == "isolated-leader" or
                  v.get("id") == fault.id][-2:]
    assert start["phase"] == "start" and len(start["cut"]) == 8 and end["phase"] == "end"


def test_the_simulator_is_never_dealt_an_isolated_leader() -> None:
    platform = FakePlatform(5)
    platform.name = "sim"
    nemesis = Nemesis(platform, ["pause"], seed=2, interval_s=0.01, record=lambda f, v: None)
    assert "isolated-leader" not in nemesis.pause_targets
    assert "isolated-leader" not in Nemesis(FakePlatform(1), ["pause"], seed=2, interval_s=0.01,
                                            record=lambda f, v: None).pause_targets


def test_heal_everything_undoes_active_faults_and_brings_every_node_back() -> None:
    platform = FakePlatform(5)
    events: list[tuple[str, dict]] = []
    nemesis = Nemesis(platform, ["partition", "kill", "pause"], seed=1, interval_s=0.01,
                      record=lambda f, v: events.append((f, v)))
    nemesis._begin("partition")
    nemesis._begin("kill")
    nemesis._begin("pause")
    platform.down.add("n4")  # crashed on its own
    assert platform.cut_set and nemesis.describe_active()
    nemesis.heal_everything()
    assert not platform.cut_set and not platform.down and not platform.paused
    assert not nemesis.active and events[-1][0] == "heal-all"
    assert "started n4" in events[-1][1]["description"]


def test_member_fault_removes_wipes_and_rejoins_the_node_through_a_learner() -> None:
    events, platform = _drive("member", seed=4, rounds=4)
    starts = [v for f, v in events if f == "remove-member"]
    ends = [v for f, v in events if f == "rejoin-member"]
    assert len(starts) == len(ends) == 4
    assert starts[0]["target"] == "leader" and starts[0]["nodes"] == ["n1"]
    assert starts[0]["voters"] == ["n2", "n3", "n4", "n5"]
    # Thesis §4: the node leaves before it loses its disk, and comes back as a learner
    # that is promoted only once it runs (and so can catch up).
    assert platform.calls[:6] == ["remove n1", "kill n1", "wipe n1", "add n1", "start n1",
                                  "promote n1"]
    assert platform.voters == set(platform.node_ids) and not platform.learners
    assert not platform.down


def test_heal_everything_finishes_a_rejoin_that_failed_half_way() -> None:
    platform = FakePlatform(3)
    events: list[tuple[str, dict]] = []
    nemesis = Nemesis(platform, ["member"], seed=1, interval_s=0.01,
                      record=lambda f, v: events.append((f, v)))
    nemesis.member_shapes = ("remove-and-rejoin",)
    fault = nemesis._begin("member")
    platform.fail_promote = True  # the learner does not catch up in time
    nemesis._end(fault)
    assert nemesis.errors and platform.learners == {"n1"}
    platform.fail_promote = False
    nemesis.heal_everything()
    assert platform.voters == {"n1", "n2", "n3"} and not platform.learners
    assert "rejoined n1" in events[-1][1]["description"]


def test_member_fault_skips_a_node_that_is_not_a_voter() -> None:
    platform = FakePlatform(3)
    platform.voters.discard("n1")  # what a failed rejoin may leave
    events: list[tuple[str, dict]] = []
    nemesis = Nemesis(platform, ["member"], seed=1, interval_s=0.01,
                      record=lambda f, v: events.append((f, v)))
    nemesis.member_shapes = ("remove-and-rejoin",)
    assert nemesis._begin("member") is None
    assert events[-1][0] == "nemesis-skip" and not platform.calls


class WindowTargets:
    """A workload with windows (the trainer's): records which window each fault was sent to;
    `misses` windows fail to land (their first try)."""

    def __init__(self, misses: set[str]) -> None:
        self.sent: list[tuple[str, str]] = []
        self.misses = set(misses)
        self.healed = 0

    def target_roles(self) -> tuple[str, ...]:
        return ("coordinator", "standby")

    def target_windows(self) -> tuple[str, ...]:
        return ("checkpoint-write", "lease-renewal", "takeover")

    def resolve(self, role: str) -> str | None:
        return {"coordinator": "c1", "standby": "c2"}[role]

    def kill_target(self, name: str) -> None:
        pass

    def restart_target(self, name: str) -> str:
        return name

    def window_fault(self, window: str, kind: str) -> dict[str, Any]:
        self.sent.append((window, kind))
        landed = window not in self.misses
        self.misses.discard(window)

        def heal() -> dict[str, Any]:
            self.healed += 1
            return {}
        return {"processes": ["c1"], "landed": landed, "at": 20, "detail": "d", "heal": heal}


def test_process_faults_go_to_every_window_first_a_miss_again_then_every_second() -> None:
    targets = WindowTargets(misses={"lease-renewal"})
    events: list[tuple[str, dict[str, Any]]] = []
    nemesis = Nemesis(FakePlatform(3), ["kill"], seed=1, interval_s=0.01,
                      record=lambda f, v: events.append((f, v)), targets=targets)
    for _ in range(8):
        fault = nemesis._begin("kill")
        assert fault is not None
        nemesis._end(fault)
    windows = [w for w, _ in targets.sent]
    # the miss is tried again after the others; then every second kill goes to a window
    assert windows[:4] == ["checkpoint-write", "lease-renewal", "takeover", "lease-renewal"]
    assert len(windows) == 6 and targets.healed == 6
    starts = [v for f, v in events if f == "kill"]
    assert [v.get("window") for v in starts][:5] == [
        "checkpoint-write", "lease-renewal", "takeover", "lease-renewal", None]
    assert [v["landed"] for v in starts[:4]] == [True, False, True, True]
    assert windows[4:] == ["lease-renewal", "takeover"]  # in turn
    assert nemesis.windows_hit == {"checkpoint-write": 1, "lease-renewal": 2, "takeover": 2}


def test_the_tear_down_waits_for_a_slow_heal_to_record_its_end() -> None:
    """Ctrl-C during a Docker run while a fault was active: the tear down waited 5 s for
    the nemesis, closed the history while the heal (several docker execs) still ran, and the
    heal's record raised `I/O operation on closed file` — the history ended on a pause that
    never resumed (2 runs of 2)."""
    import threading

    from nemesis.runner import _stop_nemesis
    from tests.nemesis.waiting import wait_until

    release = threading.Event()

    class SlowResume(FakePlatform):
        def resume(self, node_id: str) -> None:
            release.wait(30)  # a heal that outlives the tear down's first wait
            super().resume(node_id)

    events: list[str] = []
    nemesis = Nemesis(SlowResume(3), ["pause"], seed=1, interval_s=0.01,
                      record=lambda f, v: events.append(f))
    nemesis.start(deadline=time.monotonic() + 60)
    wait_until(lambda: "pause" in events, 10, "the nemesis to pause a node")
    threading.Timer(0.3, release.set).start()
    _stop_nemesis(nemesis, first_wait_s=0.01)
    assert not nemesis.busy()
    assert events[-1] == "resume", events  # recorded before the history would be closed


def test_a_fault_being_healed_is_shown_as_healing_until_its_end_is_recorded() -> None:
    """The progress line said `faults: none` while a slow (Docker) heal was still running:
    the fault left `active` before its heal began."""
    import io
    import threading

    from nemesis.progress import Progress

    class SlowHeal(FakePlatform):
        def __init__(self, nodes: int) -> None:
            super().__init__(nodes)
            self.healing = threading.Event()
            self.release = threading.Event()

        def heal_link(self, src: str, dst: str) -> None:
            self.healing.set()
            assert self.release.wait(30), "the test never released the heal"
            super().heal_link(src, dst)

    platform = SlowHeal(5)
    events: list[tuple[str, dict]] = []
    nemesis = Nemesis(platform, ["partition"], seed=1, interval_s=0.01,
                      record=lambda f, v: events.append((f, v)))
    fault = nemesis._begin("partition")
    assert fault is not None
    healer = threading.Thread(target=nemesis.end, args=(fault,))
    healer.start()
    try:
        assert platform.healing.wait(30)
        active = nemesis.describe_active()
        assert len(active) == 1 and active[0].startswith("healing partition(")
        out = io.StringIO()
        Progress(out, 60).update(12.0, {"ok": 3, "fail": 0, "info": 0}, active)
        assert "faults: healing partition(" in out.getvalue()
        assert events[-1][0] == "start-partition"  # the end is not recorded yet
    finally:
        platform.release.set()
        healer.join(30)
    assert events[-1][0] == "heal-partition" and nemesis.describe_active() == []


def test_a_node_down_that_the_nemesis_did_not_stop_is_recorded_once_as_a_crash() -> None:
    platform = FakePlatform(3)
    events: list[tuple[str, dict]] = []
    nemesis = Nemesis(platform, ["kill"], seed=1, interval_s=0.01,
                      record=lambda f, v: events.append((f, v)))
    nemesis._begin("kill")  # the nemesis's own kill: expected down, never a crash
    nemesis.look_for_crashes()
    assert not [f for f, _ in events if f == "node-crashed"]
    platform.down.add("n3")  # n3 stops by itself
    nemesis.look_for_crashes()
    nemesis.look_for_crashes()  # the same exit is recorded once
    crashes = [v for f, v in events if f == "node-crashed"]
    assert [(c["node"], c["exit_code"]) for c in crashes] == [("n3", -9)]
    assert nemesis.crashes == [{"node": "n3", "exit_code": -9, "reason": ""}]


def test_a_heal_during_a_slow_look_is_not_a_crash() -> None:
    """Found on ssh under load: the look read a killed node's exit (-1) while the heal
    restarted it and stopped expecting it down; the look then saw it not expected down."""
    class HealDuringLook(FakePlatform):
        def exit_code(self, node_id: str) -> int | None:
            code = super().exit_code(node_id)
            if node_id == "n1" and node_id in nemesis.expected_down:
                self.start_node(node_id)  # the heal, on another thread, meanwhile
                nemesis.expected_down.discard(node_id)
            return code

    platform = HealDuringLook(3)
    nemesis = Nemesis(platform, ["kill"], seed=1, interval_s=0.01, record=lambda f, v: None)
    nemesis.expected_down.add("n1")
    platform.kill("n1")
    nemesis.look_for_crashes()
    assert nemesis.crashes == []
    platform.down.add("n2")  # a real exit is still seen
    nemesis.look_for_crashes()
    assert [c["node"] for c in nemesis.crashes] == ["n2"]


def test_a_member_that_stops_itself_when_removed_is_not_a_crash() -> None:
    class StopsWhenRemoved(FakePlatform):  # as an etcd member does
        def change_membership(self, action: str, node_id: str, *, timeout_s: float = 30.0) -> None:
            super().change_membership(action, node_id, timeout_s=timeout_s)
            if action == "remove":
                assert node_id in nemesis.expected_down, "removed before it was expected down"
                self.down.add(node_id)

    platform = StopsWhenRemoved(3)
    nemesis = Nemesis(platform, ["member"], seed=1, interval_s=0.01, record=lambda f, v: None)
    nemesis.member_shapes = ("remove-and-rejoin",)
    nemesis._begin("member")
    nemesis.look_for_crashes()
    assert nemesis.crashes == []
