"""The disk faults end to end: short runs on the local platform (one per file fault, and
kill-all), on the simulator (lose-unsynced, kill-all) and on Docker (the file faults; skipped
without an engine). Each run must be valid, record what it damaged (node, file, offset,
bytes) and, where a node refused its damaged data, the steps that rejoined it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nemesis.platforms.base import ClusterConfig
from nemesis.platforms.docker import docker_available
from nemesis.platforms.local import LocalPlatform
from tests.nemesis.test_nemesis_local_run import _leftovers, _run_id

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
DOCKER, DOCKER_REASON = docker_available()
REJOIN_STEPS = ["remove", "wipe", "add", "start", "promote"]


def _run(tmp_path: Path, *args: str, timeout_s: float = 300) -> tuple[str, Path, list[dict]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "nemesis", "run", "--store",
                           str(tmp_path / "store"), "--nodes", "3", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    run_dir = (tmp_path / "store" / "latest").resolve()
    events = [json.loads(line) for line in (run_dir / "nemesis.jsonl").read_text().splitlines()]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["valid"] is True and results["crashed_nodes"] == [], out
    assert results["nemesis_errors"] == [] and results["final_reads"]["unread"] == []
    return out, run_dir, events


def _check_damage(events: list[dict], kind: str) -> list[dict]:
    starts = [e for e in events if e["f"] == kind]
    assert starts, events
    for start in starts:
        assert start["damage"], start
        for d in start["damage"]:
            assert d["node"] in start["nodes"] and {"file", "offset", "bytes"} <= d.keys(), d
    return starts


def _check_rejoins(events: list[dict]) -> int:
    """Every refusal is followed by its rejoin's steps, in order, before its fault's end."""
    refusals = 0
    for i, event in enumerate(events):
        if event["f"] != "node-refused":
            continue
        refusals += 1
        node, ident = event["node"], event["id"]
        assert event["exit_code"] == 3 and "refuses to start" in event["reason"], event
        steps = [e["step"] for e in events[i + 1:] if e["f"] == "rejoin-step"
                 and e["node"] == node and e["id"] == ident][:5]
        assert steps == REJOIN_STEPS, (node, steps)
        end = next(e for e in events[i + 1:] if e.get("phase") == "end" and e.get("id") == ident)
        assert node in end["rejoined"], end
    assert events[-1]["f"] == "heal-all" and "rejoined" not in events[-1]["description"]
    return refusals


@pytest.mark.parametrize("kind", ["truncate", "bitflip", "wipe-wal"])
def test_local_file_fault_run_is_valid_and_records_the_damage(tmp_path: Path, kind: str) -> None:
    _, run_dir, events = _run(tmp_path, "--platform", "local", "--faults", kind,
                              "--duration", "20", "--interval", "3", "--seed", "3")
    starts = _check_damage(events, kind)
    for d in (d for s in starts for d in s["damage"]):
        if kind == "truncate":
            assert d["file"].startswith("wal/") and d["size_after"] == d["offset"]
            assert 1 <= d["bytes"] == d["size_before"] - d["size_after"]
        elif kind == "bitflip":
            assert 1 <= d["bits"] <= 8 and d["size_after"] == d["size_before"]
        else:
            assert d["file"] == "wal/" and d["bytes"] == sum(d["removed"].values())
    refusals = _check_rejoins(events)
    if kind == "bitflip":  # a flipped bit in a WAL record is always seen (a checksum)
        assert refusals >= 1
        node = next(e["node"] for e in events if e["f"] == "node-refused")
        log = (run_dir / "nodes" / f"{node}.log").read_text().splitlines()
        assert len({json.loads(line)["member_id"] for line in log
                    if "identity confirmed" in line}) >= 2, "rejoined as a new incarnation"
    assert _leftovers(_run_id(tmp_path)) == (set(), set())


def test_local_kill_all_run_is_valid(tmp_path: Path) -> None:
    _, _, events = _run(tmp_path, "--platform", "local", "--faults", "kill-all",
                        "--duration", "20", "--interval", "3", "--seed", "1")
    kills = [e for e in events if e["f"] == "kill-all"]
    assert kills and all(e["nodes"] == ["n1", "n2", "n3"] for e in kills)
    assert len([e for e in events if e["f"] == "restart"]) == len(kills)
    assert _leftovers(_run_id(tmp_path)) == (set(), set())


def _local_loses_unsynced() -> bool:
    platform = LocalPlatform(ClusterConfig(nodes=1, run_id="probe", work_dir=Path("/tmp"),
                                           lazy_disk=True))
    try:
        return platform.supports_power_loss()
    finally:
        platform.close()


def test_local_lose_unsynced_run_is_valid_or_refused_in_one_line(tmp_path: Path) -> None:
    """Until the local platform's lazy disk exists, the run is refused before any node
    starts; once it exists, the run is valid."""
    if _local_loses_unsynced():
        _, _, events = _run(tmp_path, "--platform", "local", "--faults", "lose-unsynced",
                            "--duration", "20", "--interval", "3", "--seed", "1")
        assert [e["target"] for e in events if e["f"] == "lose-unsynced"][0] == "all"
        return
    proc = subprocess.run([sys.executable, "-m", "nemesis", "run", "--store",
                           str(tmp_path / "store"), "--platform", "local", "--faults",
                           "lose-unsynced", "--duration", "5", "--nodes", "3"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert ("harness error: --faults lose-unsynced needs nodes on a disk that can lose "
            "unsynced writes; the local platform has none") in proc.stdout


def test_sim_lose_unsynced_and_kill_all_are_power_loss_and_crash(tmp_path: Path) -> None:
    args = ("--platform", "sim", "--faults", "lose-unsynced,kill-all", "--duration", "30",
            "--interval", "2", "--seed", "2")
    _, run_dir, events = _run(tmp_path / "a", *args)
    power = [e for e in events if e["f"] == "lose-unsynced"]
    assert power and power[0]["target"] == "all" and power[0]["nodes"] == ["n1", "n2", "n3"]
    assert any(e["f"] == "kill-all" for e in events)
    trace = (run_dir / "nodes" / "sim-trace.log").read_text()
    assert "crash n1 losing unsynced writes" in trace
    # Same seed, same history: the disk faults keep the simulator deterministic.
    _, again, _ = _run(tmp_path / "b", *args)
    assert (again / "history.jsonl").read_bytes() == (run_dir / "history.jsonl").read_bytes()


@pytest.mark.skipif(not DOCKER, reason=f"needs a Docker engine ({DOCKER_REASON})")
def test_docker_file_fault_run_is_valid_and_leaves_nothing(tmp_path: Path) -> None:
    from tests.nemesis.test_nemesis_docker_run import _labelled

    _, run_dir, events = _run(tmp_path, "--platform", "docker", "--faults",
                              "truncate,bitflip,wipe-wal", "--duration", "25", "--interval", "3",
                              "--seed", "5", timeout_s=600)
    assert {e["f"] for e in events} & {"truncate", "bitflip", "wipe-wal"}
    for kind in {e["f"] for e in events} & {"truncate", "bitflip", "wipe-wal"}:
        _check_damage(events, kind)
    _check_rejoins(events)
    run_id = json.loads((run_dir / "test.json").read_text())["run_id"]
    assert _labelled(run_id) == set()
