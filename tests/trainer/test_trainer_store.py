"""Checkpoints through a real 3-node store: inline (whole and chunked), object mode,
the takeover fence, verification on read, garbage collection of superseded blobs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import system.trainer  # noqa: F401
from system.kv.client import CasMismatch, KVClient, NotFound
from system.trainer import checkpoint as codec
from system.trainer.checkpoint_store import CheckpointStore
from system.trainer.object_store import LocalObjectStore, ObjectStoreError, object_name

pytestmark = pytest.mark.integration


def make_checkpoint(step: int, size: int = 10) -> codec.Checkpoint:
    rng = np.random.Generator(np.random.Philox(step))
    return codec.Checkpoint(step, rng.standard_normal((size, 2)), rng.standard_normal((size, 2)),
                            "cfg", [(0, step)], {"seed": 0}, done=False)


def meta_for(step: int, cid: str = "c1", lease: int = 1) -> codec.Metadata:
    # Request ids are global in the store: prefix the coordinator id with the job.
    cid = f"{_job}-{cid}"
    return codec.Metadata(step=step, mode="", size=0, checksum="", config_hash="cfg",
                          coordinator_id=cid, lease_version=lease, request_id=f"{cid}:step-{step}")


_job = ""


@pytest.fixture(autouse=True)
def _coordinator_ids_per_job(job: str) -> None:
    global _job
    _job = job


def write_series(store: CheckpointStore, steps: list[int], size: int = 10) -> int:
    version, previous, previous_version = 0, None, None
    for step in steps:
        meta = meta_for(step)
        version = store.write(codec.encode(make_checkpoint(step, size)), meta, version, previous,
                              previous_version)
        previous, previous_version = meta, version
    return version


@pytest.mark.parametrize("mode,chunk_bytes", [("inline", 1 << 20), ("inline", 1000), ("object", 1 << 20)])
def test_latest_checkpoint_round_trips_exactly(kv_cluster, job: str, tmp_path: Path,
                                               mode: str, chunk_bytes: int) -> None:
    with KVClient(kv_cluster.addresses) as kv:
        objects = LocalObjectStore(tmp_path) if mode == "object" else None
        store = CheckpointStore(kv, job, mode, objects=objects, chunk_bytes=chunk_bytes)
        version = write_series(store, [10, 20, 30], size=300)
        latest = store.read_latest("cfg")
        assert latest is not None and latest.version == version
        expected = make_checkpoint(30, 300)
        assert latest.checkpoint.params.tobytes() == expected.params.tobytes()
        assert latest.checkpoint.velocity.tobytes() == expected.velocity.tobytes()
        assert [e["step"] for e in latest.meta.history] == [10, 20]
        if chunk_bytes == 1000:
            assert latest.meta.chunks and len(latest.meta.chunks) > 1  # chunk list committed last
        if mode == "object":
            # named by the writer's lease version and the checksum (collect_orphans)
            assert latest.meta.pointer == object_name(latest.meta.checksum, latest.meta.lease_version)
            assert objects is not None and latest.meta.pointer in objects.names()


def test_superseded_blobs_are_deleted_only_after_the_keep_window(kv_cluster, job: str,
                                                                  tmp_path: Path) -> None:
    with KVClient(kv_cluster.addresses) as kv:
        objects = LocalObjectStore(tmp_path)
        store = CheckpointStore(kv, job, "object", objects=objects)
        write_series(store, [1, 2, 3, 4])
        head = store.read_head()
        assert head is not None
        history = head[0].history
        # step 1's blob is three records old: gone; steps 2, 3 (superseded, kept) and 4 remain.
        assert history[0]["pointer"] not in objects.names()
        assert {history[1]["pointer"], history[2]["pointer"], head[0].pointer} <= set(objects.names())

        global _job
        _job = job + "-inline"
        inline = CheckpointStore(kv, _job, "inline", chunk_bytes=500)
        write_series(inline, [1, 2, 3, 4], size=100)
        first = inline.read_head()[0].history[0]
        with pytest.raises(NotFound):
            kv.get(first["chunks"][0])


def test_a_takeover_collects_fenced_orphans_and_never_a_newer_leases_blob(kv_cluster, job: str,
                                                                          tmp_path: Path) -> None:
    """Lease 1 wrote steps 1-2 and uploaded step 3's blob but died before the head CAS; a
    writer under lease 9 has uploaded a blob and not yet written its head. The takeover
    under lease 5 deletes the lease-1 orphan, keeps what the head names and the lease-9
    blob (its writer may still commit it)."""
    with KVClient(kv_cluster.addresses) as kv:
        objects = LocalObjectStore(tmp_path)
        store = CheckpointStore(kv, job, "object", objects=objects)
        write_series(store, [1, 2])
        blob3 = codec.encode(make_checkpoint(3))
        orphan = object_name(codec.blob_checksum(blob3), 1)
        objects.put(orphan, blob3)
        blob_in_flight = codec.encode(make_checkpoint(4))
        in_flight = object_name(codec.blob_checksum(blob_in_flight), 9)
        objects.put(in_flight, blob_in_flight)
        latest = store.read_latest("cfg")
        takeover = meta_for(0, "c2", lease=5)
        takeover.kind, takeover.request_id = "resume", f"{job}-c2:resume-2"
        store.rewrite_head(latest, latest.version, takeover)
        assert store.collect_orphans(takeover) == [orphan]
        assert set(objects.names()) == {takeover.history[0]["pointer"], latest.meta.pointer,
                                        in_flight}


def test_a_takeover_rewrite_fences_the_old_writer(kv_cluster, job: str) -> None:
    with KVClient(kv_cluster.addresses) as kv:
        old = CheckpointStore(kv, job)
        version = write_series(old, [5])
        latest = old.read_latest("cfg")
        new = CheckpointStore(kv, job)
        takeover = meta_for(0, "c2", lease=9)
        takeover.kind, takeover.request_id = "resume", f"{job}-c2:resume-5"
        new.rewrite_head(latest, latest.version, takeover)
        with pytest.raises(CasMismatch):
            old.write(codec.encode(make_checkpoint(6)), meta_for(6), version, latest.meta, version)
        after = new.read_latest("cfg")
        assert after.checkpoint.step == 5 and after.meta.coordinator_id == f"{job}-c2"
        assert after.meta.kind == "resume" and after.meta.lease_version == 9


def test_a_takeover_record_without_a_checkpoint_is_resumed_from_step_zero(kv_cluster, job: str) -> None:
    """Found by the nemesis (kill of the coordinator right after its takeover, before its
    first checkpoint): its successor read the empty takeover record as a corrupt checkpoint
    and refused to run, so the job stopped for good."""
    with KVClient(kv_cluster.addresses) as kv:
        first = CheckpointStore(kv, job)
        assert first.read_latest("cfg") is None and first.head_version == 0
        takeover = meta_for(0, "c1", lease=1)
        takeover.kind, takeover.request_id = "resume", f"{job}-c1:resume-0"
        version = first.rewrite_head(None, 0, takeover)
        second = CheckpointStore(kv, job)
        assert second.read_latest("cfg") is None and second.head_version == version
        again = meta_for(0, "c2", lease=3)
        again.kind, again.request_id = "resume", f"{job}-c2:resume-0"
        assert second.rewrite_head(None, second.head_version, again) == version + 1


def test_a_retry_with_the_same_request_id_applies_once(kv_cluster, job: str) -> None:
    """What the writer does on Indeterminate: the same write again, same request id."""
    with KVClient(kv_cluster.addresses) as kv:
        store = CheckpointStore(kv, job)
        blob = codec.encode(make_checkpoint(7))
        first = store.write(blob, meta_for(7), 0, None, None)
        again = store.write(blob, meta_for(7), 0, None, None)  # as if the answer was lost
        assert again == first


def test_checkpoint_of_another_configuration_or_corrupted_is_refused(kv_cluster, job: str) -> None:
    with KVClient(kv_cluster.addresses) as kv:
        store = CheckpointStore(kv, job)
        write_series(store, [3])
        with pytest.raises(codec.CheckpointError, match="written by configuration cfg"):
            store.read_latest("other")
    blob = codec.encode(make_checkpoint(3))
    with pytest.raises(codec.CheckpointError, match="checksum mismatch"):
        codec.decode(blob[:-1] + b"\x00", checksum=codec.blob_checksum(blob))


def test_local_object_store_refuses_a_blob_that_does_not_match_its_name(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    blob = b"abc"
    name = codec.blob_checksum(blob)
    store.put(name, blob)
    assert store.get(name) == blob
    with pytest.raises(ObjectStoreError):
        store.put(name, b"abd")


class FlakyKV:
    """A store double whose first `failures` CAS calls end Indeterminate (as when the
    leader dies after committing but before answering) and which records request ids."""

    def __init__(self, failures: int) -> None:
        from system.kv.client import WriteResult

        self.failures, self.calls, self.result = failures, [], WriteResult
        self.applied: dict[str, int] = {}

    def cas(self, key: str, value: bytes, expected_version: int, *, request_id: str, **kw: object):
        from system.kv.client import Indeterminate

        self.calls.append(request_id)
        version = self.applied.setdefault(request_id, expected_version + 1)  # applies once
        if len(self.calls) <= self.failures:
            raise Indeterminate("connection broken", request_id)
        return self.result(version, "n1", 1, 1, request_id)


def test_indeterminate_is_retried_with_the_same_request_id() -> None:
    kv = FlakyKV(failures=2)
    outcomes: list[str] = []
    store = CheckpointStore(kv, "flaky", on_attempt=lambda rid, outcome: outcomes.append(outcome))  # type: ignore[arg-type]
    meta = codec.Metadata(step=5, mode="", size=0, checksum="", config_hash="cfg",
                          coordinator_id="c1", lease_version=1, request_id="c1:step-5")
    assert store.write(codec.encode(make_checkpoint(5)), meta, 4, None, None) == 5
    assert kv.calls == ["c1:step-5"] * 3 and outcomes == ["indeterminate"] * 2


def test_indeterminate_after_the_lease_lapsed_stops_writing() -> None:
    from system.trainer.checkpoint_store import StopWriting

    store = CheckpointStore(FlakyKV(failures=5), "flaky", keep_trying=lambda: False)  # type: ignore[arg-type]
    meta = codec.Metadata(step=5, mode="", size=0, checksum="", config_hash="cfg",
                          coordinator_id="c1", lease_version=1, request_id="c1:step-5")
    with pytest.raises(StopWriting):
        store.write(codec.encode(make_checkpoint(5)), meta, 4, None, None)


def test_takeover_of_a_finished_inline_checkpoint_keeps_its_bytes(kv_cluster, job: str) -> None:
    with KVClient(kv_cluster.addresses) as kv:
        store = CheckpointStore(kv, job)
        write_series(store, [8])
        latest = store.read_latest("cfg")
        takeover = meta_for(0, "c2", lease=4)
        takeover.kind = "resume"
        store.rewrite_head(latest, latest.version, takeover)
        again = store.read_latest("cfg")  # checksum verified against the original blob
        assert again.blob == latest.blob and again.meta.kind == "resume"


def test_the_write_after_lease_loss_canary_lands_while_its_successor_writes(
        kv_cluster, job: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The canary's flush must land even when its first CAS loses to the successor's next
    checkpoint (the successor writes every few tens of ms): the store refuses a retry under
    the first attempt's request id with another expected version, for as long as it tries."""
    from types import SimpleNamespace

    from system.trainer import unsafe
    from system.trainer.config import TrainConfig

    monkeypatch.setattr(unsafe, "FLUSH_DEADLINE_S", 3.0)
    with KVClient(kv_cluster.addresses) as kv:
        store = CheckpointStore(kv, job, "inline")
        write_series(store, [10])
        read_head, reads = store.read_head, []

        def successor_writes_after_the_first_read(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            head = read_head(*args, **kwargs)
            reads.append(head[2])
            if len(reads) == 1:  # between the canary's read and its CAS, the head moves
                kv.cas(store.key, kv.get(store.key).value, head[2])
            return head

        store.read_head = successor_writes_after_the_first_read
        events: list[dict] = []
        ckpt = make_checkpoint(20)
        coordinator = SimpleNamespace(
            core=SimpleNamespace(step=20, state=SimpleNamespace(params=ckpt.params, velocity=ckpt.velocity),
                                 term=1, shard_rows=[100]),
            config=TrainConfig(job=job), options=SimpleNamespace(coordinator_id=f"{job}-c1"),
            store=store, _emit=events.append)
        unsafe.write_after_lease_loss(coordinator)
        meta, _ = codec.decode_head(kv.get(store.key).value)
    outcomes = [(e["kind"], e.get("outcome")) for e in events]
    assert outcomes[:2] == [("checkpoint-invoke", None), ("checkpoint-fail", "cas-mismatch")], outcomes
    assert outcomes[-1] == ("checkpoint-ok", "ok"), outcomes
    ids = [e["request_id"] for e in events if e["kind"] == "checkpoint-invoke"]
    assert len(set(ids)) == len(ids) == 2  # each attempt is its own request
    assert meta.request_id == ids[-1] and meta.step == 20
