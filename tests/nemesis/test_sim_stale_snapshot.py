"""The partition fault's stale-snapshot shape on the simulator (SimPlatform.aim_stale_snapshot):
the old leader and a follower cut off together once the others near a compaction, healed
when the new leader's snapshot falls inside the follower's uncommitted tail. The safe store
repairs the follower from that snapshot; a follower that keeps its log because it holds AN
entry at the snapshot's index (`installs-snapshot-by-index-only`) is named by the watch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.nemesis.test_sim_platform import _run

RUN = ["--faults", "partition", "--nodes", "5", "--duration", "30", "--interval", "3",
       "--seed", "9971"]


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]


def test_the_safe_store_takes_the_snapshot_over_its_stale_tail(tmp_path: Path) -> None:
    code, run = _run(tmp_path, *RUN)
    assert code == 0
    heals = [r["value"] for r in _records(run) if r["f"] == "heal-partition"
             and r["value"].get("window", {}).get("kind") == "stale-snapshot"]
    assert any(h["landed"] for h in heals), heals
    landed = next(h for h in heals if h["landed"])["window"]
    assert landed["first_stale"] <= landed["index"] <= landed["follower_last"]


def test_a_follower_keeping_a_conflicting_log_under_a_snapshot_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAO_ALLOW_UNSAFE", "1")
    code, run = _run(tmp_path, *RUN, "--unsafe", "installs-snapshot-by-index-only")
    assert code == 1
    rules = {r["value"]["rule"] for r in _records(run) if r["f"] == "safety-report"}
    assert "snapshot-kept-conflicting-log" in rules, rules
