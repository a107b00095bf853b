"""The trainer checker: from a `--workload trainer` history alone, did any checkpoint go wrong?

Input: the records of history.jsonl (workloads/trainer.py writes them): checkpoint writes
as client operations (f `checkpoint`; invoke/ok/fail/info with `step`, `request_id`,
`lease_version`, `coordinator`, `expected_version` (absent: a write that compared nothing);
`version` = the head key's version after an ok write), the coordinators' other operations —
`lease-read`, `lease-write` (take / renew), `head-read`, `resume` (the takeover's head
rewrite), see checker/trainer_protocol.py — events of process "trainer" (`resume`,
`lease-acquired`, `skip`, `paused-at`, ...), and the final read (f `read-checkpoint`: the
head's step, version, parameter digest and its chain of earlier records).

Properties, each its own verdict (`results.json` entry `trainer-<name>`):

| property | holds when |
|---|---|
| `durable` | every acknowledged checkpoint (ok write, ok resume) is still the head at the end or superseded by a later one: the final head's version and step are at least its own, and where the final chain still lists its version, that version carries its request id |
| `resume` | every resume starts from a step at least that of every checkpoint acknowledged before it in the history, and steps never go backwards along the head's versions |
| `fencing` | no two coordinators wrote under the same lease version, and no write committed after (at a higher head version than) the resume of a coordinator holding a newer lease |
| `request-ids` | no request id was applied twice (two versions for one id, or twice in the chain), and no write recorded `fail` ("certainly not applied") shows up as a checkpoint later (a resume from it, or in the final chain) |
| `lease` | at most one coordinator held each lease term: every lease write (take, renew) that may have applied compared a version (`blind-lease-write` otherwise), the one its writer had last read or written (`lease-cas-not-on-read`), and produced the next version after it (`lease-overwritten`: it replaced versions its writer never saw, so two coordinators believed they held the lease); no version or term claimed by two coordinators (`shared-term`) |
| `head-cas` | every head write that may have applied (checkpoint, takeover rewrite) was a compare-and-swap (`blind-head-write`), sent while its writer held a lease (`head-write-without-lease`: after its own lease write failed, `lease-lost` or `deposed`), on the latest head version that writer had read or written under its current term (`head-cas-not-on-read`) |
| `resume-after-lease` | no resume started from a step older than a checkpoint (or resume) acknowledged before its writer's lease take completed (`resume-older-than-acknowledged`), nor from anything but the head it read after that take (`resume-not-from-lease-read`, `resume-without-lease-read`) |
| `unique-request-ids` | no request id was used by two coordinators (checkpoint, resume and lease writes; ids are global in the store) |
| `reference` | when no worker step was skipped, the final parameters and momentum are bit-for-bit those of the fault-free run at the same step (`reference(step)` gives its digest); skipped steps make this "not applicable" (valid, with a note) |

A history without a successful final read leaves `durable` and `reference` unknown.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from checker.result import UNKNOWN, Verdict, combine
from histories.ops import Op, OpType
from histories.read import thaw_object as _as_dict

PROPERTIES = ("durable", "resume", "fencing", "request-ids", "lease", "head-cas",
              "resume-after-lease", "unique-request-ids", "reference")


@dataclass
class Write:
    """An acknowledged or attempted head write (a checkpoint, or a resume's rewrite)."""

    kind: str  # "checkpoint" | "resume"
    coordinator: str
    step: int
    request_id: str
    lease_version: int
    outcome: str  # ok | fail | info
    version: int | None  # head version after an ok write
    call: int  # history index of the invoke (a resume: of its event)
    ret: int | None  # history index of the completion


@dataclass
class PropertyResult:
    name: str
    valid: Verdict = True
    anomalies: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""

    def fail(self, kind: str, text: str, indexes: list[int]) -> None:
        self.valid = False
        if len(self.anomalies) < 50:
            self.anomalies.append({"kind": kind, "text": text, "indexes": indexes})

    def to_json(self, seconds: float) -> dict[str, Any]:
        return {"checker": f"trainer-{self.name}", "valid": self.valid, "anomalies": self.anomalies,
                "note": self.note or None, "seconds": round(seconds, 4)}


def _extra(op: Op) -> dict[str, Any]:
    return dict(op.extra)




def _final_value(value: Any) -> dict[str, Any]:
    out = _as_dict(value)
    out["chain"] = [_as_dict(e) for e in out.get("chain") or ()]
    return out


def parse(records: list[Op]) -> tuple[list[Write], list[Op], dict[str, Any] | None, int | None]:
    """(head writes, trainer events, final read's value (None if none succeeded), its index)."""
    writes: list[Write] = []
    events: list[Op] = []
    open_: dict[int, Op] = {}
    final: dict[str, Any] | None = None
    final_index: int | None = None
    for op in records:
        if isinstance(op.process, str):
            if op.process == "trainer":
                events.append(op)
                value = _as_dict(op.value)
                if op.f == "resume" and value.get("outcome") == "ok":
                    writes.append(Write("resume", value.get("coordinator_id", ""), value.get("step", 0),
                                        value.get("request_id", ""), value.get("lease_version", 0),
                                        "ok", value.get("version"), op.index, op.index))
            continue
        if op.type is OpType.INVOKE:
            open_[op.process] = op
            continue
        invoke = open_.pop(op.process, None)
        if invoke is None:
            continue
        if op.f == "checkpoint":
            extra = {**_extra(invoke), **_extra(op)}
            writes.append(Write("checkpoint", extra.get("coordinator", ""), extra.get("step") or 0,
                                extra.get("request_id") or "", extra.get("lease_version") or 0,
                                op.type.value, op.version, invoke.index, op.index))
        elif op.f == "read-checkpoint" and op.type is OpType.OK:
            final = _final_value(op.value)
            final["version"] = op.version or 0
            final_index = op.index
    for invoke in open_.values():  # no completion: unknown outcome
        if invoke.f == "checkpoint":
            extra = _extra(invoke)
            writes.append(Write("checkpoint", extra.get("coordinator", ""), extra.get("step") or 0,
                                extra.get("request_id") or "", extra.get("lease_version") or 0,
                                "info", None, invoke.index, None))
    return writes, events, final, final_index


def _durable(writes: list[Write], final: dict[str, Any] | None, final_index: int | None) -> PropertyResult:
    r = PropertyResult("durable")
    if final is None:
        r.valid, r.note = UNKNOWN, "no successful final read of the checkpoint head"
        return r
    chain = {e.get("version"): e for e in final.get("chain") or [] if e.get("version") is not None}
    for w in writes:
        if w.outcome != "ok" or w.version is None:
            continue
        where = [w.ret if w.ret is not None else w.call] + ([final_index] if final_index is not None else [])
        if final["version"] < w.version or final.get("step", 0) < w.step:
            r.fail("lost-checkpoint", f"{w.kind} of step {w.step} by {w.coordinator} "
                   f"({w.request_id}) was acknowledged at head version {w.version}, but the final "
                   f"head is version {final['version']} at step {final.get('step')}", where)
        elif w.version in chain and chain[w.version].get("request_id") != w.request_id:
            r.fail("overwritten-checkpoint", f"{w.kind} of step {w.step} ({w.request_id}) was "
                   f"acknowledged at head version {w.version}, but the head's chain says version "
                   f"{w.version} is {chain[w.version].get('request_id')}", where)
    return r


def _resume(writes: list[Write], events: list[Op]) -> PropertyResult:
    r = PropertyResult("resume")
    acked: list[Write] = []
    for w in sorted((w for w in writes if w.outcome == "ok"), key=lambda w: w.ret or w.call):
        if w.kind == "resume":
            before = [a for a in acked if a.step > w.step]
            if before:
                latest = max(before, key=lambda a: a.step)
                r.fail("resume-from-old", f"{w.coordinator} resumed from step {w.step}, but step "
                       f"{latest.step} ({latest.request_id}) had been acknowledged before",
                       [latest.ret or latest.call, w.call])
        acked.append(w)
    by_version = sorted((w for w in writes if w.outcome == "ok" and w.version is not None),
                        key=lambda w: w.version)  # type: ignore[arg-type, return-value]
    for a, b in zip(by_version, by_version[1:], strict=False):
        if b.step < a.step:
            r.fail("step-backwards", f"head version {b.version} ({b.request_id}) is step {b.step}, "
                   f"after version {a.version} ({a.request_id}) at step {a.step}",
                   [a.ret or a.call, b.ret or b.call])
    return r


def _fencing(writes: list[Write], events: list[Op]) -> PropertyResult:
    r = PropertyResult("fencing")
    owners: dict[int, tuple[str, int]] = {}
    for e in events:
        if e.f == "lease-acquired":
            v = _as_dict(e.value)
            owners.setdefault(v.get("lease_version"), (v.get("coordinator_id", ""), e.index))
    for w in writes:
        if w.outcome != "ok":
            continue
        owner = owners.setdefault(w.lease_version, (w.coordinator, w.ret or w.call))
        if owner[0] != w.coordinator:
            r.fail("shared-lease-version", f"{w.coordinator} wrote step {w.step} ({w.request_id}) "
                   f"under lease version {w.lease_version}, which {owner[0]} holds",
                   [owner[1], w.ret or w.call])
    resumes = [w for w in writes if w.kind == "resume" and w.outcome == "ok" and w.version is not None]
    for w in writes:
        if w.outcome != "ok" or w.version is None:
            continue
        for fence in resumes:
            if fence.lease_version > w.lease_version and fence.version < w.version:  # type: ignore[operator]
                r.fail("write-after-fence", f"{w.coordinator} wrote step {w.step} ({w.request_id}) "
                       f"under lease version {w.lease_version} at head version {w.version}, after "
                       f"{fence.coordinator} resumed under lease version {fence.lease_version} at "
                       f"head version {fence.version}", [fence.call, w.ret or w.call])
                break
    return r


def _request_ids(writes: list[Write], events: list[Op], final: dict[str, Any] | None) -> PropertyResult:
    r = PropertyResult("request-ids")
    seen: dict[str, Write] = {}
    for w in writes:
        if w.outcome != "ok" or not w.request_id:
            continue
        first = seen.setdefault(w.request_id, w)
        if first is not w and first.version != w.version:
            r.fail("applied-twice", f"request id {w.request_id} was applied at head versions "
                   f"{first.version} and {w.version}", [first.ret or first.call, w.ret or w.call])
    chain = (final or {}).get("chain") or []
    counts: dict[str, list[int]] = {}
    for e in chain:
        if e.get("request_id"):
            counts.setdefault(e["request_id"], []).append(e.get("version"))
    for rid, versions in counts.items():
        if len(versions) > 1:
            r.fail("applied-twice", f"request id {rid} is at head versions {versions} of the final "
                   f"chain", [])
    failed = {w.request_id: w for w in writes if w.outcome == "fail" and w.request_id}
    for e in events:
        value = _as_dict(e.value)
        if e.f == "resume" and value.get("from_request_id") in failed:
            w = failed[value["from_request_id"]]
            r.fail("failed-write-applied", f"{w.coordinator}'s checkpoint of step {w.step} "
                   f"({w.request_id}) was recorded as failed ({'certainly not applied'}), yet "
                   f"{value.get('coordinator_id')} resumed from it", [w.ret or w.call, e.index])
    for rid in counts:
        if rid in failed:
            w = failed[rid]
            r.fail("failed-write-applied", f"{w.coordinator}'s checkpoint of step {w.step} ({rid}) "
                   f"was recorded as failed, yet the final head's chain lists it",
                   [w.ret or w.call])
    return r


def _reference(events: list[Op], final: dict[str, Any] | None, final_index: int | None,
               reference: Callable[[int], str] | None) -> PropertyResult:
    r = PropertyResult("reference")
    skips = [e for e in events if e.f == "skip"]
    if skips:
        r.note = (f"not applicable: {len(skips)} worker step{'s' if len(skips) != 1 else ''} "
                  f"skipped, so the model differs from the fault-free run by design")
        return r
    if final is None or not final.get("params_sha256"):
        r.valid, r.note = UNKNOWN, "no final checkpoint to compare"
        return r
    if reference is None:
        r.valid, r.note = UNKNOWN, "no reference run available (no training configuration)"
        return r
    step = int(final.get("step", 0))
    expected = reference(step)
    if expected != final["params_sha256"]:
        r.fail("differs-from-reference", f"the final checkpoint at step {step} has parameters "
               f"{final['params_sha256'][:23]}..., the fault-free run at step {step} has "
               f"{expected[:23]}...", [final_index] if final_index is not None else [])
    else:
        r.note = f"equal to the fault-free run at step {step}"
    return r


def check_trainer(records: list[Op], reference: Callable[[int], str] | None = None
                  ) -> dict[str, dict[str, Any]]:
    """results.json entries `trainer-<property>`, plus `trainer` (the combined verdict)."""
    from checker import trainer_protocol as protocol

    started = time.monotonic()
    writes, events, final, final_index = parse(records)
    calls = protocol.calls(records)
    results = [_durable(writes, final, final_index), _resume(writes, events),
               _fencing(writes, events), _request_ids(writes, events, final),
               protocol.lease(calls, PropertyResult("lease")),
               protocol.head_cas(calls, records, PropertyResult("head-cas")),
               protocol.resume_after_lease(calls, PropertyResult("resume-after-lease")),
               protocol.unique_request_ids(calls, PropertyResult("unique-request-ids")),
               _reference(events, final, final_index, reference)]
    seconds = time.monotonic() - started
    out = {f"trainer-{r.name}": r.to_json(seconds / len(results)) for r in results}
    counts = {"checkpoints": {o: sum(1 for w in writes if w.kind == "checkpoint" and w.outcome == o)
                              for o in ("ok", "fail", "info")},
              "resumes": sum(1 for w in writes if w.kind == "resume"),
              "lease_acquisitions": sum(1 for e in events if e.f == "lease-acquired"),
              "skipped_worker_steps": sum(1 for e in events if e.f == "skip"),
              "final_step": final.get("step") if final else None,
              "lease_writes": {o: sum(1 for c in calls if c.f == "lease-write" and c.outcome == o)
                               for o in ("ok", "fail", "info")},
              "head_reads": sum(1 for c in calls if c.f == "head-read"),
              # pauses that landed inside each window, as the history shows them
              "windows": protocol.windows(calls, records)}
    out["trainer_summary"] = {"valid": combine([r.valid for r in results]), "counts": counts}
    return out


def reference_digest(config_json: dict[str, Any]) -> Callable[[int], str]:
    """The fault-free run's digest at a step: the one-process loop (system/trainer/local.py)
    with the run's configuration, bit-for-bit the distributed arithmetic."""
    from system.trainer import local
    from system.trainer.config import TrainConfig
    from workloads.trainer import params_digest

    config = TrainConfig(**config_json)

    def digest(step: int) -> str:
        state = local.train_local(config, steps=step)
        return params_digest(state.params, state.velocity)

    return digest
