"""The replicas-agree rule (checker/replicas.py) on small hand-written history ends: final
linearizable reads, then reads from each node on its own with their applied indexes."""

from __future__ import annotations

from typing import Any

from checker.replicas import check_replicas
from histories.pairing import pair_operations
from histories.read import parse_record

FINAL, REPLICA = 10_000_000, 10_001_000


class _End:
    """A history's end as workloads/kv.py writes it (history.jsonl records)."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []

    def _pair(self, process: int, invoke: dict[str, Any], done: dict[str, Any]) -> None:
        base = {"process": process, "f": "get", "key": invoke.pop("key"), "value": None}
        self.lines.append({**base, "type": "invoke", **invoke})
        self.lines.append({**base, **done})

    def final(self, key: str, value: str | None, version: int, index: int,
              node: str = "n1") -> _End:
        self._pair(FINAL, {"key": key, "consistency": "linearizable", "phase": "final"},
                   {"type": "ok", "value": value, "version": version, "node": node,
                    "applied_index": index})
        return self

    def replica(self, node: str, key: str, value: str | None, version: int,
                index: int | None) -> _End:
        done: dict[str, Any] = {"type": "ok", "value": value, "version": version, "node": node}
        if index is not None:
            done["applied_index"] = index
        self._pair(REPLICA, {"key": key, "consistency": "stale", "phase": "replica",
                             "target": node}, done)
        return self

    def unanswered(self, node: str, key: str) -> _End:
        self._pair(REPLICA, {"key": key, "consistency": "stale", "phase": "replica",
                             "target": node}, {"type": "fail", "error": "unavailable"})
        return self

    def check(self, excused: frozenset[str] = frozenset()):  # noqa: ANN201 - a Result
        records = [parse_record({"index": i, **line}, expected_index=i, path=None, line=i + 1)
                   for i, line in enumerate(self.lines)]
        return check_replicas(pair_operations(records), excused=excused)


def test_every_replica_agrees_at_the_final_index() -> None:
    result = (_End().final("a", "1-1", 3, 40).final("b", None, 0, 40)
              .replica("n2", "a", "1-1", 3, 40).replica("n2", "b", None, 0, 40)
              .replica("n3", "a", "1-1", 3, 52).check())
    assert result.valid is True
    assert result.counts["agree"] == 3


def test_a_replica_that_differs_past_the_final_index_diverged() -> None:
    # n3 applied an entry the cluster overwrote (commits-old-term-entries): its state
    # machine keeps the value forever, though its log index is past the final read's.
    result = (_End().final("a", "1-1", 3, 40)
              .replica("n2", "a", "1-1", 3, 40).replica("n3", "a", "7-2", 4, 41).check())
    assert result.valid is False
    [anomaly] = result.anomalies
    assert anomaly.kind == "replica-diverged" and anomaly.key == "a"
    assert "node n3 answered '7-2' version 4 at applied index 41" in anomaly.text
    assert "saw '1-1' version 3" in anomaly.text and "at index 40" in anomaly.text
    assert result.counts["nodes_diverged"] == 1


def test_a_replica_at_exactly_the_final_index_with_an_other_version_diverged() -> None:
    result = _End().final("a", "1-1", 3, 40).replica("n2", "a", "1-1", 2, 40).check()
    assert result.valid is False


def test_a_replica_that_kept_a_deleted_key_diverged() -> None:
    result = _End().final("a", None, 0, 40).replica("n2", "a", "5-5", 1, 45).check()
    assert result.valid is False
    assert "saw absent" in result.anomalies[0].text


def test_lagging_then_caught_up_is_valid() -> None:
    result = (_End().final("a", "1-1", 3, 40)
              .replica("n2", "a", "0-9", 2, 31).replica("n2", "a", "1-1", 3, 40).check())
    assert result.valid is True
    assert result.counts["behind"] == 1 and result.counts["agree"] == 1
    assert "never caught up" not in result.note


def test_a_node_that_never_caught_up_is_reported_not_invalid() -> None:
    result = (_End().final("a", "1-1", 3, 40)
              .replica("n2", "a", "0-9", 2, 31).replica("n2", "a", "0-9", 2, 31).check())
    assert result.valid is True
    assert "node n2 never caught up" in result.note and "stayed at applied index 31" in result.note
    assert result.counts["lagging_nodes"] == 1


def test_a_node_that_never_answered_is_not_invalid() -> None:
    result = (_End().final("a", "1-1", 3, 40).replica("n2", "a", "1-1", 3, 40)
              .unanswered("n4", "a").unanswered("n4", "a").check())
    assert result.valid is True and result.counts["silent_nodes"] == 1
    assert "node n4 answered none of its 2 replica reads" in result.note


def test_a_write_after_the_final_read_moves_the_reference() -> None:
    # A late write (a retry still in flight) lands at 43: the replica at 45 saw it, and
    # the fresh linearizable read the harness takes then (served at 45) saw it too.
    result = (_End().final("a", "1-1", 3, 40).replica("n2", "a", "2-2", 4, 45)
              .final("a", "2-2", 4, 45).check())
    assert result.valid is True
    # ... also when the fresh read was served further on than the replica's read
    result = (_End().final("a", "1-1", 3, 40).replica("n2", "a", "2-2", 4, 44)
              .final("a", "2-2", 4, 47).check())
    assert result.valid is True


def test_an_old_value_below_a_later_reference_still_diverged() -> None:
    # The key was "0-9" before index 40; a replica at 45 must not still hold it.
    result = (_End().final("a", "1-1", 3, 40).replica("n2", "a", "0-9", 2, 45)
              .final("a", "1-1", 3, 46).check())
    assert result.valid is False


def test_reads_without_an_applied_index_are_not_compared() -> None:
    result = _End().final("a", "1-1", 3, 40).replica("n2", "a", "x", 9, None).check()
    assert result.valid is True and result.counts["unindexed"] == 1


def test_a_history_without_replica_reads_checks_as_before() -> None:
    # Written before the replica reads existed: final reads carry no phase at all.
    end = _End()
    end.lines = [{"process": 0, "type": "invoke", "f": "get", "key": "a", "value": None},
                 {"process": 0, "type": "ok", "f": "get", "key": "a", "value": "1-1",
                  "version": 3}]
    result = end.check()
    assert result.valid is True and result.counts["replica_reads"] == 0
    assert "no replica reads" in result.note


def _run_dir(tmp_path, end: _End):  # noqa: ANN001, ANN202 - a run folder with that history
    import json

    write = [{"process": 0, "type": "invoke", "f": "put", "key": "a", "value": "1-1"},
             {"process": 0, "type": "ok", "f": "put", "key": "a", "value": "1-1", "version": 1,
              "applied": True, "node": "n1", "applied_index": 12}]
    lines = [{"index": i, **line} for i, line in enumerate(write + end.lines)]
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return tmp_path


def test_the_run_check_is_invalid_and_names_the_node(tmp_path) -> None:  # noqa: ANN001
    from nemesis.check import check_run, first_violation_s, summary_lines

    end = _End().final("a", "1-1", 1, 20).replica("n2", "a", "1-1", 1, 20)
    end.replica("n3", "a", "9-9", 2, 21)
    results = check_run(_run_dir(tmp_path, end))
    assert results["valid"] is False and results["replicas_agree"]["valid"] is False
    assert results["linearizable"]["valid"] is True and results["lost_writes"]["valid"] is True
    text = "\n".join(summary_lines(results))
    assert "replicas agree: INVALID (1 read(s) on 1 node(s)" in text
    assert "replica-diverged: node n3 answered '9-9' version 2 at applied index 21" in text
    assert first_violation_s(results, tmp_path) is None  # (no time stamps in this history)


def test_the_run_check_of_a_history_without_replica_reads_is_as_before(tmp_path) -> None:  # noqa: ANN001
    from nemesis.check import check_run, summary_lines

    results = check_run(_run_dir(tmp_path, _End().final("a", "1-1", 1, 20)))
    assert results["valid"] is True
    assert not any(line.startswith("replicas agree") for line in summary_lines(results))


def test_a_node_that_reported_its_own_divergence_after_a_durable_state_fault_is_not_counted_again(
        ) -> None:
    """restore-majority: a witness answers from its diverged state until the new leader
    tells it; its own report (excused after such a fault) is the evidence."""
    end = (_End().final("a", "1-1", 3, 40)
           .replica("n2", "a", "1-1", 3, 40).replica("n3", "a", "0-9", 1, 42))
    assert end.check().valid is False
    excused = end.check(excused=frozenset({"n3"}))
    assert excused.valid is True and excused.counts["excused"] == 1
    assert "node n3 reported its committed log diverged" in excused.note
    assert end.check(excused=frozenset({"n2"})).valid is False  # only the node it names
