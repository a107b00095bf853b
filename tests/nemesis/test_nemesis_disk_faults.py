"""The disk faults (truncate, bitflip, wipe-wal, lose-unsynced, kill-all) against an in-memory
platform whose nodes' data directories are real temporary folders damaged by the real
`disk_damage` module: what is recorded, what is damaged, and the rejoin of a node that
refuses its data (remove, wipe, add, start, promote), finished by the end-of-run heal when
it breaks off half way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nemesis import cli
from nemesis.faults import POWER_TARGETS, Nemesis, parse_faults, unsupported
from nemesis.platforms import disk_damage
from nemesis.platforms.base import ClusterConfig, PlatformError
from nemesis.runner import HarnessError, RunConfig, check_platform, make_platform
from tests.nemesis.test_nemesis_schedule import FakePlatform

REFUSAL = ("error: node {node} refuses to start: corrupt data in /data: wal/1.wal at 7: bad "
           "checksum. Nothing was served.")


class DiskPlatform(FakePlatform):
    """FakePlatform with a data directory per node (two WAL segments, a snapshot, IDENTITY).
    A node whose files were damaged refuses to start (exit 3) when `refuse` is set, until
    it is wiped; `exit_on_start` makes a node exit with another code instead."""

    def __init__(self, nodes: int, root: Path, refuse: bool = True) -> None:
        super().__init__(nodes)
        self.root = root
        self.refuse = refuse
        self.damaged: set[str] = set()
        self.exited: dict[str, int] = {}
        self.exit_on_start: dict[str, int] = {}
        self.power_lost: list[list[str]] = []
        for node in self.node_ids:
            self._fill(node)

    def _fill(self, node: str) -> None:
        data = self.root / node
        (data / "wal").mkdir(parents=True)
        (data / "snapshots").mkdir()
        (data / "wal" / "0000000000000001.wal").write_bytes(bytes(range(256)) * 40)
        (data / "wal" / "0000000000000002.wal").write_bytes(bytes(range(256)) * 20)
        (data / "snapshots" / "snapshot-100-2.snap").write_bytes(b"S" * 3000)
        (data / "IDENTITY").write_text("{}")

    def supports_file_faults(self) -> bool:
        return True

    def supports_power_loss(self) -> bool:
        return True

    def data_files(self, node_ids: list[str]) -> dict[str, dict[str, int]]:
        assert all(n in self.down for n in node_ids), "files listed while the node runs"
        return disk_damage.handle({"op": "list",
                                   "dirs": {n: str(self.root / n) for n in node_ids}})

    def damage_files(self, damages: dict[str, list[dict]]) -> dict[str, list[dict]]:
        assert all(n in self.down for n in damages), "files damaged while the node runs"
        self.calls += [f"damage {n}" for n in damages]
        self.damaged.update(damages)
        return disk_damage.handle({"op": "damage", "damage": damages,
                                   "dirs": {n: str(self.root / n) for n in damages}})

    def power_loss(self, node_ids: list[str]) -> None:
        self.power_lost.append(list(node_ids))
        for node in node_ids:
            self.kill(node)

    def wipe(self, node_id: str) -> None:
        super().wipe(node_id)
        self.damaged.discard(node_id)

    def start_node(self, node_id: str) -> None:
        super().start_node(node_id)
        self.exited.pop(node_id, None)
        code = self.exit_on_start.get(node_id)
        if code is None and self.refuse and node_id in self.damaged:
            code = 3
        if code is not None:  # it exits at once, as a node that refuses its data does
            self.down.add(node_id)
            self.exited[node_id] = code

    def kill(self, node_id: str) -> None:
        super().kill(node_id)
        self.exited[node_id] = -9

    def exit_code(self, node_id: str) -> int | None:
        return self.exited.get(node_id) if node_id in self.down else None

    def wait_started(self, node_id: str, timeout_s: float) -> int | None:
        return self.exit_code(node_id)

    def exit_reason(self, node_id: str) -> str:
        return REFUSAL.format(node=node_id) if self.exited.get(node_id) == 3 else "boom"


def _nemesis(platform: FakePlatform, faults: list[str], seed: int = 1
             ) -> tuple[Nemesis, list[tuple[str, dict[str, Any]]]]:
    events: list[tuple[str, dict[str, Any]]] = []
    nemesis = Nemesis(platform, faults, seed=seed, interval_s=0.01,
                      record=lambda f, v: events.append((f, v)))
    return nemesis, events


def test_truncate_cuts_a_wal_segment_records_where_and_restarts_the_node(tmp_path: Path) -> None:
    platform = DiskPlatform(5, tmp_path, refuse=False)
    nemesis, events = _nemesis(platform, ["truncate"])
    fault = nemesis._begin("truncate")
    assert fault is not None and set(fault.nodes) <= nemesis.expected_down
    assert 1 <= len(fault.nodes) <= 2 and fault.nodes == sorted(fault.nodes)
    f, start = events[-1]
    assert f == "truncate" and start["phase"] == "start" and start["target"] == "minority"
    assert [d["node"] for d in start["damage"]] == fault.nodes
    for d in start["damage"]:
        path = tmp_path / d["node"] / d["file"]
        assert d["file"].startswith("wal/") and d["kind"] == "truncate"
        assert path.stat().st_size == d["size_after"] == d["offset"]
        assert d["bytes"] == d["size_before"] - d["size_after"] >= 1
        assert d["bytes"] <= d["size_before"] * 9 // 10
        assert d["node"] in start["description"] and d["file"] in start["description"]
    nemesis._end(fault)
    assert events[-1][0] == "restart" and events[-1][1]["phase"] == "end"
    assert not platform.down and not nemesis.expected_down
    assert "refused" not in events[-1][1]


def test_truncation_prefers_the_newest_segment_and_cuts_from_one_byte_to_most(
        tmp_path: Path) -> None:
    nemesis, _ = _nemesis(DiskPlatform(3, tmp_path), ["truncate"], seed=9)
    files = {"wal/0000000000000001.wal": 1_000_000, "wal/0000000000000002.wal": 1_000_000}
    plans = [nemesis._plan_damage("truncate", files)[0] for _ in range(400)]
    newest = sum(p["file"].endswith("2.wal") for p in plans)
    assert 0.6 * 400 < newest < 0.8 * 400, newest  # mostly the newest, sometimes the other
    cuts = [1_000_000 - p["size"] for p in plans]
    assert min(cuts) >= 1 and max(cuts) <= 900_000
    assert sum(c <= 100 for c in cuts) > 40 and sum(c > 100_000 for c in cuts) > 40
    assert nemesis._plan_damage("truncate", {"snapshots/s.snap": 10}) == []


def test_bitflip_flips_one_to_eight_bits_of_a_segment_or_the_snapshot(tmp_path: Path) -> None:
    platform = DiskPlatform(3, tmp_path, refuse=False)
    nemesis, events = _nemesis(platform, ["bitflip"], seed=4)
    hit: set[str] = set()
    for _ in range(12):
        before = {n: {p: p.read_bytes() for p in (tmp_path / n).rglob("*") if p.is_file()}
                  for n in platform.node_ids}
        fault = nemesis._begin("bitflip")
        assert fault is not None
        (d,) = events[-1][1]["damage"]
        hit.add(d["file"].split("/")[0])
        path = tmp_path / d["node"] / d["file"]
        old, new = before[d["node"]][path], path.read_bytes()
        assert 1 <= d["bits"] == len(d["flips"]) <= 8 and d["size_after"] == d["size_before"]
        changed = {i: old[i] ^ new[i] for i in range(len(old)) if old[i] != new[i]}
        expected: dict[int, int] = {}
        for offset, bit in d["flips"]:
            expected[offset] = expected.get(offset, 0) ^ (1 << bit)
        assert changed == expected and d["offset"] == d["flips"][0][0]
        assert d["bytes"] == len({o for o, _ in d["flips"]})
        nemesis._end(fault)
    assert hit == {"wal", "snapshots"}


def test_wipe_wal_removes_the_log_folder_and_keeps_everything_else(tmp_path: Path) -> None:
    platform = DiskPlatform(3, tmp_path, refuse=False)
    nemesis, events = _nemesis(platform, ["wipe-wal"])
    fault = nemesis._begin("wipe-wal")
    assert fault is not None
    (d,) = events[-1][1]["damage"]
    assert d["file"] == "wal/" and d["bytes"] == 256 * 60 and len(d["removed"]) == 2
    data = tmp_path / d["node"]
    assert not (data / "wal").exists()
    assert (data / "IDENTITY").exists() and (data / "snapshots" / "snapshot-100-2.snap").exists()
    nemesis._end(fault)


def test_a_node_that_refuses_its_data_is_rejoined_as_its_message_says(tmp_path: Path) -> None:
    platform = DiskPlatform(3, tmp_path)
    nemesis, events = _nemesis(platform, ["truncate"])
    fault = nemesis._begin("truncate")
    assert fault is not None
    (node,) = fault.nodes
    platform.calls.clear()
    nemesis._end(fault)
    # Never started again as the same member on refused data: removed and wiped first,
    # started empty only after it was added back as a learner, promoted once it runs.
    assert platform.calls == [f"start {node}", f"remove {node}", f"wipe {node}", f"add {node}",
                              f"start {node}", f"promote {node}"]
    names = [f for f, _ in events]
    assert names[1:] == ["node-refused"] + ["rejoin-step"] * 5 + ["restart"]
    refused = events[1][1]
    assert refused["node"] == node and refused["exit_code"] == 3 and refused["id"] == fault.id
    assert "refuses to start" in refused["reason"] and refused["phase"] == "step"
    assert [v["step"] for f, v in events if f == "rejoin-step"] == [
        "remove", "wipe", "add", "start", "promote"]
    assert events[-1][1]["refused"] == [node] and events[-1][1]["rejoined"] == [node]
    assert platform.voters == set(platform.node_ids) and not platform.learners
    assert not platform.down and not nemesis.expected_down and not nemesis.rejoining
    assert not nemesis.errors


def test_heal_everything_finishes_a_rejoin_that_broke_off(tmp_path: Path) -> None:
    platform = DiskPlatform(3, tmp_path)
    nemesis, events = _nemesis(platform, ["truncate", "kill"])
    fault = nemesis._begin("truncate")
    assert fault is not None
    (node,) = fault.nodes
    platform.fail_promote = True  # the new learner does not catch up in time
    nemesis._end(fault)
    assert nemesis.errors and node in nemesis.rejoining and platform.learners == {node}
    assert events[-2][0] == "rejoin-step" and "error" in events[-2][1]
    platform.fail_promote = False
    nemesis.heal_everything()
    assert platform.voters == set(platform.node_ids) and not platform.learners
    assert not nemesis.rejoining and not platform.down
    assert f"rejoined {node}" in events[-1][1]["description"]


def test_heal_everything_does_not_start_a_refused_node_on_its_data(tmp_path: Path) -> None:
    """The procedure broke off after `remove` (the wipe failed): at the end the node must
    be wiped before it starts, not started on the refused files as a non-member."""
    platform = DiskPlatform(3, tmp_path)
    nemesis, _ = _nemesis(platform, ["wipe-wal"])
    fault = nemesis._begin("wipe-wal")
    assert fault is not None
    (node,) = fault.nodes
    wipe = platform.wipe
    platform.wipe = lambda n: (_ for _ in ()).throw(PlatformError("helper failed"))
    nemesis._end(fault)
    assert node in nemesis.rejoining and node in platform.down and node not in platform.voters
    platform.wipe = wipe
    platform.calls.clear()
    nemesis.heal_everything()
    assert platform.calls.index(f"wipe {node}") < platform.calls.index(f"start {node}")
    assert platform.voters == set(platform.node_ids) and not platform.down


def test_a_node_that_exits_otherwise_is_an_error_and_no_longer_expected_down(
        tmp_path: Path) -> None:
    platform = DiskPlatform(3, tmp_path, refuse=False)
    nemesis, events = _nemesis(platform, ["truncate"])
    fault = nemesis._begin("truncate")
    assert fault is not None
    (node,) = fault.nodes
    platform.exit_on_start[node] = 1
    nemesis._end(fault)
    assert events[-1][1]["crashed"] == [node] and "remove" not in " ".join(platform.calls)
    assert node not in nemesis.expected_down  # so the run reports it as crashed
    assert any(f == "nemesis-error" for f, _ in events) and "code 1" in nemesis.errors[0]


def test_lose_unsynced_rounds_lead_with_every_node_at_once(tmp_path: Path) -> None:
    platform = DiskPlatform(5, tmp_path, refuse=False)
    nemesis, events = _nemesis(platform, ["lose-unsynced"], seed=3)
    for _ in range(6):
        fault = nemesis._begin("lose-unsynced")
        assert fault is not None
        assert set(fault.nodes) <= platform.down
        nemesis._end(fault)
        assert not platform.down
    targets = [v["target"] for f, v in events if f == "lose-unsynced"]
    assert targets[0] == targets[3] == "all"
    assert set(targets[:3]) == set(targets[3:]) == set(POWER_TARGETS)
    assert platform.power_lost[0] == platform.node_ids
    leader = targets.index("leader")
    assert platform.power_lost[leader] == ["n1"]
    assert all(len(n) == 2 for t, n in zip(targets, platform.power_lost, strict=True)
               if t == "minority")


def test_kill_all_kills_every_node_and_restarts_them(tmp_path: Path) -> None:
    platform = DiskPlatform(3, tmp_path, refuse=False)
    nemesis, events = _nemesis(platform, ["kill-all"])
    fault = nemesis._begin("kill-all")
    assert fault is not None and platform.down == set(platform.node_ids)
    assert events[-1][0] == "kill-all" and events[-1][1]["nodes"] == platform.node_ids
    nemesis._end(fault)
    assert not platform.down and not nemesis.expected_down


def test_the_schedule_repeats_with_the_seed_whatever_the_files(tmp_path: Path) -> None:
    def kinds(root: Path, seed: int, size: int) -> list[tuple[str, list[str]]]:
        platform = DiskPlatform(5, root, refuse=False)
        for path in root.rglob("*.wal"):
            path.write_bytes(b"x" * size)
        nemesis, events = _nemesis(platform, ["truncate", "bitflip", "kill-all"], seed=seed)
        for _ in range(8):
            fault = nemesis._guarded("x", lambda: nemesis._begin(nemesis.rng.choice(nemesis.faults)))
            assert fault is not None
            nemesis._end(fault)
        return [(f, v["nodes"]) for f, v in events if v.get("phase") == "start"]

    assert kinds(tmp_path / "a", 5, 1000) == kinds(tmp_path / "b", 5, 77_777)


def test_file_faults_are_refused_on_sim_with_one_line_naming_the_platforms(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_faults("truncate,bitflip,wipe-wal,lose-unsynced,kill-all,partition") == [
        "truncate", "bitflip", "wipe-wal", "lose-unsynced", "kill-all", "partition"]
    assert unsupported(["kill-all", "lose-unsynced"], "sim") is None
    assert unsupported(["partition", "bitflip"], "local") is None
    problem = unsupported(["partition", "bitflip"], "sim")
    assert problem == ("--faults bitflip does not run on --platform sim (the simulator's disk "
                       "holds records, not bytes); use --platform local or docker or ssh")
    assert cli.main(["run", "--platform", "sim", "--faults", "truncate", "--duration", "5"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {unsupported(['truncate'], 'sim')}"]
    assert cli.main(["run", "--platform", "local", "--faults", "wipe-wal", "--nodes", "2"]) == 3
    assert "needs at least 3 nodes" in capsys.readouterr().err


def test_runner_refuses_faults_the_platform_cannot_do_and_asks_for_a_lazy_disk(
        tmp_path: Path) -> None:
    platform = FakePlatform(3)
    with pytest.raises(HarnessError, match="lose-unsynced needs nodes on a disk"):
        check_platform(["partition", "lose-unsynced"], platform)
    with pytest.raises(HarnessError, match="--faults truncate needs a platform"):
        check_platform(["truncate"], platform)
    check_platform(["truncate", "lose-unsynced"], DiskPlatform(3, tmp_path))

    def config(faults: list[str]) -> RunConfig:
        return RunConfig(argv=[], platform="local", platform_reason="", faults=faults,
                         duration_s=1, interval_s=1, nodes=3, workload="kv", seed=1,
                         store=tmp_path, concurrency=1, rate=1, op_timeout_s=1,
                         read_consistency="linearizable", unsafe=None, check_budget_s=1)

    for faults, lazy, snapshots in ((["lose-unsynced"], True, False),
                                    (["kill-all", "truncate"], False, True)):
        made = make_platform(config(faults), "lazy-test", tmp_path)
        try:
            assert made.config.lazy_disk is lazy
            # With file faults snapshots come often enough for bit flips to reach them.
            assert ("--snapshot-entries" in made.config.node_args) is snapshots
        finally:
            made.close()


def test_disk_damage_refuses_paths_outside_the_data_directory(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "secret").write_bytes(b"x" * 10)
    with pytest.raises(ValueError, match="not inside"):
        disk_damage.apply(str(tmp_path / "d"), [{"kind": "truncate", "file": "../secret",
                                                 "size": 1}])
    assert (tmp_path / "secret").stat().st_size == 10
    answer = json.loads(json.dumps(disk_damage.handle({"op": "list", "dirs": {"n1": str(
        tmp_path / "missing")}})))
    assert answer == {"n1": {}}


def test_platform_defaults_refuse_file_faults_with_one_line() -> None:
    platform = FakePlatform(3)
    assert not platform.supports_file_faults()
    with pytest.raises(PlatformError, match="truncate, bitflip, wipe-wal run on --platform "
                                            "local and docker"):
        platform.data_files(["n1"])
    assert ClusterConfig(nodes=1, run_id="x", work_dir=Path("/x")).lazy_disk is False


def test_every_refused_node_is_rejoined_at_the_end_when_the_first_rejoin_breaks_off(
        tmp_path: Path) -> None:
    platform = DiskPlatform(5, tmp_path)
    nemesis, _ = _nemesis(platform, ["kill-all"])
    fault = nemesis._begin("kill-all")
    assert fault is not None
    platform.damaged.update({"n2", "n3"})  # both refuse their data at the restart
    platform.fail_promote = True
    nemesis._end(fault)
    assert "n2" in nemesis.rejoining and nemesis.errors
    platform.fail_promote = False
    platform.calls.clear()
    nemesis.heal_everything()
    # n2 was wiped and started empty before its promotion failed: only promoted now; n3
    # never got its turn: wiped before it starts, never started on its refused files.
    assert [c for c in platform.calls if c.endswith("n2")] == ["promote n2"]
    assert platform.calls.index("wipe n3") < platform.calls.index("start n3")
    assert platform.voters == set(platform.node_ids) and not platform.down
    assert not nemesis.rejoining


def test_the_report_shows_disk_faults_refusals_and_rejoin_steps(tmp_path: Path) -> None:
    from histories.write import HistoryWriter
    from nemesis.report import write_report
    from nemesis.report.data import load_run
    from nemesis.report.show import render

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    history = HistoryWriter(run_dir / "history.jsonl")
    nemesis = Nemesis(DiskPlatform(3, tmp_path / "data"), ["bitflip", "kill-all"], seed=1,
                      interval_s=0.01, record=lambda f, v: history.event("nemesis", f, v))
    call = history.invoke(0, "put", "k", "v1")
    for kind in ("bitflip", "kill-all"):
        fault = nemesis._begin(kind)
        assert fault is not None
        nemesis._end(fault)
    history.complete(call, "ok", "v1", version=1, applied=True, node="n1")
    nemesis.heal_everything()
    history.close()
    (run_dir / "results.json").write_text(json.dumps({"valid": True}))
    data = load_run(run_dir)
    assert [w.fault for w in data.windows] == ["bitflip", "kill-all"]
    assert all(w.end_line is not None for w in data.windows)
    assert "bit(s) flipped" in data.windows[0].description
    markers = [m.f for m in data.markers]
    assert markers == ["node-refused"] + ["rejoin-step"] * 5 + ["heal-all"]
    text = render(data)
    assert "bitflip" in text and "node-refused: n" in text and "rejoin-step: n" in text
    assert ": promote (" in text
    page = write_report(run_dir).read_text()
    assert "node-refused" in page and "rejoin-step" in page
