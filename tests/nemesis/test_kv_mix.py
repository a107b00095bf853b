"""The kv workload's mix (workloads/kv.py): `--mix` parsing, and that the default mix
reaches every path — every kind of operation and every class of expected version, deletes
of existing keys and re-creation after them — within a few hundred operations of any seed.

The plan is driven here against the store's own state machine, one operation at a time, as
one client process would see it (the workload's `seen` rule), so the test needs no cluster."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from nemesis.cli import main
from system.kv.state_machine import (
    DeleteResult,
    KVStateMachine,
    PutResult,
    encode_delete,
    encode_put,
)
from workloads.kv import (
    DEFAULT_MIX,
    MIX_KINDS,
    REPLAY,
    VERSION_CLASSES,
    ClientPlan,
    KeyPool,
    PlannedOp,
    expected_version,
    format_mix,
    parse_mix,
)

WITHIN_OPS = 400  # every path within this many operations of one client thread


def _drive(seed: int, ops: int) -> Counter[str]:
    """What one client thread's first `ops` operations did against a real state machine."""
    machine = KVStateMachine()
    plan = ClientPlan(seed, 0, KeyPool(3, 300), concurrency=1, rate=100)
    seen: dict[str, int] = {}
    deleted: set[str] = set()
    paths: Counter[str] = Counter()
    for index in range(1, ops + 1):
        op: PlannedOp = plan.next_op(0)
        paths[f"kind:{op.kind}"] += 1
        if op.kind == REPLAY:  # an earlier write again: tests/checker/test_replays.py
            machine.apply_noop(index)
            continue
        if op.kind in ("get", "stale-get"):
            cell = machine.get(op.key)
            seen[op.key] = cell[1] if cell is not None else 0
            machine.apply_noop(index)
            continue
        expected, version_class = expected_version(op, seen)
        if version_class is not None:
            paths[f"class:{version_class}"] += 1
        if op.kind in ("delete", "cas-delete"):
            result = machine.apply(index, encode_delete(op.key, expected_version=expected))
            assert isinstance(result, DeleteResult)
            if result.applied and result.existed:
                paths["delete of an existing key"] += 1
                deleted.add(op.key)
            seen[op.key] = 0 if result.applied else result.version
        else:
            result = machine.apply(index, encode_put(op.key, op.value.encode(),
                                                     expected_version=expected))
            assert isinstance(result, PutResult)
            if result.applied and op.key in deleted:
                assert result.version == 1
                paths["re-created after a delete"] += 1
                deleted.discard(op.key)
            seen[op.key] = result.version
        if version_class is not None:
            paths[f"{op.kind} {'applied' if result.applied else 'refused'}"] += 1
    return paths


EVERY_PATH = {
    *(f"kind:{kind}" for kind in MIX_KINDS), *(f"class:{c}" for c in VERSION_CLASSES),
    "cas applied", "cas refused", "cas-delete applied", "cas-delete refused",
    "delete of an existing key", "re-created after a delete",
}


@pytest.mark.parametrize("seed", [1, 2, 3, 2201, 2205])
def test_the_default_mix_reaches_every_path_within_a_few_hundred_operations(seed: int) -> None:
    paths = _drive(seed, WITHIN_OPS)
    assert set(paths) >= EVERY_PATH, sorted(EVERY_PATH - set(paths))


def test_a_mix_without_deletes_never_reaches_an_absent_key_again() -> None:
    """What the old workload did (get, put, cas against the version seen): no delete, so no
    operation ever meets a key that was deleted — the blind spot the mix closes."""
    plan = ClientPlan(1, 0, KeyPool(3, 300), 1, 100, mix=parse_mix("get=1,put=1,cas=1"))
    kinds = {plan.next_op(0).kind for _ in range(WITHIN_OPS)}
    assert kinds == {"get", "put", "cas"}


def test_replays_replace_some_operations_and_leave_every_other_draw_of_the_seed_alone() -> None:
    """Replays draw from their own generator: the same seed with and without them plans
    the same keys, kinds and values wherever no replay took the slot."""
    without = parse_mix(format_mix({**DEFAULT_MIX, REPLAY: 0}))
    plain = ClientPlan(5, 0, KeyPool(3, 300), 1, 100, mix=without)
    replaying = ClientPlan(5, 0, KeyPool(3, 300), 1, 100, mix=DEFAULT_MIX)
    pairs = [(plain.next_op(0), replaying.next_op(0)) for _ in range(WITHIN_OPS)]
    replays = [b for _, b in pairs if b.kind == REPLAY]
    assert 5 <= len(replays) <= 40, len(replays)  # about 5 in 105
    assert all(a == b for a, b in pairs if b.kind != REPLAY)


def test_a_system_without_request_ids_gets_no_replays() -> None:
    from nemesis.systems.etcd.system import EtcdSystem
    from workloads.kv import KVWorkload

    etcd = EtcdSystem()
    assert KVWorkload(concurrency=1, rate=1, op_timeout_s=1, system=etcd).mix[REPLAY] == 0
    with pytest.raises(ValueError, match="no request ids"):
        KVWorkload(concurrency=1, rate=1, op_timeout_s=1, system=etcd,
                   mix=parse_mix("get=1,replay=1"))


def test_the_expected_version_of_each_class() -> None:
    def op(version_class: str, offset: int = 2) -> PlannedOp:
        return PlannedOp("k", "cas", "v", version_class, offset)

    assert expected_version(op("right"), {"k": 5}) == (5, "right")
    assert expected_version(op("stale"), {"k": 5}) == (3, "stale")
    assert expected_version(op("stale", 3), {"k": 2}) == (1, "stale")  # never below 1
    assert expected_version(op("stale"), {"k": 1}) == (3, "future")  # nothing older to expect
    assert expected_version(op("future"), {"k": 5}) == (7, "future")
    assert expected_version(op("absent"), {"k": 5}) == (0, "absent")
    assert expected_version(op("absent"), {}) == (2, "absent")  # non-zero on an absent key
    assert expected_version(PlannedOp("k", "put", "v"), {"k": 5}) == (None, None)


def test_parse_mix() -> None:
    assert parse_mix("get=30,put=20,cas=30,delete=10,stale-get=10") == {
        "get": 30, "stale-get": 10, "put": 20, "cas": 30, "delete": 10, "cas-delete": 0,
        "replay": 0}
    assert parse_mix(format_mix(DEFAULT_MIX)) == DEFAULT_MIX
    for bad, says in [("get=1,foo=2", "unknown operation 'foo'"), ("get", "KIND=WEIGHT"),
                      ("get=x", "whole number"), ("get=-1", ">= 0"), ("get=0", "positive"),
                      ("replay=3", "other than replay"),
                      ("get=1,get=2", "twice")]:
        with pytest.raises(ValueError, match=says):
            parse_mix(bad)


def test_a_bad_mix_is_refused_with_one_line_and_exit_3(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--platform", "sim", "--mix", "get=1,scan=2",
              "--store", str(tmp_path / "store")])
    assert exit_info.value.code == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown operation 'scan'" in err, err
    assert not (tmp_path / "store").exists()


def test_the_mix_is_in_the_run_config_and_the_reproduce_line_and_the_sim_drives_it(
        tmp_path: Path) -> None:
    mix = "get=10,stale-get=10,put=10,cas=40,delete=10,cas-delete=20"
    code = main(["run", "--platform", "sim", "--faults", "none", "--duration", "6",
                 "--seed", "3", "--mix", mix, "--store", str(tmp_path / "store")])
    assert code == 0
    run = (tmp_path / "store" / "latest").resolve()
    test = json.loads((run / "test.json").read_text())
    assert f"--mix {mix}" in test["reproduce"]
    assert test["workload"]["mix"] == mix
    assert test["config"]["mix"] == parse_mix(mix)
    records = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    invokes = [r for r in records if r["type"] == "invoke"]
    seen = {(r["f"], r.get("consistency"), "expected_version" in r) for r in invokes}
    assert {("get", "linearizable", False), ("get", "stale", False), ("put", None, False),
            ("put", None, True), ("delete", None, False), ("delete", None, True)} <= seen, seen
    classes = {r.get("version_class") for r in invokes} - {None}
    assert classes == set(VERSION_CLASSES), classes


def test_read_consistency_stale_still_makes_every_get_stale() -> None:
    from workloads.kv import KVWorkload

    stale = KVWorkload(concurrency=1, rate=1, op_timeout_s=1, read_consistency="stale")
    linearizable = KVWorkload(concurrency=1, rate=1, op_timeout_s=1)
    assert stale.consistency_of("get") == stale.consistency_of("stale-get") == "stale"
    assert linearizable.consistency_of("get") == "linearizable"
    assert linearizable.consistency_of("stale-get") == "stale"


def test_the_client_canary_needs_the_permission() -> None:
    from system.kv.unsafe import UnsafeRefused, client_canary

    assert client_canary(None) is None
    with pytest.raises(UnsafeRefused, match="MAO_ALLOW_UNSAFE=1"):
        client_canary("client-new-request-id", {})
    with pytest.raises(ValueError, match="unknown client canary"):
        client_canary("no-dedup", {"MAO_ALLOW_UNSAFE": "1"})
    canary = client_canary("client-new-request-id", {"MAO_ALLOW_UNSAFE": "1"})
    assert canary is not None and canary.retry_request_id(lambda: "fresh", "old") == "fresh"
