"""The KV state machine: versions, compare-and-swap, idempotent request ids, snapshots.

Every safety rule is checked by a property function that takes the machine class, so the
same function is shown to FAIL on a deliberately broken subclass defined here."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from system.kv.state_machine import (
    CommandRejected,
    DeleteCommand,
    DeleteResult,
    InvalidCommand,
    InvalidSnapshot,
    KVStateMachine,
    OutOfOrderApply,
    PutCommand,
    PutResult,
    decode_command,
    encode_delete,
    encode_put,
)


class Driver:
    """Applies commands at consecutive log indexes."""

    def __init__(self, machine: KVStateMachine) -> None:
        self.machine = machine

    def apply(self, command: bytes):
        return self.machine.apply(self.machine.applied_index + 1, command)

    def noop(self, count: int = 1) -> None:
        for _ in range(count):
            self.machine.apply_noop(self.machine.applied_index + 1)

    def put(self, key: str, value: bytes, **kwargs):
        return self.apply(encode_put(key, value, **kwargs))

    def delete(self, key: str, **kwargs):
        return self.apply(encode_delete(key, **kwargs))


def driver(machine_class: type[KVStateMachine] = KVStateMachine, **kwargs) -> Driver:
    return Driver(machine_class(**kwargs))


# --- broken variants (exist only here) ----------------------------------------------------


class NoDedup(KVStateMachine):
    """Forgets every request id: retries apply again."""

    def _lookup(self, request_id, index):
        return None


class SnapshotForgetsRequestIds(KVStateMachine):
    """Leaves the request-id table out of its snapshots."""

    def snapshot(self) -> bytes:
        saved = self._remembered.copy()
        self._remembered.clear()
        try:
            return super().snapshot()
        finally:
            self._remembered.update(saved)


class IgnoresExpectedVersion(KVStateMachine):
    """Treats every compare-and-swap as unconditional."""

    def _put(self, command):
        return super()._put(PutCommand(command.key, command.value, None, command.request_id))


# --- versions and compare-and-swap ---------------------------------------------------------


def test_versions_start_at_one_and_grow_by_one_per_write() -> None:
    d = driver()
    assert d.put("k", b"a") == PutResult(applied=True, version=1)
    assert d.put("k", b"b") == PutResult(applied=True, version=2)
    assert d.machine.get("k") == (b"b", 2)


def test_delete_removes_the_key_and_a_recreate_starts_again_at_version_one() -> None:
    d = driver()
    d.put("k", b"a")
    d.put("k", b"b")
    assert d.delete("k") == DeleteResult(applied=True, existed=True, version=2)
    assert d.machine.get("k") is None
    assert d.delete("k") == DeleteResult(applied=True, existed=False, version=0)
    assert d.put("k", b"c") == PutResult(applied=True, version=1)


def cas_is_enforced(machine_class: type[KVStateMachine]) -> bool:
    """A put whose expected_version does not match changes nothing and reports the
    current version."""
    d = driver(machine_class)
    d.put("k", b"v1")
    result = d.put("k", b"wrong", expected_version=7)
    return result == PutResult(applied=False, version=1) and d.machine.get("k") == (b"v1", 1)


def test_a_failed_compare_and_swap_changes_nothing_and_returns_the_current_version() -> None:
    assert cas_is_enforced(KVStateMachine)


def test_cas_check_fails_when_the_rule_is_broken() -> None:
    assert not cas_is_enforced(IgnoresExpectedVersion)


def test_compare_and_swap_put_rules() -> None:
    d = driver()
    assert d.put("k", b"a", expected_version=0) == PutResult(True, 1)  # must not exist: ok
    assert d.put("k", b"b", expected_version=0) == PutResult(False, 1)  # exists now
    assert d.put("k", b"b", expected_version=1) == PutResult(True, 2)
    assert d.put("k", b"c", expected_version=1) == PutResult(False, 2)
    assert d.put("absent", b"x", expected_version=3) == PutResult(False, 0)
    assert d.machine.get("absent") is None
    assert d.machine.get("k") == (b"b", 2)


def test_compare_and_swap_delete_rules() -> None:
    d = driver()
    assert d.delete("k", expected_version=0) == DeleteResult(True, False, 0)
    assert d.delete("k", expected_version=1) == DeleteResult(False, False, 0)
    d.put("k", b"a")
    d.put("k", b"b")
    assert d.delete("k", expected_version=0) == DeleteResult(False, True, 2)
    assert d.delete("k", expected_version=1) == DeleteResult(False, True, 2)
    assert d.machine.get("k") == (b"b", 2)
    assert d.delete("k", expected_version=2) == DeleteResult(True, True, 2)
    assert d.machine.get("k") is None


def test_empty_keys_and_values_and_odd_unicode_are_tolerated() -> None:
    d = driver()
    assert d.put("", b"") == PutResult(True, 1)
    assert d.put("ключ/\u0000/😀", b"\x00" * 3) == PutResult(True, 1)
    assert d.machine.get("ключ/\u0000/😀") == (b"\x00" * 3, 1)
    assert list(d.machine.keys()) == ["", "ключ/\u0000/😀"]
    assert len(d.machine) == 2


# --- request ids ------------------------------------------------------------------------


def retry_applies_once(machine_class: type[KVStateMachine]) -> bool:
    """A retried put returns its first result and does not write again."""
    d = driver(machine_class)
    first = d.put("k", b"a", request_id="req-1")
    d.put("other", b"x")
    again = d.put("k", b"a", request_id="req-1")
    return first == again == PutResult(True, 1) and d.machine.get("k") == (b"a", 1)


def test_a_retried_request_returns_the_first_result_and_changes_nothing() -> None:
    assert retry_applies_once(KVStateMachine)


def test_dedup_check_fails_when_the_dedup_rule_is_broken() -> None:
    assert not retry_applies_once(NoDedup)


def test_a_retry_of_a_failed_cas_returns_the_failure_even_once_it_would_match() -> None:
    d = driver()
    d.put("k", b"v1")
    first = d.put("k", b"new", expected_version=2, request_id="cas-1")
    assert first == PutResult(applied=False, version=1)
    d.put("k", b"v2")  # now version 2: the CAS would match if applied again
    assert d.put("k", b"new", expected_version=2, request_id="cas-1") == first
    assert d.machine.get("k") == (b"v2", 2)


def test_first_result_reports_what_a_request_id_got_when_first_applied() -> None:
    d = driver()
    first = d.put("k", b"v1", request_id="w-1")
    d.put("k", b"v2", expected_version=7, request_id="w-2")
    assert d.machine.first_result("w-1") == first == PutResult(applied=True, version=1)
    assert d.machine.first_result("w-2") == PutResult(applied=False, version=1)
    assert d.machine.first_result("never") is None


def test_a_retried_delete_returns_the_first_result() -> None:
    d = driver()
    d.put("k", b"v1")
    first = d.delete("k", request_id="del-1")
    d.put("k", b"again")
    assert d.delete("k", request_id="del-1") == first == DeleteResult(True, True, 1)
    assert d.machine.get("k") == (b"again", 1)


def test_a_request_id_reused_for_another_command_is_rejected_without_change() -> None:
    d = driver()
    d.put("k", b"a", request_id="req")
    before = d.machine.get("k"), d.machine.get("other")
    assert isinstance(d.put("other", b"b", request_id="req"), CommandRejected)
    assert isinstance(d.delete("k", request_id="req"), CommandRejected)
    assert (d.machine.get("k"), d.machine.get("other")) == before


def test_a_request_id_reused_with_another_value_or_expected_version_is_rejected() -> None:
    """Same key and operation, different payload: not a retry but a second request under
    the first one's id. Rejected (naming the id and the entry) instead of silently
    answering with the first result; nothing changes. A true retry still dedups."""
    d = driver()
    first = d.put("k", b"a", request_id="req")
    rejected = d.put("k", b"b", request_id="req")
    assert isinstance(rejected, CommandRejected)
    assert "'req'" in rejected.reason and "different value or expected version" in rejected.reason
    assert isinstance(d.put("k", b"a", expected_version=1, request_id="req"), CommandRejected)
    d.delete("gone", expected_version=3, request_id="del")
    assert isinstance(d.delete("gone", expected_version=4, request_id="del"), CommandRejected)
    assert d.machine.get("k") == (b"a", 1)
    assert d.put("k", b"a", request_id="req") == first


def test_the_payload_check_survives_snapshot_and_restore() -> None:
    d = driver()
    d.put("k", b"a", request_id="req")
    restored = KVStateMachine.restore(d.machine.snapshot())
    index = restored.applied_index + 1
    assert isinstance(restored.apply(index, encode_put("k", b"b", request_id="req")),
                      CommandRejected)


def test_requests_without_id_are_never_deduplicated() -> None:
    d = driver()
    d.put("k", b"a")
    assert d.put("k", b"a") == PutResult(True, 2)


def dedup_survives_restore(machine_class: type[KVStateMachine]) -> bool:
    d = driver(machine_class)
    first = d.put("k", b"a", request_id="req-1")
    restored = Driver(machine_class.restore(d.machine.snapshot()))
    return restored.put("k", b"a", request_id="req-1") == first and restored.machine.get(
        "k"
    ) == (b"a", 1)


def test_dedup_holds_across_snapshot_and_restore() -> None:
    assert dedup_survives_restore(KVStateMachine)


def test_dedup_across_restore_check_fails_when_the_snapshot_forgets_ids() -> None:
    assert not dedup_survives_restore(SnapshotForgetsRequestIds)


def test_request_ids_expire_by_log_position_exactly_after_the_window() -> None:
    def retry_after(gap_entries: int):
        d = driver(dedup_window_entries=5)
        d.put("k", b"a", request_id="r")  # index 1
        d.noop(gap_entries - 1)
        return d.put("k", b"a", request_id="r"), d.machine  # at index 1 + gap_entries

    remembered, machine = retry_after(5)  # index 6 = 1 + window: still remembered
    assert remembered == PutResult(True, 1) and machine.get("k") == (b"a", 1)
    forgotten, machine = retry_after(6)  # index 7: forgotten, so applied again
    assert forgotten == PutResult(True, 2) and machine.get("k") == (b"a", 2)


def test_expiry_is_the_same_for_a_machine_restored_in_between() -> None:
    d = driver(dedup_window_entries=5)
    d.put("k", b"a", request_id="r")
    d.noop(2)
    restored = Driver(KVStateMachine.restore(d.machine.snapshot()))
    assert restored.machine.dedup_window_entries == 5
    for machine in (d, restored):
        machine.noop(2)
    assert d.put("k", b"a", request_id="r") == restored.put("k", b"a", request_id="r")
    assert d.machine.snapshot() == restored.machine.snapshot()


def test_the_table_is_bounded_by_count_oldest_forgotten_first() -> None:
    d = driver(dedup_max_ids=3)
    for number in range(5):
        d.put(f"k{number}", b"v", request_id=f"r{number}")
    assert d.machine.remembered_request_ids() == 3
    assert d.put("k0", b"v", request_id="r0") == PutResult(True, 2)  # r0 was evicted
    assert d.put("k4", b"v", request_id="r4") == PutResult(True, 1)  # r4 still known


def test_expired_ids_are_dropped_from_memory() -> None:
    d = driver(dedup_window_entries=10)
    for number in range(100):
        d.put("k", b"v", request_id=f"r{number}")
    assert d.machine.remembered_request_ids() <= 11


# --- bad commands and apply order ---------------------------------------------------------


VALID = encode_put("k", b"value", expected_version=3, request_id="rid")
BAD_COMMANDS = {
    "empty": b"",
    "junk": b"\xff" * 40,
    "truncated": VALID[:-1],
    "trailing byte": VALID + b"\x00",
    "unknown format version": b"\x09" + VALID[1:],
    "unknown operation": VALID[:1] + b"\x07" + VALID[2:],
    "unknown flag": VALID[:2] + b"\x03" + VALID[3:],
    "expected version without flag": VALID[:2] + b"\x00" + VALID[3:],
    "delete with a value": b"\x01\x02" + encode_put("k", b"v")[2:],
    "key not utf-8": VALID[:28] + b"\xff" + VALID[29:],  # header 25 + "rid" 3 = key at 28
}


@pytest.mark.parametrize("name", sorted(BAD_COMMANDS))
def test_a_bad_command_is_rejected_and_changes_only_the_applied_index(name: str) -> None:
    d, reference = driver(), driver()
    for machine in (d, reference):
        machine.put("k", b"value", request_id="first")
    result = d.apply(BAD_COMMANDS[name])
    reference.noop()
    assert isinstance(result, CommandRejected) and result.reason
    assert d.machine.applied_index == 2
    assert d.machine.snapshot() == reference.machine.snapshot()


def test_decode_says_what_is_wrong() -> None:
    with pytest.raises(InvalidCommand, match="shorter than its 25-byte header"):
        decode_command(b"abc")
    with pytest.raises(InvalidCommand, match="format version 9"):
        decode_command(BAD_COMMANDS["unknown format version"])
    with pytest.raises(InvalidCommand, match="header describes"):
        decode_command(BAD_COMMANDS["truncated"])


def test_a_non_bytes_command_is_rejected_not_raised() -> None:
    d = driver()
    assert isinstance(d.machine.apply(1, None), CommandRejected)  # type: ignore[arg-type]


def test_entries_must_be_applied_once_and_in_order() -> None:
    d = driver()
    d.put("k", b"v")
    with pytest.raises(OutOfOrderApply, match="applied_index is 1"):
        d.machine.apply(1, encode_put("k", b"again"))
    with pytest.raises(OutOfOrderApply):
        d.machine.apply_noop(3)
    assert d.machine.get("k") == (b"v", 1)


def test_encoding_rejects_what_it_cannot_represent() -> None:
    with pytest.raises(InvalidCommand, match="65535"):
        encode_put("k", b"", request_id="x" * 70_000)
    with pytest.raises(InvalidCommand, match="outside"):
        encode_put("k", b"", expected_version=-1)
    with pytest.raises(InvalidCommand, match="UTF-8"):
        encode_delete("\ud800")


@given(
    key=st.text(max_size=40),
    value=st.binary(max_size=200),
    expected=st.none() | st.integers(0, 2**64 - 1),
    request_id=st.text(max_size=20),
    is_put=st.booleans(),
)
def test_encoding_round_trips(key, value, expected, request_id, is_put) -> None:
    try:
        if is_put:
            data = encode_put(key, value, expected_version=expected, request_id=request_id)
            assert decode_command(data) == PutCommand(key, value, expected, request_id)
        else:
            data = encode_delete(key, expected_version=expected, request_id=request_id)
            assert decode_command(data) == DeleteCommand(key, expected, request_id)
    except InvalidCommand:
        # Only strings Python cannot encode as UTF-8 (lone surrogates) are refused.
        with pytest.raises(UnicodeEncodeError):
            (key + request_id).encode("utf-8")


def test_a_64_mib_value_round_trips_through_apply_and_snapshot() -> None:
    value = bytes(range(256)) * (64 * 1024 * 1024 // 256)
    d = driver()
    assert d.put("checkpoint", value) == PutResult(True, 1)
    stored, version = d.machine.get("checkpoint")
    assert version == 1 and stored == value
    restored = KVStateMachine.restore(d.machine.snapshot())
    assert restored.get("checkpoint") == (value, 1)


# --- snapshots ----------------------------------------------------------------------------


def populated() -> KVStateMachine:
    d = driver()
    d.put("a", b"1", request_id="r1")
    d.put("b", b"2" * 100)
    d.delete("a", expected_version=5, request_id="r2")
    d.noop()
    return d.machine


def test_restore_reproduces_data_versions_ids_and_applied_index() -> None:
    machine = populated()
    restored = KVStateMachine.restore(machine.snapshot())
    assert restored.applied_index == machine.applied_index == 4
    assert restored.get("a") == (b"1", 1) and restored.get("b") == (b"2" * 100, 1)
    assert restored.remembered_request_ids() == 2
    assert restored.snapshot() == machine.snapshot()


def test_every_flipped_byte_of_a_snapshot_is_detected() -> None:
    blob = populated().snapshot()
    for position in range(len(blob)):
        damaged = bytearray(blob)
        damaged[position] ^= 0x40
        with pytest.raises(InvalidSnapshot):
            KVStateMachine.restore(bytes(damaged))


@pytest.mark.parametrize("cut", [0, 3, 10, -5, -1])
def test_a_truncated_snapshot_is_rejected(cut: int) -> None:
    with pytest.raises(InvalidSnapshot):
        KVStateMachine.restore(populated().snapshot()[:cut])


# --- property: a replica restored midway ends identical --------------------------------

KEYS = ["a", "b", "c"]
commands = st.lists(
    st.one_of(
        st.tuples(
            st.just("put"), st.sampled_from(KEYS), st.binary(max_size=8),
            st.none() | st.integers(0, 4), st.sampled_from(["", "r1", "r2", "r3", "r4"]),
        ),
        st.tuples(
            st.just("delete"), st.sampled_from(KEYS), st.just(b""),
            st.none() | st.integers(0, 4), st.sampled_from(["", "r1", "r2", "r3", "r4"]),
        ),
        st.tuples(st.just("noop"), st.just(""), st.just(b""), st.none(), st.just("")),
        st.tuples(st.just("junk"), st.just(""), st.binary(max_size=30), st.none(), st.just("")),
    ),
    max_size=60,
)


def run(machine: KVStateMachine, start: int, steps) -> list:
    results = []
    for offset, (kind, key, value, expected, request_id) in enumerate(steps):
        index = start + offset
        if kind == "noop":
            machine.apply_noop(index)
            results.append(None)
        elif kind == "junk":
            results.append(machine.apply(index, value))
        elif kind == "put":
            command = encode_put(key, value, expected_version=expected, request_id=request_id)
            results.append(machine.apply(index, command))
        else:
            command = encode_delete(key, expected_version=expected, request_id=request_id)
            results.append(machine.apply(index, command))
    return results


def replicas_agree(machine_class: type[KVStateMachine], steps, split: int) -> bool:
    """One machine applies everything; another is restored from the first's snapshot at
    `split` and applies the rest. Results and final state must be identical."""
    split = min(split, len(steps))
    whole = machine_class(dedup_window_entries=7)
    run(whole, 1, steps[:split])
    restored = machine_class.restore(whole.snapshot())
    tail_results = run(whole, split + 1, steps[split:])
    restored_results = run(restored, split + 1, steps[split:])
    return tail_results == restored_results and whole.snapshot() == restored.snapshot()


@settings(max_examples=300, deadline=None)
@given(steps=commands, split=st.integers(0, 60))
def test_a_replica_restored_from_a_snapshot_midway_ends_identical(steps, split) -> None:
    assert replicas_agree(KVStateMachine, steps, split)


def test_the_replica_property_fails_when_snapshots_lose_the_request_ids() -> None:
    steps = [("put", "a", b"x", None, "r1"), ("put", "a", b"x", None, "r1")]
    assert replicas_agree(KVStateMachine, steps, 1)
    assert not replicas_agree(SnapshotForgetsRequestIds, steps, 1)


# --- retention against a reference model ---------------------------------------------------
# The table is a dict plus an expiry queue (for cheap snapshots); this checks it against the
# rule written the plain way: a list in application order, trimmed by window and count.


class ForgetsByCountNewestFirst(KVStateMachine):
    """Over the count limit, forgets the NEWEST id instead of the oldest."""

    def _remember(self, request_id, applied_index, record):
        self._remembered.pop(request_id, None)
        if len(self._remembered) >= self.dedup_max_ids:
            newest = next(reversed(self._remembered))
            del self._remembered[newest]
        self._remembered[request_id] = record
        self._expiry.append((applied_index, request_id))


def retention_matches_reference(machine_class, steps, window: int, max_ids: int,
                                split: int) -> bool:
    """Apply puts with ids from a small pool; after each, whether the machine deduplicated
    must match a reference list. Midway the machine is replaced by its restored snapshot."""
    machine = machine_class(dedup_window_entries=window, dedup_max_ids=max_ids)
    reference: list[tuple[int, str]] = []  # (applied index, id), application order
    for index, (request_id, is_noop) in enumerate(steps, start=1):
        if index == split:
            machine = machine_class.restore(machine.snapshot())
        reference = [(at, rid) for at, rid in reference if at + window >= index]
        if is_noop:
            machine.apply_noop(index)
            continue
        before = machine.get("k")
        machine.apply(index, encode_put("k", b"v", request_id=request_id))
        # An unconditional put bumps the version unless it was answered from the table.
        deduplicated = machine.get("k") == before
        expected_dedup = any(rid == request_id for _, rid in reference)
        if deduplicated != expected_dedup:
            return False
        if not expected_dedup:
            reference = [(at, rid) for at, rid in reference if rid != request_id]
            while len(reference) >= max_ids:
                reference.pop(0)
            reference.append((index, request_id))
        if machine.remembered_request_ids() != len(reference):
            return False
    return True


retention_steps = st.lists(st.tuples(st.sampled_from("abcde"), st.booleans()), max_size=80)


@settings(max_examples=300, deadline=None)
@given(steps=retention_steps, window=st.integers(1, 9), max_ids=st.integers(1, 5),
       split=st.integers(0, 80))
def test_request_id_retention_matches_the_plain_rule(steps, window, max_ids, split) -> None:
    assert retention_matches_reference(KVStateMachine, steps, window, max_ids, split)


def test_the_retention_check_fails_when_the_count_limit_forgets_the_newest() -> None:
    steps = [("a", False), ("b", False), ("c", False), ("b", False)]
    assert retention_matches_reference(KVStateMachine, steps, 100, 2, 0)
    assert not retention_matches_reference(ForgetsByCountNewestFirst, steps, 100, 2, 0)
