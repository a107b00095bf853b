"""Coordinator leadership: a lease key in the store, taken and renewed by compare-and-swap.

The key `trainer/<job>/lease` holds one JSON record {coordinator_id, address, term, done,
watch}.
- Take: CAS from the version last observed (0 = no key). The version the CAS produces is
  the new holder's *term*: the fencing token it puts on every parameter reply and every
  checkpoint write. Terms only grow, because a key's version only grows.
- Renew: CAS from the holder's last version (each renewal bumps the version; the term in
  the record stays). A mismatch means someone took the lease: the holder is deposed.
- Lapse: a standby that sees the same version for longer than `lease_s` (by its own clock)
  takes it. Or earlier, when the holder's process has ended: `watch` is an address whose
  connection closes when it does (liveness.py), and a standby that sees it close takes the
  lease at once by the same CAS (`try_acquire(holder_gone=True)`). The holder stops acting
  at `renewed_at + lease_s * HOLDER_FRACTION`, measured from *before* its last successful
  renewal was sent, so with clock rates that differ by less than the margin (0.2 lease_s
  over a lease_s) the holder always gives up before a standby can take over. The
  checkpoint CAS is the real fence either way (checkpoint_store.py).

`LeaseTimer` is the pure timing rule (tests drive it with numbers); `LeaseKeeper` is the
shell that talks to the store. Every read and write of the key is reported to `on_event`
(kinds `lease-read`, and `lease-write` with phase invoke / ok / fail / info, the expected
version it compared against and the term it writes under), so the harness's history can show
which coordinator believed it held which term (checker/trainer.py, property `lease`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from system.kv.client import CasMismatch, Indeterminate, KVClient, KVError, NotFound, Unavailable
from system.trainer import pause_points

# The holder trusts its lease for this share of lease_s after sending its last successful
# renewal. A standby takes over no earlier than lease_s after it *observed* that renewal
# (after it applied, so after it was sent): 0.2 lease_s (0.4 s) of margin, which covers
# any difference of clock rates (one machine here: none) many times over. It was 0.6:
# a slow renewal ate its successor's budget, since the budget counts from the send of the
# last one that succeeded; at load 12-17 one took 0.94 s, left the next 0.26 s, and the
# lease lapsed with no fault (issue 25; benchmarks/trainer_lease_bench.py).
HOLDER_FRACTION = 0.8
# The holder sends its next renewal this share of lease_s after sending the last successful
# one, which leaves the renewal HOLDER_FRACTION - RENEW_FRACTION = 0.7 lease_s (1.4 s at the
# default 2 s) to be answered before the holder stops acting. It was 0.2 (0.4 lease_s left):
# under load the renewal round trip through the harness's proxies had a tail past that
# (issue 22).
RENEW_FRACTION = 0.1


def lease_key(job: str) -> str:
    return f"trainer/{job}/lease"


@dataclass
class LeaseTimer:
    """Pure timing. Holder side: `valid(now)`. Standby side: `observe` / `lapsed`."""

    lease_s: float
    renewed_at: float | None = None  # holder: send time of the last successful CAS
    seen_version: int | None = None  # standby: last version observed
    seen_since: float = 0.0  # standby: when it was first observed

    def on_renewed(self, sent_at: float) -> None:
        self.renewed_at = sent_at

    def valid(self, now: float) -> bool:
        return self.renewed_at is not None and now < self.renewed_at + self.lease_s * HOLDER_FRACTION

    def renew_due(self, now: float) -> bool:
        return self.renewed_at is None or now >= self.renewed_at + self.lease_s * RENEW_FRACTION

    def observe(self, version: int, now: float) -> None:
        if version != self.seen_version:
            self.seen_version, self.seen_since = version, now

    def lapsed(self, now: float) -> bool:
        # No key at all: nobody ever held it, take it at once.
        return self.seen_version == 0 or (self.seen_version is not None
                                          and now - self.seen_since >= self.lease_s)


@dataclass
class LeaseRecord:
    coordinator_id: str
    address: str
    term: int
    done: bool = False
    watch: str = ""  # the holder's liveness address (liveness.py); "" = none


def read_lease(kv: KVClient, job: str, consistency: str = "linearizable",
               timeout_s: float | None = None) -> tuple[LeaseRecord | None, int]:
    try:
        got = kv.get(lease_key(job), consistency=consistency, timeout_s=timeout_s)
    except NotFound:
        return None, 0
    return LeaseRecord(**json.loads(got.value)), got.version


class LeaseKeeper:
    def __init__(self, kv: KVClient, job: str, coordinator_id: str, address: str, lease_s: float,
                 on_event: Callable[[dict], None] | None = None, rid_prefix: str | None = None,
                 unsafe: str = "", watch: str = "") -> None:
        self.kv, self.job, self.coordinator_id, self.address = kv, job, coordinator_id, address
        self.watch = watch  # our liveness address, written into every record we write
        self.timer = LeaseTimer(lease_s)
        self.version = 0  # holder: the lease key's version after our last write
        self.term = 0  # holder: version of our acquiring write
        self._renewals = 0
        self.on_event = on_event or (lambda event: None)
        # Request ids start with the coordinator's id: they are global in the store.
        self.rid_prefix = f"{coordinator_id}:" if rid_prefix is None else rid_prefix
        self.unsafe = unsafe  # "" unless a test canary (unsafe.py) was explicitly allowed
        # The renewer thread and the final "done" renewal must not interleave their CASes.
        self._lock = threading.Lock()

    def _value(self, term: int, done: bool = False) -> bytes:
        return json.dumps(LeaseRecord(self.coordinator_id, self.address, term, done,
                                      self.watch).__dict__).encode()

    def _write_event(self, phase: str, op: str, rid: str, term: int, **fields: object) -> None:
        self.on_event({"kind": "lease-write", "phase": phase, "detail": op, "request_id": rid,
                       "lease_version": term, **fields})

    def observe(self) -> LeaseRecord | None:
        record, version = read_lease(self.kv, self.job)
        self.timer.observe(version, time.monotonic())
        self.on_event({"kind": "lease-read", "version": version,
                       "holder": record.coordinator_id if record else None,
                       "lease_version": record.term if record else 0})
        return record

    def try_acquire(self, holder_gone: bool = False) -> bool:
        """CAS from the observed version if the lease lapsed, or at once when the caller
        has seen the holder's process end (`holder_gone`: its watch connection closed after
        the version was observed). True: we hold it (term set)."""
        if not holder_gone and not self.timer.lapsed(time.monotonic()):
            return False
        expected = self.timer.seen_version or 0
        rid = f"{self.rid_prefix}lease-{expected}"
        sent_at = time.monotonic()
        blind = self.unsafe == "lease-by-put"
        # The term must be in the record, but it is the version this write produces,
        # which is expected + 1: versions of one key grow by one per write.
        self._write_event("invoke", "take", rid, expected + 1,
                          expected_version=None if blind else expected)
        try:
            if blind:
                from system.trainer.unsafe import take_lease_by_put
                result = take_lease_by_put(self.kv, lease_key(self.job), self._value(expected + 1), rid)
            else:
                result = self.kv.cas(lease_key(self.job), self._value(expected + 1), expected,
                                     request_id=rid)
        except CasMismatch:
            self._write_event("fail", "take", rid, expected + 1, outcome="cas-mismatch")
            return False
        except KVError as exc:  # Indeterminate, Unavailable, ...: the write may have applied
            self._write_event("info", "take", rid, expected + 1, outcome="indeterminate",
                              error=type(exc).__name__)
            return False  # a retry with the same id next round settles it
        if not blind:
            assert result.version == expected + 1, "lease versions must grow by one per write"
        self.version = self.term = result.version
        self.timer.on_renewed(sent_at)
        self._write_event("ok", "take", rid, self.term, version=result.version)
        return True

    def renew(self, done: bool = False) -> bool:
        """False when the lease is lost (CAS mismatch) or could not be confirmed in time."""
        with self._lock:
            self._renewals += 1
            rid = f"{self.rid_prefix}renew-{self.term}-{self._renewals}"
            self._write_event("invoke", "renew", rid, self.term, expected_version=self.version)
            # Test-only: the harness may stop the process here, inside the renewal
            # (pause_points.py; inert unless armed).
            pause_points.reach("inside-lease-renewal", self.term)
            sent_at = time.monotonic()
            while True:
                try:
                    result = self.kv.cas(lease_key(self.job), self._value(self.term, done), self.version,
                                         request_id=rid, timeout_s=max(0.2, self.timer.lease_s / 3))
                except CasMismatch:
                    self.timer.renewed_at = None
                    self._write_event("fail", "renew", rid, self.term, outcome="cas-mismatch")
                    return False
                except (Indeterminate, Unavailable) as exc:
                    if not self.timer.valid(time.monotonic()):
                        self._write_event("info", "renew", rid, self.term, outcome="indeterminate",
                                          error=type(exc).__name__)
                        return False
                    continue  # same request id: applies at most once
                except KVError as exc:
                    self._write_event("info", "renew", rid, self.term, outcome="indeterminate",
                                      error=type(exc).__name__)
                    raise
                self.version = result.version
                self.timer.on_renewed(sent_at)
                self._write_event("ok", "renew", rid, self.term, version=result.version)
                return True

    def valid(self) -> bool:
        return self.timer.valid(time.monotonic())
