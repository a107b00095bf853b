"""The main job on the local platform, end to end: a faulted run is valid, a canary is caught,
and nothing is left behind — on success, on Ctrl-C, and when the harness itself is SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from nemesis.platforms.local import RUN_ENV_VAR, TEMP_PREFIX

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def _leftovers(run_id: str) -> tuple[set[int], set[str]]:
    """The run's processes (its id in their environment) and its temporary directories.
    (Other runs may go on beside the test: only this run's count.)"""
    pids = set()
    marker = f"{RUN_ENV_VAR}={run_id}\0".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes() + b"\0":
                    pids.add(int(entry.name))
            except OSError:
                continue
    dirs = {p.name for p in Path(tempfile.gettempdir()).glob(f"{TEMP_PREFIX}{run_id}-*")}
    return pids, dirs


def _run_id(tmp_path: Path) -> str:
    return json.loads(((tmp_path / "store" / "latest").resolve() / "test.json").read_text())["run_id"]


def _wait(condition, timeout_s: float, what: str):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def _nemesis(tmp_path: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "nemesis", "run", "--platform", "local",
                             "--store", str(tmp_path / "store"), *args],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_faulted_run_is_valid_and_leaves_a_complete_run_folder(tmp_path: Path) -> None:
    proc = _nemesis(tmp_path, "--nodes", "3", "--duration", "16", "--interval", "3",
                    "--faults", "partition,kill,pause", "--seed", "11")
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    assert out.splitlines()[0].startswith("platform: local (asked for with --platform local)")
    run_dir = (tmp_path / "store" / "latest").resolve()
    assert run_dir.parent.name == "kv"
    for name in ("test.json", "history.jsonl", "nemesis.jsonl", "results.json", "harness.log",
                 "nodes/n1.log", "nodes/n3.stderr"):
        assert (run_dir / name).exists(), name
    results = json.loads((run_dir / "results.json").read_text())
    assert results["valid"] is True and sum(results["faults"].values()) >= 2
    assert results["final_reads"]["unread"] == []
    # Each node was read back on its own after the final reads; the replicas agree.
    replicas = results["replica_reads"]
    assert sorted(replicas["nodes"]) == ["n1", "n2", "n3"] and replicas["skipped"] == {}
    assert results["replicas_agree"]["valid"] is True
    assert results["replicas_agree"]["counts"]["agree"] >= 3 * replicas["keys"] > 0
    assert "replica reads: n3:" in out
    events = [json.loads(line) for line in (run_dir / "nemesis.jsonl").read_text().splitlines()]
    assert {"start-partition", "kill", "pause"} & {e["f"] for e in events}
    test = json.loads((run_dir / "test.json").read_text())
    assert "--seed 11" in test["reproduce"]
    # Re-checking the stored run needs no cluster and agrees.
    again = subprocess.run([sys.executable, "-m", "nemesis", "check", str(run_dir)], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    assert again.returncode == 0, again.stdout + again.stderr
    assert _leftovers(_run_id(tmp_path)) == (set(), set())


def test_ack_before_commit_canary_is_caught(tmp_path: Path) -> None:
    proc = _nemesis(tmp_path, "--nodes", "3", "--duration", "25", "--interval", "3",
                    "--faults", "partition", "--seed", "3", "--unsafe", "ack-before-commit")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out
    assert "INVALID" in out
    run_dir = (tmp_path / "store" / "latest").resolve()
    results = json.loads((run_dir / "results.json").read_text())
    assert results["valid"] is False
    assert _leftovers(_run_id(tmp_path)) == (set(), set())


def test_hold_delivers_a_deposed_leaders_appends_late_and_the_reports_catch_the_core_that_takes_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """hold on local (the link proxies keep the leader's bytes): the broken core that takes
    an APPEND of an older term is repaired before any read, so only the nodes' reports of
    a diverged committed log show it; every node and proxy is gone at the end."""
    monkeypatch.setenv("MAO_ALLOW_UNSAFE", "1")  # a broken Raft core runs only when asked twice
    proc = _nemesis(tmp_path, "--nodes", "5", "--duration", "30", "--interval", "3",
                    "--faults", "hold", "--seed", "7001",
                    "--unsafe", "accepts-appends-from-older-terms")
    out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 1, out
    run_dir = (tmp_path / "store" / "latest").resolve()
    results = json.loads((run_dir / "results.json").read_text())
    assert results["safety_reports"]["valid"] is False, results["safety_reports"]
    assert results["linearizable"]["valid"] is True  # no answer shows it
    events = [json.loads(line) for line in (run_dir / "nemesis.jsonl").read_text().splitlines()]
    assert any(e["f"] == "release" and e.get("released_bytes") for e in events)
    assert _leftovers(_run_id(tmp_path)) == (set(), set())


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_run_tears_everything_down(tmp_path: Path, sig: int) -> None:
    proc = _nemesis(tmp_path, "--nodes", "3", "--duration", "120", "--faults", "kill",
                    "--interval", "2")
    assert proc.stdout is not None
    _wait(lambda: "running the kv workload" in proc.stdout.readline(), 120, "the workload to start")
    run_id = _run_id(tmp_path)
    pids, dirs = _leftovers(run_id)
    assert len(pids) == 3 and len(dirs) == 1, "the run's nodes and data should be there"
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3, out
    assert "interrupted" in out
    assert _leftovers(run_id) == (set(), set())
    results = json.loads(((tmp_path / "store" / "latest").resolve() / "results.json").read_text())
    assert results["harness_error"] == "interrupted"


def test_sigkilled_harness_leaves_no_node_running_and_clean_removes_the_rest(tmp_path: Path) -> None:
    proc = _nemesis(tmp_path, "--nodes", "3", "--duration", "120", "--faults", "none")
    assert proc.stdout is not None
    _wait(lambda: "running the kv workload" in proc.stdout.readline(), 120, "the workload to start")
    run_id = _run_id(tmp_path)
    assert len(_leftovers(run_id)[0]) == 3
    proc.kill()
    proc.wait(timeout=30)
    # The nodes die with their parent (PR_SET_PDEATHSIG); the data directory is what remains.
    _wait(lambda: not _leftovers(run_id)[0], 30, "the nodes to die with the harness")
    assert _leftovers(run_id)[1], "the killed run's temporary data should still be there"
    clean = subprocess.run([sys.executable, "-m", "nemesis", "clean"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "removed directory" in clean.stdout
    assert _leftovers(run_id) == (set(), set())


def test_member_fault_rejoins_wiped_nodes_as_new_incarnations_and_loses_nothing(
        tmp_path: Path) -> None:
    """Issue 8's operator path under load: a node leaves the cluster, loses its disk, comes
    back as a learner with a new member id and is promoted; the run stays valid, and no
    node dies that the nemesis did not kill (a node restarted from the nemesis's thread
    used to be SIGKILLed when that thread ended: PR_SET_PDEATHSIG follows the thread).
    The member fault's round leads with two-in-flight (nemesis/member_shapes.py): the safe
    leader refuses the second removal, and the history says so in one line."""
    proc = _nemesis(tmp_path, "--nodes", "3", "--duration", "30", "--interval", "3",
                    "--faults", "member", "--seed", "2")
    out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out
    run_dir = (tmp_path / "store" / "latest").resolve()
    events = [json.loads(line) for line in (run_dir / "nemesis.jsonl").read_text().splitlines()]
    starts = [e for e in events if e["f"] == "remove-member"]
    ends = {e["id"]: e for e in events if e["f"] == "rejoin-member"}
    changes = [e for e in events if e["f"] == "member-change"]
    assert starts[0]["shape"] == "two-in-flight", starts[0]
    first = [c for c in changes if c["id"] == starts[0]["id"]]
    assert [c["outcome"] for c in first].count("refused") == 1, first
    assert any("a membership change is in progress" in c["description"] for c in first), first
    rejoined = []
    for start in starts:
        end = ends[start["id"]]
        if start.get("shape") is None:  # remove-and-rejoin: the node removed, then back
            assert end["rejoined"] == start["nodes"][0], (start, end)
            rejoined.append(end["rejoined"])
        else:  # what a change removed is rejoined, the rest kept
            assert sorted(end["rejoined"] + end["kept"]) == sorted(
                start.get("removing") or [start["leader"]]), (start, end)
            rejoined += end["rejoined"]
    assert events[-1]["f"] == "heal-all" and "started" not in events[-1]["description"], events[-1]
    # Each rejoin is a new incarnation of the node's directory: a new member id confirmed.
    for node in set(rejoined):
        log = (run_dir / "nodes" / f"{node}.log").read_text().splitlines()
        member_ids = {json.loads(line)["member_id"] for line in log
                      if "identity confirmed" in line}
        assert len(member_ids) >= 2, (node, member_ids)
    results = json.loads((run_dir / "results.json").read_text())
    assert results["valid"] is True and results["crashed_nodes"] == []
    assert results["final_reads"]["unread"] == []
    assert _leftovers(_run_id(tmp_path)) == (set(), set())
