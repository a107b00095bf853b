"""Test-only UNSAFE coordinator behaviour: the canary that proves the fencing test can fail.

Every line of deliberately wrong trainer code lives here. A coordinator runs it only when
started with `--unsafe NAME` AND its environment has `MAO_ALLOW_UNSAFE=1`; otherwise it
refuses to start (exit 2).

Canaries (names distinct from the store's, system/kv/unsafe.py, so `python -m nemesis run
--workload trainer --unsafe NAME` knows which side runs broken):
- `no-fencing`: the checkpoint head is written with a plain put, ignoring the version the
  coordinator believes current. A coordinator paused past its lease then overwrites its
  successor's checkpoint: the "deposed coordinator never writes" check must report it.
- `no-request-id`: every attempt of a checkpoint head write carries a fresh request id —
  the coordinator's own retries and the transport's alike (one attempt per client call: the
  KV client's internal retry would otherwise reuse the id it generated for the call). If an
  attempt committed but its answer was lost, the retry's CAS finds the head moved and the
  coordinator records the write as failed and steps down; its successor then resumes from
  the checkpoint recorded as failed: checker/trainer.py's `failed-write-applied`.
- `write-after-lease-loss`: a coordinator that loses its lease (paused past it, cut off
  from the store) saves its state in one last checkpoint before stepping down, taking the
  head's current version (re-read before each attempt, each attempt its own request id) as
  the expected one, so the CAS fence does not stop it, even while its successor writes.
  It writes under a superseded lease after its successor's resume: `fencing`.
- `lease-by-put`: a standby takes the lapsed lease with a plain put instead of a CAS from
  the version it observed, so a holder's renewal that landed in between is overwritten and
  both believe they hold it: checker/trainer.py's `lease` (a lease write with no expected
  version; a write that replaced versions its writer never read).
- `shared-request-ids`: request ids without the coordinator's id (`step-<n>`, `resume-<n>`,
  `lease-<v>`), so a successor rewriting a step its predecessor had in flight reuses the
  predecessor's id, and the store may answer it with the predecessor's result:
  `unique-request-ids`.
- `stale-resume`: a standby reads the checkpoint head when it starts standing by, waits for
  the lease, and resumes from what it read then (its fence CAS uses a fresh read, so it
  succeeds): the checkpoints committed while it waited are lost: `resume-after-lease`.

What it must never do: be reachable without both the flag and the environment variable.
"""

from __future__ import annotations

import os

from system.kv.client import KVClient

CANARIES = ("no-fencing", "no-request-id", "write-after-lease-loss", "lease-by-put",
            "shared-request-ids", "stale-resume")
FLUSH_DEADLINE_S = 30.0  # write-after-lease-loss: how long the last write keeps trying


class UnsafeRefused(Exception):
    pass


def check_unsafe(name: str) -> str:
    """The canary's name if it may run, "" for none; UnsafeRefused otherwise."""
    if not name:
        return ""
    if name not in CANARIES:
        raise UnsafeRefused(f"unknown unsafe mode {name!r}; known: {', '.join(CANARIES)}")
    if os.environ.get("MAO_ALLOW_UNSAFE") != "1":
        raise UnsafeRefused(f"--unsafe {name} needs MAO_ALLOW_UNSAFE=1 in the environment (test only)")
    return name


def take_lease_by_put(kv: KVClient, key: str, value: bytes, request_id: str):  # noqa: ANN201
    """WRONG ON PURPOSE (`lease-by-put`): the lease taken without comparing the version."""
    return kv.put(key, value, request_id=request_id)


def shared_request_id_prefix() -> str:
    """WRONG ON PURPOSE (`shared-request-ids`): request ids that do not name the coordinator."""
    return ""


def read_head_early(coordinator):  # noqa: ANN001, ANN201 - coordinator.Coordinator -> Latest | None
    """WRONG ON PURPOSE (`stale-resume`): the standby reads the checkpoint before it holds
    the lease (and keeps it for its resume)."""
    return coordinator.store.read_latest(coordinator.config.config_hash())


def stale_source(early, latest):  # noqa: ANN001, ANN201 - Latest | None
    """WRONG ON PURPOSE (`stale-resume`): resume from the read made before the lease, not the
    one made under it."""
    return early


def write_head_without_cas(kv: KVClient, key: str, value: bytes, request_id: str) -> int:
    """WRONG ON PURPOSE (`no-fencing`): no expected_version, so no fence."""
    return kv.put(key, value, request_id=request_id).version


_single_attempt: dict[int, KVClient] = {}


def cas_without_request_id(kv: KVClient, key: str, value: bytes, expected_version: int) -> int:
    """WRONG ON PURPOSE (`no-request-id`): every attempt gets a fresh request id, so a retry
    of a write that did commit is not recognised as the same write. One attempt per call
    (a client of the same nodes with `retries=0`): a retry is always a new call, new id."""
    client = _single_attempt.get(id(kv))
    if client is None:
        client = _single_attempt[id(kv)] = KVClient(kv.node_addresses or kv.addresses, retries=0,
                                                    timeout_s=kv.timeout_s,
                                                    client_id=f"{kv.client_id}-no-rid", tls=kv.tls)
    return client.cas(key, value, expected_version, request_id=None).version


def write_after_lease_loss(coordinator) -> None:  # noqa: ANN001 - coordinator.Coordinator
    """WRONG ON PURPOSE (`write-after-lease-loss`): a deposed coordinator writes its state as
    one last checkpoint, by CAS on the head version it re-reads (so no fence stops it)."""
    import time

    from system.kv.client import CasMismatch, KVError
    from system.trainer import checkpoint as codec
    from system.trainer import data

    core = coordinator.core
    config = coordinator.config
    step = core.step
    ckpt = codec.Checkpoint(
        step=step, params=core.state.params.copy(), velocity=core.state.velocity.copy(),
        config_hash=config.config_hash(),
        cursors=[data.data_cursor(step, rows, config.batch_size) for rows in core.shard_rows],
        rng={"algorithm": "philox-seedsequence", "key": "(seed, worker+1, epoch, 0xBA7C4)",
             "seed": config.seed}, done=False)
    blob = codec.encode(ckpt)
    meta = codec.Metadata(step=step, mode="inline", size=len(blob), checksum=codec.blob_checksum(blob),
                          config_hash=config.config_hash(),
                          coordinator_id=coordinator.options.coordinator_id,
                          lease_version=core.term, request_id="")
    store = coordinator.store
    deadline = time.monotonic() + FLUSH_DEADLINE_S
    attempt = 0
    while time.monotonic() < deadline:
        try:
            head = store.read_head()
        except KVError:
            time.sleep(0.2)
            continue
        expected = head[2] if head is not None else 0
        # Each attempt is another CAS (another expected version), so it has its own request
        # id: the store refuses an id reused for a different request (state_machine.py), so
        # under one id every retry after a first attempt that lost to the successor's next
        # checkpoint (one every few tens of ms) was refused, for as long as it tried.
        attempt += 1
        meta.request_id = rid = f"{coordinator.options.coordinator_id}:flush-{step}-{attempt}"
        event = {"step": step, "request_id": rid, "lease_version": core.term}
        coordinator._emit({"kind": "checkpoint-invoke", "version": expected, **event})
        try:
            version = store.kv.cas(store.key, codec.encode_head(meta, blob), expected,
                                   request_id=rid).version
        except CasMismatch:
            coordinator._emit({"kind": "checkpoint-fail", "outcome": "cas-mismatch", **event})
            time.sleep(0.2)
            continue
        except KVError as exc:
            coordinator._emit({"kind": "checkpoint-info", "outcome": "indeterminate",
                               "detail": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}",
                               **event})
            time.sleep(0.2)
            continue
        coordinator._emit({"kind": "checkpoint-ok", "version": version, "outcome": "ok", **event})
        return
