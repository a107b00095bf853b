"""Replicas agree: at the end of a run every member's state machine holds what the final
linearizable reads saw, decided from the history alone (etcd's functional tester compares
members' hashes; here each member's own answers are compared, key by key).

The history's end (workloads/replicas.py): final linearizable reads (`phase: "final"`),
then reads of the same keys from each node on its own (`phase: "replica"`, `target`: the
node asked, stale consistency), each with the `applied_index` its answering node's state
was at. A correct replica at applied index B holds exactly the cluster's state at B, so:

- `replica-diverged` (invalid): a replica read at index B answered a different value or
  version than the latest final linearizable read of the key served at an index <= B,
  and no final read served past B answered what the replica did (that would be a write
  that landed after the earlier final read, which the replica saw correctly). The node
  applied something the cluster did not, or skipped something it did.

Not invalid, reported (`counts` and `lagging`): a node whose last answer of a key came from
below the final read's index (it never caught up before the harness gave up: an
availability matter, e.g. a node still catching up from a snapshot, or stopped applying),
and a node that never answered. Nodes that were not members, or were down, at the end are
not read at all (the run's results.json says which). A history without replica reads (one
written before them, or a workload without them) has nothing to check: valid, with a note.
Reads without an applied index (a system that does not tell) cannot be compared: counted.

The applied index must name one state across nodes: the store's is the Raft log index of
the last applied entry; etcd's is its store revision (docs/nemesis.md, "Replicas agree").
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from checker.result import Anomaly, Result
from histories.ops import Operation, OpType

PHASE_FINAL = "final"
PHASE_REPLICA = "replica"
_MAX_ANOMALIES = 20


def _field(op: Operation, name: str) -> Any:
    for record in (op.completion, op.invoke):
        if record is not None:
            for key, value in record.extra:
                if key == name:
                    return value
    return None


def _phase(op: Operation) -> Any:
    return dict(op.invoke.extra).get("phase")


def _answer(op: Operation) -> tuple[Any, int]:
    return op.result, op.version or 0


def _show(op: Operation) -> str:
    value, version = _answer(op)
    return "absent" if version == 0 and value is None else f"{value!r} version {version}"


def check_replicas(operations: Sequence[Operation],
                   excused: frozenset[str] = frozenset()) -> Result:
    """`excused`: nodes whose disagreement is already judged elsewhere — each reported its
    own committed log diverged after a fault that destroyed durable state
    (checker/safety_reports.py `excused_diverged_nodes`); their disagreeing answers are
    counted (`excused`) and named in the note, not anomalies."""
    started = time.perf_counter()
    finals: dict[Any, list[tuple[int, Operation]]] = {}
    replicas: list[Operation] = []
    failed: dict[str, int] = {}  # node -> replica reads it did not answer
    answered: set[str] = set()
    for op in operations:
        if op.f == "get" and op.type is not OpType.OK and _phase(op) == PHASE_REPLICA:
            target = str(_field(op, "target"))
            failed[target] = failed.get(target, 0) + 1
        if op.f != "get" or op.type is not OpType.OK:
            continue
        phase = _phase(op)
        if phase == PHASE_FINAL and op.consistency != "stale":
            index = _field(op, "applied_index")
            if isinstance(index, int):
                finals.setdefault(op.key, []).append((index, op))
        elif phase == PHASE_REPLICA:
            replicas.append(op)
            answered.add(str(_field(op, "target")))
    counts = {"replica_reads": len(replicas), "agree": 0, "behind": 0, "moved": 0,
              "unindexed": 0, "unreferenced": 0, "diverged": 0, "excused": 0}
    excused_at: dict[str, int] = {}
    anomalies: list[Anomaly] = []
    diverged_nodes: set[str] = set()
    last_behind: dict[tuple[str, Any], Operation | None] = {}  # (node, key) -> if it lags
    seen_at: dict[str, list[tuple[int, Operation]]] = {}  # node -> its reads from below
    for op in replicas:
        node = str(_field(op, "target") or op.completion.node)  # type: ignore[union-attr]
        index = _field(op, "applied_index")
        refs = finals.get(op.key, [])
        if not isinstance(index, int):
            counts["unindexed"] += 1
            continue
        at_or_below = [(i, f) for i, f in refs if i <= index]
        if not at_or_below:
            if refs and _answer(op) == _answer(min(refs, key=lambda r: r[0])[1]):
                counts["agree"] += 1  # behind, but the key had not changed since
                last_behind[(node, op.key)] = None
            else:
                counts["unreferenced" if not refs else "behind"] += 1
                last_behind[(node, op.key)] = op if refs else None
            seen_at.setdefault(node, []).append((index, op))
            continue
        ref_index, ref = max(at_or_below, key=lambda r: (r[0], r[1].call))
        if _answer(op) == _answer(ref):
            counts["agree"] += 1
            last_behind[(node, op.key)] = None
            continue
        if any(i > index and _answer(f) == _answer(op) for i, f in refs):
            counts["moved"] += 1  # the key moved after `ref`; this read saw the move
            last_behind[(node, op.key)] = None
            continue
        if node in excused:
            counts["excused"] += 1
            excused_at[node] = excused_at.get(node, 0) + 1
            continue
        counts["diverged"] += 1
        diverged_nodes.add(node)
        if len(anomalies) < _MAX_ANOMALIES:
            anomalies.append(Anomaly(
                kind="replica-diverged", key=op.key, operations=(op, ref),
                text=(f"node {node} answered {_show(op)} at applied index {index} "
                      f"[{op.call}..{op.ret}], but the final linearizable read "
                      f"[{ref.call}..{ref.ret}] (served by {ref.completion.node} at index "  # type: ignore[union-attr]
                      f"{ref_index}) saw {_show(ref)}: at or past that index the node's "
                      f"state machine must hold the same")))
    lagging = sorted({node for (node, _), op in last_behind.items() if op is not None})
    counts["lagging_keys"] = sum(op is not None for op in last_behind.values())
    counts["lagging_nodes"] = len(lagging)
    notes = []
    if not replicas and not failed:
        notes.append("no replica reads in the history (written before them, or they did "
                     "not run): nothing to compare")
    for node in lagging:
        notes.append(_lagging_note(node, seen_at.get(node, []), finals))
    silent = sorted(set(failed) - answered)
    counts["silent_nodes"] = len(silent)
    for node in silent:
        notes.append(f"node {node} answered none of its {failed[node]} replica reads (down, "
                     f"or refusing: not compared)")
    for node, n in sorted(excused_at.items()):
        notes.append(f"node {node} reported its committed log diverged after a fault that "
                     f"destroyed durable state: its {n} disagreeing answer(s) came from that "
                     f"state before its repair (the report is the evidence; not counted)")
    if counts["unindexed"]:
        notes.append(f"{counts['unindexed']} replica read(s) carry no applied index and "
                     f"were not compared")
    return Result(checker="replicas-agree", valid=not anomalies, model="replicas-agree",
                  seconds=time.perf_counter() - started, anomalies=tuple(anomalies),
                  counts={**counts, "nodes_diverged": len(diverged_nodes)},
                  note="; ".join(notes))



def _lagging_note(node: str, reads: list[tuple[int, Operation]],
                  finals: dict[Any, list[tuple[int, Operation]]]) -> str:
    """Why `node` is reported as never caught up: its indexes and how long it was read."""
    indexes = [i for i, _ in reads]
    wanted = max((i for refs in finals.values() for i, _ in refs), default=0)
    times = [op.invoke.time for _, op in reads if op.invoke.time is not None]
    span = f" over {(max(times) - min(times)) / 1e9:.1f} s" if len(times) > 1 else ""
    where = (f"stayed at applied index {indexes[0]}" if min(indexes) == max(indexes)
             else f"reached applied index {max(indexes)}")
    return (f"node {node} never caught up: its {len(reads)} reads from below the final "
            f"reads' index{span} {where}, the final reads were served up to index {wanted} "
            f"(an availability matter, not a safety violation: a node that stopped applying, "
            f"or still catching up when the harness gave up)")
