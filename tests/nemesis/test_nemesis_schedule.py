"""The nemesis against an in-memory platform: what it records, that a seed repeats it, that
each round of shapes and targets leads with the leader, and that the end heals everything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemesis import partitions
from nemesis.faults import Nemesis, parse_faults
from nemesis.platforms.base import ClusterConfig, Platform


class FakePlatform(Platform):
    """Records what was done to it; n1 always leads."""

    def __init__(self, nodes: int) -> None:
        super().__init__(ClusterConfig(nodes=nodes, run_id="fake", work_dir=Path("/nonexistent")))
        self.cut_set: set[tuple[str, str]] = set()
        self.loss: dict[tuple[str, str], float] = {}
        self.down: set[str] = set()
        self.paused: set[str] = set()

    def start(self) -> None: ...
    def close(self) -> None: ...

    @property
    def client_addresses(self) -> dict[str, str]:
        return {n: f"127.0.0.1:{7000 + i}" for i, n in enumerate(self.node_ids)}

    def start_node(self, node_id: str) -> None:
        self.down.discard(node_id)

    def stop_node(self, node_id: str) -> None:
        self.down.add(node_id)

    def kill(self, node_id: str) -> None:
        self.down.add(node_id)

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
    events, _ = _drive("pause", seed=2, rounds=4)
    assert [v["target"] for f, v in events if f == "pause"][::2] == ["leader", "leader"]


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
