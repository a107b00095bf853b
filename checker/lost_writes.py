"""Lost-write checker: every acknowledged write is visible to reads that begin after it
completes, and no version of a key is ever used for two different values.

Cheaper and more specific than the linearizability search (it runs in O(n log n) per key
and names the write, the read and the versions involved), so a report can say "this
acknowledged write was lost" instead of "no linearization exists".

Two modes per key, chosen from the history:
- versioned (our store: operations carry `version`): a linearizable read that begins after
  an acknowledged write of version V completed must see a version >= V, unless a delete
  could have come in between (versions restart after a delete); and one (key, version) is
  never seen with two different values, checked on keys that have no delete.
- by value (registers without versions, e.g. Knossos histories): when every value is
  written by exactly one operation, a read that begins after write w completed must not
  return a value whose only writer completed before w was invoked (that value was
  overwritten by w for good).

Each anomaly is named for what the rest of the history says about the write it misses:
- `lost-write`: the acknowledged write is absent from that read AND from every later read of
  the key (the final read included) — it is gone for good, as far as the history shows;
- `stale-read`: a linearizable read missed it, but a later read saw it (or a later version):
  the write survived and the read was served from old state.
Both make the history invalid; the names tell an operator whether data was lost.

Must never report a maybe: only anomalies that no interleaving can explain. Stale reads
(consistency "stale") promise no recency and are not checked.

`unverified_keys` answers the other half of "no acknowledged write was lost": which keys had
an acknowledged write that no successful linearizable read began after — a run whose final
reads failed (or that was cut off before them) cannot say that those writes survived.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from checker.result import Anomaly, Result
from histories.ops import Op, Operation, OpType
from histories.pairing import pair_operations

_MAX_ANOMALIES_PER_KEY = 20
_READS = ("get", "read")
_WRITES = ("put", "write")


def check_lost_writes(history: Sequence[Op] | Sequence[Operation]) -> Result:
    started = time.perf_counter()
    if history and isinstance(history[0], Op):
        operations = pair_operations(history)  # type: ignore[arg-type]
    else:
        operations = list(history)  # type: ignore[arg-type]
    by_key: dict[Any, list[Operation]] = {}
    for op in operations:
        by_key.setdefault(op.key, []).append(op)
    anomalies: list[Anomaly] = []
    notes = []
    reads_checked = 0
    for key, ops in by_key.items():
        if any(op.version is not None for op in ops):
            found, checked, note = _versioned(key, ops)
        else:
            found, checked, note = _by_value(key, ops)
        anomalies.extend(found)
        reads_checked += checked
        if note:
            notes.append(note)
    return Result(
        checker="lost-writes",
        valid=not anomalies,
        model="lost-writes",
        seconds=time.perf_counter() - started,
        anomalies=tuple(anomalies),
        counts={
            "operations": len(operations),
            "keys": len(by_key),
            "reads_checked": reads_checked,
            "lost_writes": sum(a.kind == "lost-write" for a in anomalies),
            "stale_reads": sum(a.kind == "stale-read" for a in anomalies),
            "version_reuses": sum(a.kind == "version-reuse" for a in anomalies),
        },
        note="; ".join(notes),
    )


def _is_ok_read(op: Operation) -> bool:
    return op.f in _READS and op.type is OpType.OK and op.consistency != "stale"


def _applied_write(op: Operation) -> bool:
    return op.f in _WRITES and op.type is OpType.OK and op.applied is not False


def _versioned(key: Any, ops: list[Operation]) -> tuple[list[Anomaly], int, str]:
    anomalies: list[Anomaly] = []
    # Deletes that may have taken effect (acknowledged, or outcome unknown).
    deletes = [
        op
        for op in ops
        if op.f == "delete" and op.type is not OpType.FAIL and not (op.type is OpType.OK and op.applied is False)
    ]
    writes = sorted((op for op in ops if _applied_write(op) and op.version is not None), key=lambda o: o.ret)
    # A read that reports no version cannot be compared (absent reads report version 0).
    reads = sorted((op for op in ops if _is_ok_read(op) and op.version is not None), key=lambda o: o.call)
    best: Operation | None = None
    w = 0
    for read in reads:
        while w < len(writes) and writes[w].ret < read.call:  # type: ignore[operator]
            if best is None or writes[w].version > best.version:  # type: ignore[operator]
                best = writes[w]
            w += 1
        if best is None:
            continue
        seen = read.version
        if seen >= best.version:  # type: ignore[operator]
            continue
        if any(d.call < read.ret and (d.ret is None or d.ret > best.call) for d in deletes):  # type: ignore[operator]
            continue  # a delete may have come in between; versions restart
        later = _later_sighting(best, read, reads)
        if later is None:
            kind, tail = "lost-write", "and no later read of the key saw it: the write is lost"
        else:
            kind, tail = "stale-read", (f"a later read #{later.call}..#{later.ret} (process "
                                        f"{later.process}) saw version {later.version}: the write "
                                        f"survived, this read was served from old state")
        anomalies.append(
            Anomaly(
                kind=kind,
                key=key,
                text=(
                    f"key {key!r}: write of {best.value!r} acknowledged as version {best.version} "
                    f"(#{best.call}..#{best.ret}, process {best.process}) is not visible to the read "
                    f"#{read.call}..#{read.ret} (process {read.process}) that began after it: "
                    f"the read saw version {seen} ({read.result!r}), {tail}"
                ),
                operations=(best, read) if later is None else (best, read, later),
            )
        )
        if len(anomalies) >= _MAX_ANOMALIES_PER_KEY:
            break
    note = ""
    if deletes:
        note = f"key {key!r}: has deletes, version reuse not checked"
    else:
        seen_values: dict[int, tuple[Any, Operation]] = {}
        for op in ops:
            if op.version in (None, 0):
                continue
            if _applied_write(op):
                value = op.value
            elif _is_ok_read(op):
                value = op.result
            else:
                continue
            earlier = seen_values.setdefault(op.version, (value, op))  # type: ignore[arg-type]
            if earlier[0] != value:
                anomalies.append(
                    Anomaly(
                        kind="version-reuse",
                        key=key,
                        text=(
                            f"key {key!r}: version {op.version} holds {earlier[0]!r} "
                            f"(#{earlier[1].call}, process {earlier[1].process}) and {value!r} "
                            f"(#{op.call}, process {op.process})"
                        ),
                        operations=(earlier[1], op),
                    )
                )
                if len(anomalies) >= 2 * _MAX_ANOMALIES_PER_KEY:
                    break
    return anomalies, len(reads), note


def _later_sighting(write: Operation, read: Operation, reads: list[Operation]) -> Operation | None:
    """A read invoked after `read` that saw `write`'s version or a later one (the same value
    at that version), or None: then nothing after the stale read shows the write survived."""
    for other in reads:
        if other.call <= read.call or other.version is None:
            continue
        if other.version > write.version or (other.version == write.version  # type: ignore[operator]
                                              and other.result == write.value):
            return other
    return None


def unverified_keys(history: Sequence[Op] | Sequence[Operation]) -> list[Any]:
    """Keys with an acknowledged write (put or delete) after whose completion no successful
    linearizable read of the key began: the history cannot show those writes survived."""
    if history and isinstance(history[0], Op):
        operations = pair_operations(history)  # type: ignore[arg-type]
    else:
        operations = list(history)  # type: ignore[arg-type]
    last_write: dict[Any, int] = {}
    last_read: dict[Any, int] = {}
    for op in operations:
        if op.type is not OpType.OK:
            continue
        if op.f in (*_WRITES, "delete", "cas") and op.applied is not False and op.ret is not None:
            last_write[op.key] = max(last_write.get(op.key, -1), op.ret)
        elif _is_ok_read(op):
            last_read[op.key] = max(last_read.get(op.key, -1), op.call)
    return [k for k, ret in last_write.items() if last_read.get(k, -1) < ret]


def _by_value(key: Any, ops: list[Operation]) -> tuple[list[Anomaly], int, str]:
    writers: dict[Any, list[Operation]] = {}
    for op in ops:
        if op.type is OpType.FAIL:
            continue
        if op.f == "write":
            writers.setdefault(op.value, []).append(op)
        elif op.f == "cas" and isinstance(op.value, tuple) and len(op.value) == 2:
            writers.setdefault(op.value[1], []).append(op)
    acknowledged = sorted(
        (op for op in ops if op.f in ("write", "cas") and op.type is OpType.OK), key=lambda o: o.ret
    )
    reads = sorted((op for op in ops if _is_ok_read(op) and op.result is not None), key=lambda o: o.call)
    anomalies: list[Anomaly] = []
    checked = 0
    # For each read, the acknowledged write completed before it began that was invoked last.
    latest: Operation | None = None
    w = 0
    for read in reads:
        while w < len(acknowledged) and acknowledged[w].ret < read.call:  # type: ignore[operator]
            if latest is None or acknowledged[w].call > latest.call:
                latest = acknowledged[w]
            w += 1
        sources = writers.get(read.result, [])
        if latest is None or len(sources) != 1:
            continue  # nothing acknowledged before, the initial value, or a value written twice
        checked += 1
        source = sources[0]
        if source is latest or source.ret is None or source.ret >= latest.call:
            continue
        anomalies.append(
            Anomaly(
                kind="lost-write",
                key=key,
                text=(
                    f"key {key!r}: read #{read.call}..#{read.ret} (process {read.process}) returned "
                    f"{read.result!r}, written by #{source.call}..#{source.ret} (process "
                    f"{source.process}), but the acknowledged {latest.f} {latest.value!r} "
                    f"#{latest.call}..#{latest.ret} (process {latest.process}) began after that write "
                    f"completed and ended before the read began: it was lost"
                ),
                operations=(source, latest, read),
            )
        )
        if len(anomalies) >= _MAX_ANOMALIES_PER_KEY:
            break
    return anomalies, checked, ""
