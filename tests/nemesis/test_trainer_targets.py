"""The trainer workload's process targets against a scripted run (no processes): `start`
waits for a lease holder, a mid-write pause with no takeover is woken with a note that says
why, and a coordinator woken after a takeover is given time to exit before the stop."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from system.trainer.lease import LeaseRecord
from workloads.base import WorkloadError
from workloads.trainer import TrainerWorkload


class FakeProc:
    def __init__(self) -> None:
        self.code: int | None = None

    def poll(self) -> int | None:
        return self.code


class FakeRun:
    """What TrainerWorkload reads of TrainerRun: processes, the lease record, SIGCONT."""

    def __init__(self, names: list[str], holder: str | None) -> None:
        self.procs = {name: FakeProc() for name in names}
        self.holder = holder
        self.paused: list[str] = []
        self.resumed: list[str] = []
        self.refused: str | None = None
        self.run_dir = Path("/nonexistent/run")

    def lease(self) -> LeaseRecord | None:
        return LeaseRecord(self.holder, "127.0.0.1:1", 1) if self.holder else None

    def active_coordinator(self) -> str | None:
        return self.holder

    def config_error(self) -> str | None:
        return self.refused

    def pause(self, name: str) -> None:
        self.paused.append(name)

    def resume(self, name: str) -> None:
        self.resumed.append(name)


def _workload(run: FakeRun, monkeypatch: pytest.MonkeyPatch) -> TrainerWorkload:
    workload = TrainerWorkload(lease_s=0.05)
    workload.run = run  # type: ignore[assignment]
    monkeypatch.setattr(workload, "_takeover_wait_s", lambda: 0.3)
    return workload


def test_start_waits_for_a_lease_holder(monkeypatch: pytest.MonkeyPatch) -> None:
    run = FakeRun(["c1", "c2"], holder=None)
    workload = _workload(run, monkeypatch)
    threading.Timer(0.3, lambda: setattr(run, "holder", "c2")).start()
    started = time.monotonic()
    workload._wait_running()
    assert time.monotonic() - started >= 0.25


def test_start_fails_with_the_coordinators_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    run = FakeRun(["c1", "c2"], holder=None)
    run.refused = "dataset 'nope' is not one of ..."
    with pytest.raises(WorkloadError, match="refused to start: dataset 'nope'"):
        _workload(run, monkeypatch)._wait_running()


def test_start_gives_up_after_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("workloads.trainer.START_TIMEOUT_S", 0.2)
    with pytest.raises(WorkloadError, match=r"no trainer coordinator took the lease within 0.2 s"
                                            r".*/nonexistent/run/c\*\.log"):
        _workload(FakeRun(["c1", "c2"], holder=None), monkeypatch)._wait_running()


def test_a_mid_write_pause_without_takeover_is_woken_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    run = FakeRun(["c1", "c2", "c3"], holder="c1")
    run.procs["c2"].code = 3  # deposed earlier; its replacement c3 never takes over
    workload = _workload(run, monkeypatch)
    workload.paused.add("c1")
    note = workload.resume_target("c1@before-head-cas")
    assert run.resumed == ["c1"] and "c1" not in workload.paused
    assert note == ("no standby took the lease from c1 within 0.3 s; woken anyway "
                    "(c1 paused, c2 exited 3, c3 running; lease held by c1)")
    assert workload.harness_errors == [note]
    assert not workload._woken_deposed  # it still holds the lease: not deposed


def test_a_coordinator_woken_after_a_takeover_may_exit_before_the_stop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    run = FakeRun(["c1", "c2"], holder="c1")
    workload = _workload(run, monkeypatch)
    workload.pause_target("c1")
    run.holder = "c2"  # the standby took over while c1 was stopped
    assert workload.resume_target("c1") is None
    assert workload._woken_deposed == {"c1"}
    threading.Timer(0.3, lambda: setattr(run.procs["c1"], "code", 3)).start()
    started = time.monotonic()
    workload._let_woken_coordinators_exit()
    waited = time.monotonic() - started
    assert 0.25 <= waited < 2.0 and run.procs["c1"].code == 3
    assert workload.harness_errors == []


def test_a_paused_standby_wakes_a_standby_and_is_not_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    run = FakeRun(["c1", "c2"], holder="c1")
    workload = _workload(run, monkeypatch)
    workload.pause_target("c2")
    assert workload.resume_target("c2") is None and run.resumed == ["c2"]
    assert workload._woken_deposed == set()
    started = time.monotonic()
    workload._let_woken_coordinators_exit()  # c2 runs on, as a standby: nothing to wait for
    assert time.monotonic() - started < 0.2 and workload.harness_errors == []


def test_a_lease_lost_event_is_a_deposition_on_the_progress_line_not_a_failure(tmp_path: Path) -> None:
    """`lease-lost` is an event of the protocol: counting it as a failed operation made a
    run with no failed operation at all show `fail N`."""
    import io

    from histories.write import HistoryWriter
    from nemesis.progress import Progress
    from workloads.base import RunContext

    workload = TrainerWorkload()
    with HistoryWriter(tmp_path / "history.jsonl") as history:
        ctx = RunContext(addresses={}, history=history, seed=1, deadline=0.0)
        workload._record(ctx, {"kind": "lease-acquired", "coordinator_id": "c1",
                               "lease_version": 1, "time": 1.0})
        workload._record(ctx, {"kind": "lease-lost", "coordinator_id": "c1",
                               "lease_version": 1, "outcome": "fail", "time": 2.0})
        ok_before = workload.counts.totals()["ok"]
        workload._record(ctx, {"kind": "skip", "coordinator_id": "c1", "step": 3, "worker": 1,
                               "outcome": "missing", "time": 3.0})
    assert workload.counts.totals()["fail"] == 0
    assert workload.counts.totals()["ok"] == ok_before  # a skipped gradient is no success
    assert workload.counts.notes() == {"depositions": 1, "skipped gradients": 1}
    out = io.StringIO()
    Progress(out, 60).update(10.0, workload.counts.totals(), [], workload.counts.notes())
    assert "fail 0 info 0 depositions 1 skipped gradients 1 |" in out.getvalue()
    # the event is still in the history, for the checker
    assert '"lease-lost"' in (tmp_path / "history.jsonl").read_text()
