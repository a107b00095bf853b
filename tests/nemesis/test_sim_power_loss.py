"""lose-unsynced on the simulator against a store that never fsyncs: the fault's rounds lead
with every node at once, which is what exposes it (with a minority or the leader first,
none of these five seeds was caught in 60 s), and a node whose core refuses what its disk
kept is recorded as refused, as a real node's exit 3."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

import nemesis.sim_runner as sim_runner
from nemesis.runner import RunConfig
from system.sim.shell import NodeShell
from system.sim.variant import SimVariant

pytestmark = [pytest.mark.slow]


class SkipsFsyncShell(NodeShell):
    """WRONG: persists each Ready but never fsyncs it; a power loss takes everything since
    the last snapshot, acknowledged writes included."""

    def skips_fsync(self) -> bool:
        return True


SKIPS_FSYNC = SimVariant(name="skips-fsync", shell_class=SkipsFsyncShell,
                         description="never fsyncs (test only)")


def _run(tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, list[dict]]:
    monkeypatch.setattr(sim_runner, "variant_for_run", lambda unsafe: SKIPS_FSYNC)
    run_dir = tmp_path / f"seed{seed}"
    run_dir.mkdir()
    config = RunConfig(argv=[], platform="sim", platform_reason="", nodes=5, seed=seed,
                       faults=["lose-unsynced", "partition"], duration_s=60, interval_s=5,
                       workload="kv", store=tmp_path, concurrency=10, rate=100,
                       op_timeout_s=3, read_consistency="linearizable", unsafe=None,
                       check_budget_s=30)
    code = sim_runner.run_sim(config, run_dir, f"skips-fsync-{seed}", io.StringIO(),
                              {"config": {}})
    events = [json.loads(line) for line in (run_dir / "nemesis.jsonl").read_text().splitlines()]
    return code, events


def test_lose_unsynced_catches_a_store_that_skips_fsync(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for seed in (1, 2, 3, 4):
        code, events = _run(tmp_path, seed, monkeypatch)
        assert code == 1, f"seed {seed}: the store that never fsyncs was not caught"
        assert next(e for e in events if e["f"] == "lose-unsynced")["target"] == "all"


def test_a_node_that_refuses_its_disk_after_a_power_loss_is_recorded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Seed 5: the snapshot (written with its own fsync) survives the first power loss of
    # every node, the hard state does not; each core refuses a term below the snapshot's.
    _, events = _run(tmp_path, 5, monkeypatch)
    refused = [e for e in events if e["f"] == "node-refused"]
    assert refused and all(e["exit_code"] == 3 for e in refused)
    assert "below the snapshot's term" in refused[0]["reason"]
    errors = [e for e in events if e["f"] == "nemesis-error"]
    assert any("cannot take a node back" in e["error"] for e in errors)


def test_the_store_canary_skips_fsync_is_caught_by_lose_unsynced_on_the_simulator(
        tmp_path: Path) -> None:
    """The store's own canary (`--unsafe skips-fsync`, system/sim/unsafe.py), with the
    command line's defaults: caught in each of five seeds, the safe store valid in them."""
    for seed in (201, 202, 203, 204, 205):
        codes = {}
        for unsafe in ("skips-fsync", None):
            run_dir = tmp_path / f"{unsafe}-{seed}"
            run_dir.mkdir()
            config = RunConfig(argv=[], platform="sim", platform_reason="", nodes=5, seed=seed,
                               faults=["lose-unsynced"], duration_s=60, interval_s=10,
                               workload="kv", store=tmp_path, concurrency=10, rate=100,
                               op_timeout_s=3, read_consistency="linearizable", unsafe=unsafe,
                               check_budget_s=30)
            codes[unsafe] = sim_runner.run_sim(config, run_dir, f"{unsafe}-{seed}",
                                               io.StringIO(), {"config": {}})
        assert codes == {"skips-fsync": 1, None: 0}, f"seed {seed}: exit codes {codes}"
