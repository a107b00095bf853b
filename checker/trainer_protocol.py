"""The trainer's lease and fencing protocol, judged from the history alone (checker/trainer.py
runs these beside its checkpoint properties; the table of properties is in its docstring).

The coordinators' operations (workloads/trainer.py writes them; one history process per
coordinator and kind of operation):
- `lease-read` (ok: `version` read) and `lease-write` (invoke: `expected_version`, absent for
  a write that compares nothing, `lease_version` = the term it writes under, `op` take or
  renew; ok: `version` produced; fail: cas-mismatch; info: unknown);
- `head-read` (ok: `version`, value = the step of the head record read);
- `resume` (invoke: `expected_version`, `from_version`, value = the step resumed from,
  `lease_version`; ok: `version` produced) and `checkpoint` (as in checker/trainer.py).

Why versions prove things here: the store gives each write of a key the next version, so a
write that produced version w on top of the version r its writer last saw, with w != r + 1,
replaced writes (r+1 .. w-1) that writer never read — with a compare-and-swap that cannot
happen, so it is the trace of a blind write that overwrote someone else's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from histories.ops import Op, OpType
from histories.read import thaw_object

WRITES = ("checkpoint", "resume", "lease-write")
POINTS = {"before-head-cas": "checkpoint-write", "inside-lease-renewal": "lease-renewal",
          "after-lease-take": "takeover"}


@dataclass
class Call:
    """One operation: its invoke and completion merged."""

    f: str
    coordinator: str
    call: int  # history index of the invoke
    ret: int | None  # of the completion (None: never completed)
    outcome: str  # ok | fail | info
    value: Any
    version: int | None
    expected: int | None
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def at(self) -> int:
        return self.ret if self.ret is not None else self.call


def calls(records: list[Op]) -> list[Call]:
    """The coordinators' operations, each at its invoke (the order they started in)."""
    out: list[Call] = []
    open_: dict[Any, tuple[Op, Call]] = {}
    for op in records:
        if not op.is_client or op.f not in (*WRITES, "lease-read", "head-read"):
            continue
        if op.type is OpType.INVOKE:
            extra = dict(op.extra)
            c = Call(op.f, extra.get("coordinator", ""), op.index, None, "info", op.value, None,
                     op.expected_version, extra)
            open_[op.process] = (op, c)
            out.append(c)
            continue
        found = open_.pop(op.process, None)
        if found is None:
            continue
        _, c = found
        c.ret, c.outcome, c.version = op.index, op.type.value, op.version
        c.fields.update(dict(op.extra))
        if op.error:
            c.fields["error"] = op.error
        if op.value is not None:
            c.value = op.value
    return out


def _timeline(cs: list[Call]) -> list[tuple[int, str, Call]]:
    """Invokes and completions in history order: (index, "call" | "ret", call)."""
    points = [(c.call, "call", c) for c in cs] + [(c.ret, "ret", c) for c in cs if c.ret is not None]
    return sorted(points, key=lambda p: p[0])


def lease(cs: list[Call], result: Any) -> Any:
    """(i) At most one coordinator held each term: every lease write compared the version
    its writer had read, and none replaced versions its writer never saw."""
    known: dict[str, int] = {}  # coordinator -> last lease version it read or wrote
    base: dict[int, int | None] = {}  # call index -> what its writer knew at the invoke
    by_version: dict[int, Call] = {}
    holders: dict[int, Call] = {}  # term -> the take that produced it
    for index, what, c in _timeline([c for c in cs if c.f in ("lease-read", "lease-write")]):
        if c.f == "lease-read":
            if what == "ret" and c.outcome == "ok" and c.version is not None:
                known[c.coordinator] = c.version
            continue
        if what == "call":
            base[c.call] = known.get(c.coordinator)
            continue
        seen = base.get(c.call)
        if c.outcome in ("ok", "info") and c.expected is None:
            result.fail("blind-lease-write", f"{c.coordinator}'s lease {c.fields.get('op')} "
                        f"({c.fields.get('request_id')}) compared no version (a plain put): "
                        f"{'it produced version ' + str(c.version) if c.outcome == 'ok' else 'outcome unknown'}",
                        [c.call, index])
        elif c.outcome == "ok" and seen is not None and c.expected != seen:
            result.fail("lease-cas-not-on-read", f"{c.coordinator}'s lease {c.fields.get('op')} "
                        f"({c.fields.get('request_id')}) expected version {c.expected}, but the "
                        f"last version it had seen was {seen}", [c.call, index])
        if c.outcome != "ok" or c.version is None:
            continue
        if seen is not None and c.version != seen + 1:
            lost = [by_version[v] for v in range(seen + 1, c.version) if v in by_version]
            whose = ", ".join(f"version {w.version} by {w.coordinator}" for w in lost) or "unseen writes"
            result.fail("lease-overwritten", f"{c.coordinator}'s lease {c.fields.get('op')} "
                        f"produced version {c.version} on top of version {seen}, the last it had "
                        f"seen: it replaced {whose} — two coordinators believed they held the "
                        f"lease", [*(w.ret for w in lost if w.ret is not None), c.call, index])
        other = by_version.get(c.version)
        if other is not None and other.coordinator != c.coordinator:
            result.fail("shared-term", f"lease version {c.version} was produced by both "
                        f"{other.coordinator} and {c.coordinator}", [other.at, index])
        by_version[c.version] = c
        term = c.fields.get("lease_version")
        if c.fields.get("op") == "take":
            holders.setdefault(c.version, c)
        elif term is not None and term in holders and holders[term].coordinator != c.coordinator:
            result.fail("shared-term", f"{c.coordinator} renewed term {term}, which "
                        f"{holders[term].coordinator} took", [holders[term].at, index])
        known[c.coordinator] = c.version
    return result


def _losses(records: list[Op]) -> dict[int, str]:
    """History index -> coordinator, for the trainer events that end a coordinator's term."""
    out = {}
    for op in records:
        if op.process == "trainer" and op.f in ("lease-lost", "deposed"):
            value = thaw_object(op.value)
            out[op.index] = value.get("coordinator_id", "")
    return out


def head_cas(cs: list[Call], records: list[Op], result: Any) -> Any:
    """(ii) Every head write that may have applied was a compare-and-swap on the latest head
    version its writer had read or written while holding its current term."""
    holding: dict[str, int] = {}  # coordinator -> its current term
    known: dict[str, int] = {}  # coordinator -> latest head version seen under that term
    at_invoke: dict[int, tuple[int | None, int | None]] = {}  # call -> (term, known)
    losses = _losses(records)
    timeline = _timeline(cs)
    # A history without a coordinator's lease operations (an older workload) says nothing
    # of its terms: only the blind-write check applies to it.
    leased = {c.coordinator for c in cs if c.f == "lease-write"}
    events = sorted(losses)
    for index, what, c in timeline:
        while events and events[0] < index:
            who = losses[events.pop(0)]
            holding.pop(who, None)
            known.pop(who, None)
        who = c.coordinator
        if c.f in ("lease-read", "lease-write"):
            if what != "ret" or c.f == "lease-read":
                continue
            if c.outcome == "ok" and c.fields.get("op") == "take" and c.version is not None:
                holding[who] = c.version
                known.pop(who, None)  # what it knew before this term does not count
            elif c.outcome in ("fail", "info"):
                holding.pop(who, None)
                known.pop(who, None)
            continue
        if c.f == "head-read":
            if what == "ret" and c.outcome == "ok" and who in holding and c.version is not None:
                known[who] = c.version
            continue
        if what == "call":
            at_invoke[c.call] = (holding.get(who), known.get(who))
            continue
        term, seen = at_invoke.get(c.call, (None, None))
        name = f"{who}'s {c.f} of step {c.value} ({c.fields.get('request_id')})"
        if c.outcome in ("ok", "info"):
            if c.expected is None:
                gap = (f"; it produced version {c.version} on top of version {seen}, the last "
                       f"it had seen" if c.version is not None and seen is not None
                       and c.version != seen + 1 else "")
                result.fail("blind-head-write", f"{name} compared no version (a plain put){gap}",
                            [c.call, index])
            elif who not in leased:
                pass
            elif term is None:
                result.fail("head-write-without-lease", f"{name} was sent while {who} held no "
                            f"lease (its last one lost or never taken), on version {c.expected}",
                            [c.call, index])
            elif c.expected != seen:
                result.fail("head-cas-not-on-read", f"{name} expected head version {c.expected}, "
                            f"but the latest {who} had read or written under term {term} was "
                            f"{seen}", [c.call, index])
        if c.outcome == "ok" and c.version is not None and who in holding:
            known[who] = c.version
    return result


def resume_after_lease(cs: list[Call], result: Any) -> Any:
    """(iii) No resume started from a checkpoint older than the latest one acknowledged before
    its lease was taken, nor from anything but what its writer read under that lease."""
    acked: list[Call] = []  # ok head writes, by completion
    take: dict[str, Call] = {}  # coordinator -> its latest ok take
    read: dict[str, Call] = {}  # coordinator -> its latest head read after that take
    for _index, what, c in _timeline(cs):
        if what != "ret":
            continue
        if c.f == "lease-write" and c.outcome == "ok" and c.fields.get("op") == "take":
            take[c.coordinator] = c
            read.pop(c.coordinator, None)
        elif c.f == "head-read" and c.outcome == "ok" and c.coordinator in take:
            read[c.coordinator] = c
        elif c.f in ("checkpoint", "resume") and c.outcome == "ok":
            if c.f == "resume":
                _check_resume(c, take.get(c.coordinator), read.get(c.coordinator), acked, result)
            acked.append(c)
    return result


def _check_resume(c: Call, took: Call | None, read: Call | None, acked: list[Call],
                  result: Any) -> None:
    step = c.value if isinstance(c.value, int) else c.fields.get("from_step")
    if took is None or took.ret is None or step is None:
        return
    before = [a for a in acked if a.ret is not None and a.ret < took.ret]
    latest = max(before, key=lambda a: a.value if isinstance(a.value, int) else -1, default=None)
    if latest is not None and isinstance(latest.value, int) and step < latest.value:
        result.fail("resume-older-than-acknowledged", f"{c.coordinator} resumed from step {step} "
                    f"under term {took.version}, but {latest.coordinator}'s {latest.f} of step "
                    f"{latest.value} ({latest.fields.get('request_id')}) was acknowledged before "
                    f"that lease was taken", [latest.at, took.at, c.at])
    if read is None:
        result.fail("resume-without-lease-read", f"{c.coordinator} resumed from step {step} "
                    f"without reading the head after taking term {took.version}", [took.at, c.at])
    elif read.value != step and not (read.value is None and step == 0):
        result.fail("resume-not-from-lease-read", f"{c.coordinator} resumed from step {step}, "
                    f"but the head it read under term {took.version} was step {read.value} "
                    f"(version {read.version})", [read.at, c.at])


def unique_request_ids(cs: list[Call], result: Any) -> Any:
    """(iv) No request id was used by two coordinators (ids are global in the store)."""
    first: dict[str, Call] = {}
    for c in cs:
        rid = c.fields.get("request_id")
        if c.f not in WRITES or not rid:
            continue
        owner = first.setdefault(rid, c)
        if owner.coordinator != c.coordinator:
            result.fail("request-id-collision", f"request id {rid} was used by {owner.coordinator} "
                        f"({owner.f}) and by {c.coordinator} ({c.f})", [owner.call, c.call])
    return result


def windows(cs: list[Call], records: list[Op]) -> dict[str, int]:
    """How many pauses a coordinator took at a pause point inside each window, as the history
    shows it: its `paused-at` event between the invoke and the completion of the operation
    the window is (a checkpoint write, a lease renewal), or between its take and its resume."""
    out = {w: 0 for w in POINTS.values()}
    for op in records:
        if op.process != "trainer" or op.f != "paused-at":
            continue
        value = thaw_object(op.value)
        window = POINTS.get(value.get("detail", ""))
        who = value.get("coordinator_id", "")
        if window is None:
            continue
        if window == "takeover":
            took = [c for c in cs if c.coordinator == who and c.f == "lease-write"
                    and c.fields.get("op") == "take" and c.outcome == "ok" and c.at < op.index]
            resumed = [c for c in cs if c.coordinator == who and c.f == "resume" and c.call < op.index]
            inside = bool(took) and not resumed
        else:
            f = "checkpoint" if window == "checkpoint-write" else "lease-write"
            inside = any(c.coordinator == who and c.f == f and c.call < op.index
                         and (c.ret is None or c.ret > op.index) for c in cs)
        out[window] += inside
    return out
