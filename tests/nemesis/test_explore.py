"""`python -m nemesis explore --platform sim`: many runs with drawn settings, findings shrunk.

A bounded exploration of the safe store finds nothing (exit 0); the same bounded
exploration of a canary finds it (exit 1), its reproduce line fails again as a plain
`run`, and the test the shrinker wrote for it passes (the real store keeps the rule, the
canary breaks it)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from nemesis.cli import main
from nemesis.explore import KNOBS, draw, parse_pins, signature, sim_faults

REPO = Path(__file__).resolve().parents[2]
# Small runs: 3 nodes, 3 simulated seconds each (a few CPU seconds per run).
SMALL = ["--set", "nodes=3", "--set", "duration=3", "--set", "interval=1",
         "--set", "concurrency=4", "--set", "rate=50"]


def _explore(tmp_path: Path, *args: str) -> tuple[int, str, dict]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["explore", "--platform", "sim", "--store", str(tmp_path / "store"), *args])
    folders = sorted((tmp_path / "store" / "explore").glob("*"))
    summary = json.loads((folders[-1] / "explore.json").read_text()) if folders else {}
    return code, out.getvalue(), summary


def test_each_knob_draws_from_its_own_seeded_generator() -> None:
    assert draw(7, {}) == draw(7, {})
    assert any(draw(7, {}) != draw(s, {}) for s in range(8, 12))
    pinned = draw(7, {"nodes": 9})
    assert pinned["nodes"] == 9
    # Pinning (or adding) one knob leaves what the others draw for the seed unchanged.
    assert {k: v for k, v in pinned.items() if k != "nodes"} == \
        {k: v for k, v in draw(7, {}).items() if k != "nodes"}
    for seed in range(200):
        settings = draw(seed, {})
        assert settings["faults"] and set(settings["faults"]) <= set(sim_faults())
        assert "restore-majority" not in settings["faults"]  # outside Raft's model
        assert {k.field for k in KNOBS} == set(settings)
    assert parse_pins(["faults=partition,kill", "rate=0"]) == {"faults": ["partition", "kill"],
                                                               "rate": 0.0}
    for bad in ("nodes", "colour=3", "nodes=x", "faults=truncate"):
        with pytest.raises(ValueError):
            parse_pins([bad])


def test_a_signature_names_the_failed_checkers_their_anomalies_and_the_monitors_rules(
        tmp_path: Path) -> None:
    assert signature({"linearizable": {"valid": True}, "lost_writes": {"valid": True}},
                     tmp_path) == ""
    results = {"linearizable": {"valid": True},
               "lost_writes": {"valid": False, "anomalies": [
                   {"kind": "version-reuse", "operations": [{"invoke_index": 30}]},
                   {"kind": "lost-write", "operations": [{"invoke_index": 12}]}]},
               "sim": {"monitor_violations": ["[step 9] applied exactly once: w3 twice",
                                              "[step 9] log matching: n1 and n2 differ"]}}
    # Each checker with its earliest anomaly, and the monitor's first rule.
    assert signature(results, tmp_path) == "invariant:exactly-once+lost-writes:lost-write"


def test_bad_flags_are_refused_with_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("MAO_ALLOW_UNSAFE", raising=False)
    assert main(["explore", "--platform", "sim", "--runs", "1", "--unsafe", "stale-read",
                 "--store", str(tmp_path)]) == 3
    assert "MAO_ALLOW_UNSAFE=1" in capsys.readouterr().err
    assert main(["explore", "--platform", "sim", "--runs", "1", "--set", "faults=truncate",
                 "--store", str(tmp_path)]) == 3
    assert "not run by the sim platform" in capsys.readouterr().err
    assert not (tmp_path / "explore").exists()


def test_a_bounded_exploration_of_the_safe_store_finds_nothing(tmp_path: Path) -> None:
    code, out, summary = _explore(tmp_path, "--runs", "2", "--seed", "7", *SMALL)
    assert code == 0, out
    assert [r["code"] for r in summary["runs"]] == [0, 0]
    assert summary["findings"] == []
    assert "run 2/2 seed 8" in out and "distinct signatures" in out
    # Valid runs' folders are removed (their seed and settings reproduce them).
    assert not any(Path(r["run_dir"]).exists() for r in summary["runs"])


@pytest.mark.slow
def test_a_bounded_exploration_finds_a_canary_and_its_shrunk_test_passes(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MAO_ALLOW_UNSAFE", "1")
    code, out, summary = _explore(tmp_path, "--runs", "1", "--seed", "7", "--unsafe",
                                  "stale-read", "--tests-out", str(tmp_path / "tests"), *SMALL)
    assert code == 1, out
    [finding] = summary["findings"]
    assert finding["signature"].startswith("linearizability:stale-read"), finding
    # A canary's line carries the permission it needs (refused without it).
    assert f"reproduce {finding['signature']}: MAO_ALLOW_UNSAFE=1 python -m nemesis run " in out
    # The reproduce line is a plain `run` that fails the same way.
    argv = finding["reproduce"].split()[4:]
    assert main([*argv, "--store", str(tmp_path / "again")]) == 1
    # The shrunk test, in the run folder and under --tests-out, passes: the real store
    # keeps the rule and the canary's simulator variant breaks it.
    test = Path(finding["test"])
    assert test.parent == tmp_path / "tests" and test.exists()
    assert (Path(summary["runs"][0]["run_dir"]).parents[2] / "tests" / test.name).exists()
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             str(test)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout
