"""Writing and reading checkpoints through the KV store (the shell around checkpoint.py).

Write protocol (docs/trainer.md, "checkpoints"):
1. the blob goes first where it lives: inline chunks (plain puts, when the blob is larger
   than `chunk_bytes`) or the object store (fsynced, named by its hash);
2. then the head record, by compare-and-swap on the version the coordinator believes
   current, with request id `<coordinator-id>:step-<n>`. That CAS is the fence: a
   coordinator that has been replaced finds the head moved (the new one rewrites it on
   takeover) and gets CasMismatch, and must step down for good.

An Indeterminate or Unavailable answer is retried with the SAME request id (the store
applies it at most once and returns the first result), as long as `keep_trying()` says
the writer may still write (its lease is valid). A blob is deleted only once its head
record is at least KEEP_SUPERSEDED records old, so a reader that read the head just
before is not left without its blob. A blob whose head was never written (its writer died
or was fenced between the upload and the head CAS) is collected by the next coordinator,
after its takeover rewrite: `collect_orphans`.

What it must never do: retry under a new request id, or write a head without CAS.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from system.kv.client import CasMismatch, Indeterminate, KVClient, NotFound, Unavailable
from system.trainer import checkpoint as codec
from system.trainer import pause_points
from system.trainer.object_store import (
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    object_name,
    parse_name,
)

DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024  # well under the store's 64 MiB value limit
KEEP_SUPERSEDED = 2  # superseded checkpoints whose blobs are still kept for late readers


class StopWriting(Exception):
    """The writer may no longer write (lease lapsed) and its last attempt's outcome is
    unknown."""


def head_key(job: str) -> str:
    return f"trainer/{job}/checkpoint"


@dataclass
class Latest:
    checkpoint: codec.Checkpoint
    meta: codec.Metadata
    version: int  # head key's version
    blob: bytes  # exactly as stored: a takeover rewrite must carry the same bytes (checksum)


class CheckpointStore:
    def __init__(self, kv: KVClient, job: str, mode: str = "inline", *,
                 objects: ObjectStore | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 keep_trying: Callable[[], bool] = lambda: True,
                 on_attempt: Callable[[str, str], None] | None = None, unsafe: str = "",
                 on_read: Callable[[dict], None] | None = None) -> None:
        if mode not in ("inline", "object"):
            raise ValueError(f"checkpoint mode must be inline or object, got {mode!r}")
        if mode == "object" and objects is None:
            raise ValueError("object mode needs an object store")
        self.kv, self.job, self.mode, self.objects = kv, job, mode, objects
        self.chunk_bytes = chunk_bytes
        self.keep_trying = keep_trying
        self.on_attempt = on_attempt  # (request_id, outcome) for the event log
        self.key = head_key(job)
        self.unsafe = unsafe  # "" unless a test canary (unsafe.py) was explicitly allowed
        self.head_version = 0  # the head key's version the last read_latest saw (0: absent)
        self.head_lease_version = 0  # the lease version of the head record it saw
        # (version, step, lease version, request id) of every head read, for the event log:
        # the history shows what each coordinator read, and when (checker/trainer.py).
        self.on_read = on_read

    def compares_head(self) -> bool:
        """Whether a head write compares the expected version (False only for a canary that
        writes it blind): what the event log must say the write expected."""
        return self.unsafe != "no-fencing"

    # ----- reading ---------------------------------------------------------------------

    def read_head(self, consistency: str = "linearizable") -> tuple[codec.Metadata, bytes | None, int] | None:
        try:
            got = self.kv.get(self.key, consistency=consistency)
        except NotFound:
            if self.on_read:
                self.on_read({"version": 0, "step": None})
            return None
        meta, inline = codec.decode_head(got.value)
        if self.on_read:
            self.on_read({"version": got.version, "step": meta.step, "lease_version": meta.lease_version,
                          "request_id": meta.request_id})
        return meta, inline, got.version

    def load_blob(self, meta: codec.Metadata, inline: bytes | None) -> bytes:
        if meta.pointer:
            if self.objects is None:
                raise codec.CheckpointError(
                    f"checkpoint is in an object store ({meta.pointer}); pass --checkpoint-store")
            return self.objects.get(meta.pointer)
        if meta.chunks:
            return b"".join(self.kv.get(k).value for k in meta.chunks)
        return inline or b""

    def read_latest(self, config_hash: str | None = None, attempts: int = 3) -> Latest | None:
        """The latest checkpoint by a linearizable read, checksum and config verified. A
        blob collected between reading the head and the blob means a newer head: re-read.
        A blob still missing under an unchanged head (or after `attempts` reads) is gone:
        CheckpointError naming the checkpoint and the object, not a retry loop."""
        missing_under: int | None = None  # head version whose blob was missing
        for attempt in range(attempts):
            head = self.read_head()
            if head is None:
                self.head_version = self.head_lease_version = 0
                return None
            meta, inline, version = head
            self.head_version, self.head_lease_version = version, meta.lease_version
            if not meta.checksum and meta.kind == "resume":
                # A takeover record written before any checkpoint (its writer died before
                # its first one): there is no checkpoint yet, only a head to CAS on.
                return None
            if config_hash is not None and meta.config_hash != config_hash:
                raise codec.CheckpointError(
                    f"the checkpoint was written by configuration {meta.config_hash}, this run is "
                    f"{config_hash}; run with the same settings or another --job")
            try:
                blob = self.load_blob(meta, inline)
            except (NotFound, ObjectNotFound) as exc:
                if attempt == attempts - 1 or version == missing_under:
                    raise codec.CheckpointError(self._missing_blob(meta, version, exc)) from None
                missing_under = version
                continue
            ckpt = codec.decode(blob, checksum=meta.checksum, config_hash=config_hash)
            return Latest(ckpt, meta, version, blob)
        return None

    def _missing_blob(self, meta: codec.Metadata, version: int, exc: Exception) -> str:
        if isinstance(exc, ObjectNotFound):
            where = f"object {exc.name} at {exc.location}, which is not there"
        else:
            where = f"chunk key {getattr(exc, 'key', '?')}, which is not in the store"
        return (f"checkpoint step {meta.step} (head {self.key} version {version}, lease {meta.lease_version}, "
                f"{meta.request_id}) names {where}; restore it, or start over under another --job")

    # ----- writing ---------------------------------------------------------------------

    def _settle(self, request_id: str, write: Callable[[], int]) -> int:
        """Run `write` until it has an outcome; retries reuse the request id inside it."""
        backoff_s = 0.02
        while True:
            try:
                version = write()
            except (Indeterminate, Unavailable) as exc:
                outcome = "indeterminate" if isinstance(exc, Indeterminate) else "unavailable"
                if self.on_attempt:
                    self.on_attempt(request_id, outcome)
                if not self.keep_trying():
                    raise StopWriting(f"{request_id}: {outcome}, and the lease no longer allows writing") from exc
                time.sleep(backoff_s)  # bounded backoff before the same request id again
                backoff_s = min(backoff_s * 2, 0.5)
                continue
            return version

    def write(self, blob: bytes, meta: codec.Metadata, expected_version: int,
              previous: codec.Metadata | None, previous_version: int | None) -> int:
        """Write a checkpoint; returns the head's new version. Raises CasMismatch when
        another coordinator has moved the head, StopWriting when the lease lapsed first."""
        rid = meta.request_id
        meta.checksum, meta.size, meta.mode = codec.blob_checksum(blob), len(blob), self.mode
        meta.history = self._history(previous, previous_version)
        inline: bytes | None = None
        if self.mode == "object":
            assert self.objects is not None
            # The writer's lease version in the name: what lets a successor tell a fenced
            # writer's orphan from a blob a live writer may still commit (collect_orphans).
            meta.pointer = object_name(meta.checksum, meta.lease_version)
            self.objects.put(meta.pointer, blob)
        elif len(blob) > self.chunk_bytes:
            meta.chunks = []
            for i in range(0, len(blob), self.chunk_bytes):
                key = f"trainer/{self.job}/chunks/{meta.step}-{meta.checksum[7:23]}/{i // self.chunk_bytes}"
                part = blob[i:i + self.chunk_bytes]
                self._settle(f"{rid}:chunk-{i // self.chunk_bytes}", lambda k=key, p=part, n=i: self.kv.put(
                    k, p, request_id=f"{rid}:chunk-{n // self.chunk_bytes}").version)
                meta.chunks.append(key)
        else:
            inline = blob
        value = codec.encode_head(meta, inline)
        pause_points.reach("before-head-cas", meta.step)
        if self.unsafe == "no-fencing":
            from system.trainer.unsafe import write_head_without_cas
            version = self._settle(rid, lambda: write_head_without_cas(self.kv, self.key, value, rid))
        elif self.unsafe == "no-request-id":
            from system.trainer.unsafe import cas_without_request_id
            version = self._settle(rid, lambda: cas_without_request_id(self.kv, self.key, value,
                                                                        expected_version))
        else:
            version = self._settle(rid, lambda: self.kv.cas(self.key, value, expected_version,
                                                            request_id=rid).version)
        self._collect(meta)
        return version

    def rewrite_head(self, latest: Latest | None, expected_version: int, meta: codec.Metadata) -> int:
        """A new coordinator's first write: the head again (same blob, its own lease
        version) by CAS, so any older coordinator's next checkpoint CAS fails."""
        inline = None
        if latest is not None:
            old = latest.meta
            meta.step, meta.size, meta.checksum, meta.mode = old.step, old.size, old.checksum, old.mode
            meta.chunks, meta.pointer, meta.done = old.chunks, old.pointer, old.done
            meta.config_hash = old.config_hash
            meta.history = self._history(old, latest.version)
            if not old.chunks and not old.pointer:
                inline = latest.blob
        value = codec.encode_head(meta, inline)
        return self._settle(meta.request_id, lambda: self.kv.cas(
            self.key, value, expected_version, request_id=meta.request_id).version)

    @staticmethod
    def _history(previous: codec.Metadata | None, previous_version: int | None) -> list[dict]:
        if previous is None:
            return []
        entries = [*previous.history, previous.summary(previous_version)]
        return entries[-codec.HISTORY_LIMIT:]

    def collect_orphans(self, head: codec.Metadata) -> list[str]:
        """After a takeover rewrite of the head under lease version `head.lease_version`:
        delete the object blobs of lower lease versions that neither the head nor its kept
        records name. Safe because every lower-lease writer is fenced — the rewrite moved the
        head past the version its CAS expects — so such a blob can never become referenced;
        a blob of this lease or a newer one (a successor's upload in flight) is never
        touched, nor one without a lease version in its name (unknown writer). Best effort;
        returns the names deleted."""
        if self.objects is None:
            return []
        kept = head.history[-KEEP_SUPERSEDED:] + [head.summary()]
        live = {e.get("pointer") for e in kept}
        deleted = []
        try:
            for name in self.objects.names():
                lease, _ = parse_name(name)
                if lease is not None and lease < head.lease_version and name not in live:
                    self.objects.delete(name)
                    deleted.append(name)
        except (ObjectStoreError, OSError):
            pass
        return deleted

    def _collect(self, meta: codec.Metadata) -> None:
        """Delete the blobs of heads that fell out of the keep window, unless a newer
        record still points at them. Best effort: a failure leaves garbage, never a gap."""
        if len(meta.history) <= KEEP_SUPERSEDED:
            return
        kept = meta.history[-KEEP_SUPERSEDED:] + [meta.summary()]
        live_pointers = {e.get("pointer") for e in kept}
        live_chunks = {c for e in kept for c in (e.get("chunks") or [])}
        old = meta.history[-KEEP_SUPERSEDED - 1]
        try:
            if old.get("pointer") and old["pointer"] not in live_pointers and self.objects:
                self.objects.delete(old["pointer"])
            for key in old.get("chunks") or []:
                if key not in live_chunks:
                    self.kv.delete(key, request_id=f"{meta.request_id}:gc-{key}")
        except (Indeterminate, Unavailable, CasMismatch, ObjectStoreError, OSError):
            pass
