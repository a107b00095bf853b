"""Leader faults aimed at the store's windows (nemesis/windows.py), and `--faults all`.

The slow test runs three real nodes with a write load, lets the nemesis create a snapshot
transfer (a follower kept away until the leader compacts past it) and checks that the
leader fault it fires is recorded as aimed at that transfer and landing inside it, with
the leader's own report of the transfer. Tiny chunks (64 bytes) make the transfer last
hundreds of round trips, so landing does not depend on spare CPU; every wait has a deadline.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

import pytest

from nemesis.fault_mix import expand_all
from nemesis.faults import FAULTS, Nemesis
from nemesis.platforms.base import ClusterConfig
from tests.nemesis.test_nemesis_schedule import FakePlatform
from tests.nemesis.waiting import wait_until


def test_all_on_sim_leaves_out_what_the_simulator_cannot_run_and_says_why() -> None:
    kinds, note = expand_all("sim")
    # member runs there in its two-in-flight and change-at-new-leader shapes
    # (nemesis/member_shapes.py); rollback and restore-majority copy the fake disks
    assert kinds == ["partition", "kill", "pause", "packet", "reorder", "member", "lose-unsynced",
                     "kill-all", "election", "rollback", "restore-majority", "hold"]
    for left in ("truncate", "bitflip", "wipe-wal"):
        assert left in note
    assert "member" not in note and "records, not bytes" in note


def test_all_on_docker_is_every_fault_but_none_rollback_hold_and_reorder() -> None:
    kinds, note = expand_all("docker")
    assert kinds == [f for f in FAULTS if f not in ("none", "rollback", "restore-majority", "hold",
                                                    "reorder", "slow-disk")]
    assert "rollback" in note and "only the local platform" in note
    assert "restore-majority (it copies the nodes' data directories" in note
    assert "hold (it delays messages" in note


def test_dealt_kinds_give_every_kind_once_per_round_led_by_partition() -> None:
    platform = FakePlatform(5)
    kinds = ["partition", "kill", "pause", "packet"]
    nemesis = Nemesis(platform, kinds, seed=7, interval_s=0.01, record=lambda f, v: None)
    nemesis.deal_kinds = True
    drawn = []
    nemesis.zombie_s = 0.0
    for _ in range(6 * len(kinds)):
        fault = nemesis.begin_next()
        assert fault is not None
        drawn.append(fault.kind)
        nemesis.end(fault)
    rounds = [drawn[i:i + len(kinds)] for i in range(0, len(drawn), len(kinds))]
    assert all(r[0] == "partition" and sorted(r) == sorted(kinds) for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1  # shuffled, not a fixed order


@pytest.mark.integration
@pytest.mark.slow
def test_a_leader_kill_lands_inside_a_snapshot_transfer(tmp_path: Path) -> None:
    from nemesis.platforms.local import LocalPlatform
    from nemesis.windows import Windows

    config = ClusterConfig(nodes=3, run_id="windows-test", work_dir=tmp_path,
                           node_args=("--snapshot-entries", "200", "--snapshot-chunk-bytes", "64"))
    events: list[tuple[str, dict[str, Any]]] = []
    stop = threading.Event()
    with LocalPlatform(config) as platform:
        platform.start()
        wait_until(platform.ready, 60, "a leader with every node up", platform.describe)
        nemesis = Nemesis(platform, ["kill"], seed=1, interval_s=1.0,
                          record=lambda f, v: events.append((f, v)))
        windows = Windows.attach(nemesis)

        def write() -> None:  # enough entries for the leader to compact past the follower
            from system.kv.client import KVClient

            with KVClient(list(platform.client_addresses.values()), timeout_s=5) as kv:
                i = 0
                while not stop.is_set():
                    # A leader change fails a put: the next one finds the new leader.
                    with contextlib.suppress(Exception):
                        kv.put(f"k{i % 300}", b"v" * 40)
                    i += 1

        writers = [threading.Thread(target=write, daemon=True) for _ in range(3)]
        for w in writers:
            w.start()
        try:
            fault = nemesis.begin_next()  # the first kill of a round aims at a transfer
            assert fault is not None, f"no strike; nemesis said: {events}"
            nemesis.end(fault)
        finally:
            stop.set()
            for w in writers:
                w.join(15)
            nemesis.heal_everything()
    lag = [v for f, v in events if v.get("target") == "snapshot-lag"]
    strikes = [v for f, v in events if "window" in v]
    assert len(lag) == 1 and len(strikes) == 1, events
    assert ("restart", lag[0]["id"]) in [(f, v.get("id")) for f, v in events]  # came back
    strike = strikes[0]
    window = strike["window"]
    assert strike["fault"] == "kill" and strike["target"] == "leader"
    assert window["kind"] == "snapshot-transfer" and window["follower"] == lag[0]["nodes"][0]
    assert window["lag_fault"] == lag[0]["id"]
    assert window["leader"] == strike["nodes"][0] != window["follower"]
    assert window["size"] > 10 * 64  # a transfer of many chunks
    assert strike["landed"] is True, strike["landed_evidence"]
    assert windows.counts == {"snapshot-transfer": {"aimed": 1, "landed": 1, "not_seen": 0}}
    assert not nemesis.errors


def test_all_cannot_be_combined_with_other_faults(capsys) -> None:
    from nemesis.cli import main

    assert main(["run", "--faults", "all,kill", "--platform", "sim", "--duration", "5"]) == 3
    assert "--faults all cannot be combined" in capsys.readouterr().err


class StalePlatform(FakePlatform):
    """n1 leads; every node is 5 entries short of its next compaction (every 500), last
    index 995. Once n1 and its chosen follower are cut off, n3 leads the others and has
    compacted to `compacts_to`; the follower's log reaches `tail` (the entries n1 still
    appended for it)."""

    def __init__(self, compacts_to: int, tail: int = 1040) -> None:
        super().__init__(5)
        self.compacts_to, self.tail = compacts_to, tail

    def leader(self) -> str | None:
        return "n1"

    def status(self, node_id: str, timeout_s: float = 0.5):  # noqa: ANN201
        from types import SimpleNamespace

        st = SimpleNamespace(role="follower", term=1, leader_id="n1", snapshot_index=500,
                             applied_index=995, last_index=995, commit_index=995)
        if self.cut_set:
            pair = {"n1"} | {n for n in self.node_ids if ("n1", n) not in self.cut_set}
            successor = min(n for n in self.node_ids if n not in pair)
            if node_id == successor:
                st.role, st.term, st.snapshot_index = "leader", 2, self.compacts_to
            elif node_id in pair and node_id != "n1":
                st.last_index = self.tail
        return st


def _stale_strike(platform: StalePlatform) -> tuple[Any, list[tuple[str, dict[str, Any]]]]:
    from nemesis import windows

    events: list[tuple[str, dict[str, Any]]] = []
    nemesis = Nemesis(platform, ["partition"], seed=3, interval_s=0.01,
                      record=lambda f, v: events.append((f, v)))
    aimed = windows.Windows.attach(nemesis)
    nemesis._decks["window:partition"] = ["stale-snapshot"]
    assert aimed.begin("partition") is None  # struck and healed within the call
    return aimed, events


def test_stale_snapshot_heals_once_the_new_leaders_snapshot_falls_in_the_stale_tail() -> None:
    platform = StalePlatform(compacts_to=1000)
    aimed, events = _stale_strike(platform)
    start = next(v for f, v in events if f == "start-partition")
    assert start["shape"] == "stale-snapshot" and start["first_stale"] == 996
    follower = next(n for n in start["nodes"] if n != "n1")
    # The old leader and its follower on one side, the other three on the other.
    rest = sorted(n for n in platform.node_ids if n not in ("n1", follower))
    assert start["graph"]["n1"] == [follower]
    assert all(start["graph"][n] == [m for m in rest if m != n] for n in rest)
    healed = next(v for f, v in events if f == "heal-partition")
    assert healed["id"] == start["id"] and healed["landed"] is True, healed
    assert healed["window"] == {"kind": "stale-snapshot", "leader": rest[0], "follower": follower,
                                "index": 1000, "first_stale": 996, "follower_last": 1040}
    assert not platform.cut_set
    assert aimed.counts == {"stale-snapshot": {"aimed": 1, "landed": 1, "not_seen": 0}}


def test_stale_snapshot_past_the_stale_tail_is_a_miss() -> None:
    platform = StalePlatform(compacts_to=1100)
    aimed, events = _stale_strike(platform)
    healed = next(v for f, v in events if f == "heal-partition")
    assert healed["landed"] is False and "past" in healed["landed_evidence"]
    assert not platform.cut_set
    assert aimed.counts == {"stale-snapshot": {"aimed": 1, "landed": 0, "not_seen": 0}}
