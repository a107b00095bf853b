"""Stored run folders made without a cluster: a history written with the real writer (a
planted stale read during a partition, or a clean one), checked with the real checker."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from histories.write import HistoryWriter
from nemesis import check
from nemesis.store import write_json

REPRODUCE = ("python -m nemesis run --faults partition --duration 3 --interval 1 --nodes 3 "
             "--workload kv --platform local --seed 7")


def make_run(store: Path, name: str, *, stale_read: bool) -> Path:
    """A 3-node kv run folder: writes and reads on two keys, one partition that isolates n3,
    a kill of n2; with `stale_read`, n3 answers a read of key 'k' with the value before the
    last acknowledged write while it is cut off."""
    run_dir = store / "kv" / name
    (run_dir / "nodes").mkdir(parents=True)
    write_json(run_dir / "test.json", {
        "argv": ["python", "-m", "nemesis", "run", "--seed", "7"], "reproduce": REPRODUCE,
        "run_id": f"kv-{name}-7", "started": f"2026-01-01T00:00:0{name[-1]}+0000",
        "config": {"platform": "local", "faults": ["partition", "kill"], "duration_s": 3.0,
                   "interval_s": 1.0, "nodes": 3, "workload": "kv", "seed": 7,
                   "unsafe": "stale-read" if stale_read else None},
        "workload": {"name": "kv", "model": "versioned-kv"}, "source_version": "test"})
    for node in ("n1", "n2", "n3"):
        (run_dir / "nodes" / f"{node}.log").write_text(f'{{"node": "{node}", "msg": "started"}}\n')
    write_json(run_dir / "results.json", {"run_id": f"kv-{name}-7", "harness_error": None,
                                          "crashed_nodes": [], "nemesis_errors": []})
    with HistoryWriter(run_dir / "history.jsonl") as h:
        def op(process: int, f: str, key: str, value, outcome: str, **fields):  # noqa: ANN001
            i = h.invoke(process, f, key, value if f == "put" else None,
                         expected_version=fields.pop("expected_version", None))
            time.sleep(0.002)
            h.complete(i, outcome, fields.pop("result", value), **fields)

        version = {"k": 0, "j": 0}
        for n in range(6):  # before the fault: everyone agrees
            for key in ("k", "j"):
                version[key] += 1
                op(n % 3, "put", key, f"{key}{version[key]}", "ok", version=version[key],
                   applied=True, node="n1", term=1)
                op(3 + n % 3, "get", key, None, "ok", result=f"{key}{version[key]}",
                   version=version[key], node=f"n{1 + n % 3}", term=1)
        h.event("nemesis", "start-partition", {
            "fault": "partition", "id": 1, "phase": "start", "nodes": ["n1", "n2", "n3"],
            "description": "isolate-node: n1 n2 | n3", "shape": "isolate-node"})
        old = version["k"]
        version["k"] += 1
        op(0, "put", "k", f"k{version['k']}", "ok", version=version["k"], applied=True,
           node="n1", term=1)
        if stale_read:  # n3 is cut off and answers from its old state
            op(4, "get", "k", None, "ok", result=f"k{old}", version=old, node="n3", term=1)
        else:
            op(4, "get", "k", None, "fail", result=None, node="n3", error="unavailable")
        op(5, "put", "j", "j-lost", "info", result=None, error="deadline exceeded")
        h.event("nemesis", "heal-partition", {
            "fault": "partition", "id": 1, "phase": "end", "nodes": ["n1", "n2", "n3"],
            "description": "isolate-node: n1 n2 | n3"})
        h.event("nemesis", "kill", {"fault": "kill", "id": 2, "phase": "start",
                                    "nodes": ["n2"], "description": "random: n2"})
        op(1, "get", "k", None, "ok", result=f"k{version['k']}", version=version["k"],
           node="n1", term=2)
        h.event("nemesis", "restart", {"fault": "kill", "id": 2, "phase": "end",
                                       "nodes": ["n2"], "description": "random: n2"})
        op(2, "get", "j", None, "ok", result=f"j{version['j']}", version=version["j"],
           node="n2", term=2)
        h.event("nemesis", "heal-all", {"fault": "all", "phase": "end",
                                        "nodes": ["n1", "n2", "n3"],
                                        "description": "all links healed, all nodes running"})
    check.check_run(run_dir, budget_s=10)
    return run_dir


@pytest.fixture(scope="session")
def report_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with a caught canary (invalid), a valid run and a crashed one, reports written."""
    from nemesis.report import write_report

    store = tmp_path_factory.mktemp("report-store") / "store"
    write_report(make_run(store, "20260101T000001", stale_read=False))
    write_report(make_run(store, "20260101T000002", stale_read=True))
    crashed = store / "kv" / "20260101T000003"
    crashed.mkdir(parents=True)
    write_json(crashed / "test.json", {"run_id": "kv-crashed", "started": "2026-01-01T00:00:03+0000",
                                       "config": {"faults": ["kill"], "nodes": 3,
                                                  "duration_s": 5.0},
                                       "workload": {"name": "kv", "model": "versioned-kv"}})
    write_json(crashed / "results.json", {"harness_error": "no leader within 60 s"})
    (crashed / "history.jsonl").write_text("")
    write_report(crashed)
    return store


@pytest.fixture(scope="session")
def valid_run(report_store: Path) -> Path:
    return report_store / "kv" / "20260101T000001"


@pytest.fixture(scope="session")
def invalid_run(report_store: Path) -> Path:
    return report_store / "kv" / "20260101T000002"


@pytest.fixture(scope="session")
def crashed_run(report_store: Path) -> Path:
    return report_store / "kv" / "20260101T000003"
