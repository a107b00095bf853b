"""checker/replays.py: a write sent again with its request id must get its first answer, and
the linearizability model takes it as changing nothing; and the run-level catch: the
`no-dedup` store, which applies every retried request again, is caught by replays alone,
with no fault, where the safe store passes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from checker.linearizability import check_linearizable
from checker.models import versioned_kv
from checker.replays import check_replays
from histories.read import read_operations
from histories.write import HistoryWriter
from nemesis.cli import main


def _history(tmp_path: Path, replay_answer: dict, *, original: str = "ok",
             later_read: tuple[str, int] | None = None) -> Path:
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as w:
        i = w.invoke(0, "put", "k", "a", request_id="p0:1", expected_version=0)
        if original == "ok":
            w.complete(i, "ok", "a", version=1, applied=True)
        else:
            w.complete(i, "info", "a", error="timed out")
        j = w.invoke(1, "put", "k", "b", request_id="p1:1")
        w.complete(j, "ok", "b", version=2, applied=True)
        replayer = 0 if original == "ok" else 5  # a process whose op ended info retires
        r = w.invoke(replayer, "replay", "k", "a", request_id="p0:1", replay_of=i,
                     replayed="put", expected_version=0)
        w.complete(r, "ok", "a", **replay_answer)
        if later_read is not None:
            g = w.invoke(2, "get", "k", None, consistency="linearizable")
            w.complete(g, "ok", later_read[0], version=later_read[1])
    return path


def test_a_replay_answered_as_the_first_time_is_valid(tmp_path: Path) -> None:
    ops = read_operations(_history(tmp_path, {"version": 1, "applied": True}, later_read=("b", 2)))
    result = check_replays(ops)
    assert result.valid is True and result.counts["replays_judged"] == 1
    # It changed nothing: the read after it still sees the second put.
    assert check_linearizable(ops, versioned_kv()).valid is True


@pytest.mark.parametrize("answer,kind", [
    ({"version": 3, "applied": True}, "replay-applied-again"),  # applied a second time
    ({"version": 2, "applied": False}, "replay-answered-differently"),  # the CAS re-checked
])
def test_a_replay_answered_otherwise_is_invalid_and_names_both_lines(
        tmp_path: Path, answer: dict, kind: str) -> None:
    result = check_replays(read_operations(_history(tmp_path, answer)))
    assert result.valid is False
    (anomaly,) = result.anomalies
    assert anomaly.kind == kind
    assert "request id 'p0:1'" in anomaly.text and "applied at v1 (history line 2)" in anomaly.text


def test_a_replay_that_changed_the_key_contradicts_the_reads_after_it(tmp_path: Path) -> None:
    """The model takes a replay as changing nothing, so a read of the replayed value after
    a newer write is not linearizable even if the replay's own answer looked right."""
    ops = read_operations(_history(tmp_path, {"version": 1, "applied": True}, later_read=("a", 3)))
    assert check_linearizable(ops, versioned_kv()).valid is False


def test_a_replay_of_a_write_with_unknown_outcome_is_not_judged(tmp_path: Path) -> None:
    result = check_replays(read_operations(_history(tmp_path, {"version": 3, "applied": True},
                                                    original="info")))
    assert result.valid is True
    assert result.counts == {"replays_judged": 0, "replays_unjudged": 1,
                             "replays_answered_differently": 0}


@pytest.mark.parametrize("unsafe", [None, "no-dedup"], ids=["safe", "no-dedup"])
def test_replays_catch_a_store_that_applies_retried_requests_again_with_no_fault(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unsafe: str | None) -> None:
    if unsafe:
        monkeypatch.setenv("MAO_ALLOW_UNSAFE", "1")
    code = main(["run", "--platform", "sim", "--faults", "none", "--duration", "8", "--seed",
                 "11", "--store", str(tmp_path / "store"), *(["--unsafe", unsafe] if unsafe else [])])
    results = json.loads((tmp_path / "store" / "latest" / "results.json").read_text())
    replays = results["replays"]
    assert replays["counts"]["replays_judged"] >= 10, replays["counts"]
    if unsafe is None:
        assert code == 0 and replays["valid"] is True
    else:
        assert code == 1 and replays["valid"] is False
        assert {a["kind"] for a in replays["anomalies"]} >= {"replay-applied-again"}
    assert os.path.exists(tmp_path / "store" / "latest" / "report.html")


SNAPSHOT_RUN = ["--platform", "sim", "--faults", "kill", "--duration", "30", "--seed", "21"]
NO_REPLAYS = ["--mix", "get=20,stale-get=10,put=15,cas=30,delete=10,cas-delete=15"]


@pytest.mark.slow
@pytest.mark.parametrize("unsafe,mix,code_wanted", [
    ("snapshot-drops-request-ids", [], 1),
    ("snapshot-drops-request-ids", NO_REPLAYS, 0),  # retries alone never reach back that far
    (None, [], 0),
], ids=["canary", "canary-without-replays", "safe"])
def test_a_snapshot_without_the_request_ids_is_caught_by_replays_after_restarts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unsafe: str | None, mix: list[str],
        code_wanted: int) -> None:
    """A node restarted from a snapshot that left the request ids out applies a replayed
    write again while the others answer it as the first time: the replica reads at the end
    see it diverged. Shown failing (exit 0) with the same store when the mix has no replays."""
    if unsafe:
        monkeypatch.setenv("MAO_ALLOW_UNSAFE", "1")
    code = main(["run", *SNAPSHOT_RUN, *mix, "--store", str(tmp_path / "store"),
                 *(["--unsafe", unsafe] if unsafe else [])])
    results = json.loads((tmp_path / "store" / "latest" / "results.json").read_text())
    assert code == code_wanted, {k: results[k].get("valid") for k in
                                 ("linearizable", "lost_writes", "replicas_agree", "replays")}
    if code_wanted:
        assert results["replicas_agree"]["valid"] is False
