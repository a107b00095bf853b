"""benchmarks/systems_compare.py's figures, on small run folders written here with known
times, against values computed by hand; no cluster is started."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks import systems_compare
from benchmarks.systems_compare import RunOutcome, measure, parse_seeds, render

S = 1_000_000_000  # nanoseconds per second


class Folder:
    """A run folder whose history is written record by record with explicit times."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[dict] = []

    def op(self, t: float, process: int, type_: str, f: str, **fields) -> None:
        self.records.append({"time": int(t * S), "process": process, "type": type_, "f": f,
                             "key": fields.pop("key", "k"), "value": fields.pop("value", None),
                             **fields})

    def event(self, t: float, f: str, fault: str, phase: str, ident: int | None = None) -> None:
        value = {"fault": fault, "phase": phase, "nodes": ["n1"], "description": f"{fault} n1"}
        if ident is not None:
            value["id"] = ident
        self.records.append({"time": int(t * S), "process": "nemesis", "type": "info", "f": f,
                             "key": None, "value": value})

    def write(self, valid: bool | str = True) -> Path:
        self.path.mkdir(parents=True)
        lines = [json.dumps({"index": i, **r}) for i, r in enumerate(self.records)]
        (self.path / "history.jsonl").write_text("\n".join(lines) + "\n")
        system = {"name": "etcd", "version": "3.4.23"}
        (self.path / "results.json").write_text(json.dumps({"valid": valid, "system": system}))
        (self.path / "test.json").write_text(json.dumps(
            {"system": system, "reproduce": "python -m nemesis run --system etcd --seed 7"}))
        return self.path


def faulted_run(path: Path) -> Path:
    """Two faults: a partition [2, 6) healed by its own event, a kill from 8 never healed by
    its own (the heal-all at 10 ends the workload); then a final read, not counted."""
    h = Folder(path)
    h.op(0.0, 0, "invoke", "put", value="a")
    h.op(1.0, 0, "ok", "put", value="a", version=1, applied=True)  # ack outside
    h.event(2.0, "partition", "partition", "start", 1)
    h.op(2.5, 1, "invoke", "get")
    h.op(3.0, 1, "ok", "get", value="a", version=1)  # ack inside
    h.op(3.0, 0, "invoke", "put", value="b", expected_version=5)
    h.op(3.5, 0, "ok", "put", value="b", version=1, applied=False)  # ack inside, no write
    h.op(4.0, 0, "invoke", "put", value="c")
    h.op(4.5, 0, "ok", "put", value="c", version=2, applied=True)  # inside; 2.5 s after #1
    h.event(6.0, "heal", "partition", "end", 1)
    h.op(7.0, 1, "invoke", "get")
    h.op(7.5, 1, "ok", "get", value="c", version=2)  # ack outside
    h.op(7.8, 2, "invoke", "delete")
    h.event(8.0, "kill", "kill", "start", 2)
    h.op(8.2, 2, "ok", "delete", version=2, applied=True)  # inside; invoked before #2
    h.op(8.5, 1, "invoke", "get")
    h.op(9.0, 1, "ok", "get", value=None, version=0)  # ack inside
    h.op(9.0, 0, "invoke", "put", value="d")
    h.op(9.5, 0, "fail", "put", value="d", error="no leader")
    h.event(10.0, "heal-all", "all", "end")
    h.op(10.5, 100, "invoke", "get", consistency="linearizable")
    h.op(11.0, 100, "ok", "get", value=None, version=0)  # final read
    return h.write()


def test_availability_inside_and_outside_fault_windows(tmp_path: Path) -> None:
    m = measure(faulted_run(tmp_path / "run"))
    assert m.workload_s == pytest.approx(10.0)
    assert m.counts == {"ok": 7, "fail": 1, "info": 0}  # the final read is left out
    # Windows [2, 6) and [8, 10): 6 s inside, 4 s outside; acks by completion time:
    # outside 1.0 and 7.5; inside 3.0, 3.5, 4.5, 8.2, 9.0.
    assert m.inside_s == pytest.approx(6.0) and m.outside_s == pytest.approx(4.0)
    assert (m.ok_inside, m.ok_outside) == (5, 2)
    assert m.rate_inside == pytest.approx(5 / 6) and m.rate_outside == pytest.approx(0.5)
    assert (m.system, m.system_version, m.verdict) == ("etcd", "3.4.23", "valid")


def test_time_to_first_write_counts_applied_writes_invoked_after_the_fault(tmp_path: Path) -> None:
    m = measure(faulted_run(tmp_path / "run"))
    # #1 at 2.0: the get (3.0) is no write and the cas at 3.5 did not apply; the put at 4.5
    # is the first. #2 at 8.0: the delete acked at 8.2 was invoked before it, the put after
    # it failed: no write after #2 at all, which is "none", not 0.
    assert [r.to_first_write_s for r in m.recoveries] == [pytest.approx(2.5), None]
    assert m.recovery_median == pytest.approx(2.5) and m.recovery_max == pytest.approx(2.5)
    assert m.without_write == 1
    row = systems_compare.run_row(RunOutcome("etcd", "local", 7, [], 0, m.run_dir, m))
    assert row[3] == "valid (0)" and row[4:8] == ["7", "1", "0", "2: kill 1, partition 1"]
    assert row[8:12] == ["0.5", "0.8", "2.50", "2.50 (1 none)"]
    # The table names the folder relative to the working directory when it lies inside it.
    assert Path(row[12]).resolve() == Path(m.run_dir).resolve()


def test_a_run_without_faults(tmp_path: Path) -> None:
    h = Folder(tmp_path / "quiet")
    h.op(0.0, 0, "invoke", "put", value="a")
    h.op(0.5, 0, "ok", "put", value="a", version=1, applied=True)
    h.op(1.0, 0, "invoke", "get")
    h.op(2.0, 0, "ok", "get", value="a", version=1)
    h.event(4.0, "heal-all", "all", "end")
    m = measure(h.write())
    assert m.inside_s == 0 and m.rate_inside is None
    assert m.outside_s == pytest.approx(4.0) and m.rate_outside == pytest.approx(0.5)
    assert m.recoveries == [] and m.recovery_median is None and m.recovery_max is None
    row = systems_compare.run_row(RunOutcome("store", "docker", 1, [], 0, m.run_dir, m))
    assert row[7:12] == ["0", "0.5", "-", "none", "none"]


def test_overlapping_windows_count_once_and_an_unhealed_run_ends_with_its_history(
        tmp_path: Path) -> None:
    h = Folder(tmp_path / "overlap")
    h.op(0.0, 0, "invoke", "get")
    h.event(1.0, "partition", "partition", "start", 1)
    h.event(2.0, "pause", "pause", "start", 2)
    h.event(3.0, "heal", "partition", "end", 1)
    h.op(3.5, 0, "ok", "get", value=None, version=0)
    h.event(4.0, "resume", "pause", "end", 2)
    h.op(6.0, 1, "invoke", "get")
    h.op(8.0, 1, "ok", "get", value=None, version=0)  # no heal-all: the run was cut short
    m = measure(h.write(valid="unknown"))
    assert m.workload_s == pytest.approx(8.0)
    assert m.inside_s == pytest.approx(3.0)  # [1, 4), not 2 + 2
    assert (m.ok_inside, m.ok_outside) == (1, 1)
    assert m.verdict == "unknown"


def test_parse_seeds() -> None:
    assert parse_seeds("1-5") == [1, 2, 3, 4, 5]
    assert parse_seeds("1-2,7") == [1, 2, 7]
    with pytest.raises(argparse.ArgumentTypeError, match="backwards"):
        parse_seeds("5-1")


def test_summary_rows_and_findings_are_rendered(tmp_path: Path) -> None:
    good = measure(faulted_run(tmp_path / "a"))
    h = Folder(tmp_path / "b")
    h.op(0.0, 0, "invoke", "put", value="a")
    h.op(1.0, 0, "ok", "put", value="a", version=1, applied=True)
    h.event(2.0, "heal-all", "all", "end")
    bad = measure(h.write(valid=False))
    outcomes = [RunOutcome("etcd", "local", 1, [], 0, good.run_dir, good),
                RunOutcome("etcd", "local", 2, [], 1, bad.run_dir, bad)]
    text = render(outcomes, command="c", load_before="1", load_after="2",
                  versions={"etcd": "3.4.23"}, duration_s=120, complete=True)
    summary = next(line for line in text.splitlines() if "median of 2" in line)
    assert "1 invalid, 1 valid" in summary and "(1 none in all)" in summary
    assert "## Runs that were not valid" in text
    assert "python -m nemesis run --system etcd --seed 7" in text  # the reproduce line
    assert str(tmp_path / "b") in text


def test_ctrl_c_writes_only_a_partial_file_that_says_so(tmp_path: Path, monkeypatch) -> None:
    run_dir = faulted_run(tmp_path / "run")
    calls = []

    def fake_run(command, prefix):  # noqa: ANN001, ANN202
        calls.append(command)
        return (0, run_dir, False) if len(calls) == 1 else (None, None, True)

    monkeypatch.setattr(systems_compare, "run_harness", fake_run)
    out = tmp_path / "systems.md"
    code = systems_compare.main(["--duration", "5", "--seeds", "1-3", "--systems", "etcd",
                                 "--platforms", "local", "--out", str(out)])
    assert code == 130 and len(calls) == 2
    assert not out.exists()
    partial = (tmp_path / "systems.partial.md").read_text()
    assert "PARTIAL: interrupted by Ctrl-C during run 2 of 3; 1 runs measured" in partial
    assert "interrupted (-); not measured: interrupted by Ctrl-C" in partial


FAKE_HARNESS = r"""
import pathlib, signal, sys, time
folder, ready = sys.argv[1], pathlib.Path(sys.argv[2])
def stop(signum, frame):
    ready.with_name("stopped").touch()
    print("interrupted: tearing the cluster down ...")
    print(f"run folder (partial): {folder}", flush=True)
    sys.exit(3)
signal.signal(signal.SIGINT, stop)
print(f"run folder: {folder}", flush=True)
ready.touch()
deadline = time.monotonic() + 20
while time.monotonic() < deadline:  # until the SIGINT this test forwards
    time.sleep(0.05)
print("never interrupted", flush=True)
sys.exit(0)
"""


def test_ctrl_c_is_forwarded_once_and_the_run_folder_still_named(tmp_path: Path) -> None:
    """Ctrl-C in the comparison reaches the harness (in its own session) as one SIGINT;
    the folder the harness named is returned and the run is marked interrupted."""
    import os
    import signal
    import threading
    import time

    ready = tmp_path / "ready"
    folder = tmp_path / "store" / "kv" / "20260101T000000"

    def press_ctrl_c() -> None:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C on the terminal does to us

    presser = threading.Thread(target=press_ctrl_c, daemon=True)
    presser.start()
    code, run_dir, interrupted = systems_compare.run_harness(
        ["python", "-c", FAKE_HARNESS, str(folder), str(ready)], "    ")
    presser.join(timeout=5)
    assert interrupted and code is None
    assert run_dir == folder
    assert (tmp_path / "stopped").exists()  # the harness got the SIGINT and stopped on it


def test_stored_run_folders_are_tabulated_without_running_anything(tmp_path: Path,
                                                                     monkeypatch) -> None:
    run_dir = faulted_run(tmp_path / "run")
    test = json.loads((run_dir / "test.json").read_text())
    test["config"] = {"platform": "docker", "seed": 4, "duration_s": 120.0}
    (run_dir / "test.json").write_text(json.dumps(test))
    monkeypatch.setattr(systems_compare, "run_harness", None)  # calling it would fail
    out = tmp_path / "systems.md"
    assert systems_compare.main(["--measure", str(run_dir), "--out", str(out)]) == 0
    row = next(line for line in out.read_text().splitlines() if "| 4 " in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:4] == ["etcd", "docker", "4", "valid (0)"]
    assert "--duration 120 --seed N" in out.read_text()
    assert "Versions: etcd 3.4.23." in out.read_text()
