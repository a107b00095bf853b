"""The end-of-run replica reads: after the final linearizable reads, every touched key read
from each member on its own (a client given only that node, stale consistency, no
failover), so a node whose state machine diverged or stopped shows in the history.

A correct member serves a stale read from its own state machine: at applied index B it
holds exactly the cluster's state at B. So once its applied index reaches the index a
final linearizable read was served at, it must answer that read's value and version
(nothing writes after the final reads). checker/replicas.py decides that from the history
alone; this module only decides which reads to repeat, shared by the real runner
(workloads/kv.py) and the simulator's (nemesis/sim_runner.py):

- a node's key is settled once its answer equals the reference (the latest final
  linearizable read of the key);
- an answer from below the reference's index is behind: read again in the next round;
- an answer that differs at or past the reference's index is either a diverged replica
  or a write that landed after the final read (a client's retry still in flight): the
  runner takes a fresh linearizable read of the key as the new reference, and reads again.

Rounds are bounded in count (`MAX_ROUNDS`) and in time (the runner's deadline), so a node
that is down or never catches up costs a bounded wait, then is reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_ROUNDS = 12
ROUND_PAUSE_S = 0.25  # between two rounds of a node that is behind (doubling, capped)
MAX_ROUND_PAUSE_S = 2.0
NODE_TIMEOUT_S = 15.0  # how long one node is given to catch up
PHASE_FINAL = "final"  # the `phase` field of the final linearizable reads
PHASE_REPLICA = "replica"  # ... and of the replica reads (with `target`: the node asked)
PROCESS_OFFSET = 1_000  # replica reads' processes: the final reads' + this + node number


@dataclass(frozen=True)
class Answer:
    """One read's answer: the value (None: absent), the version (0: absent) and the
    answering node's applied index when it read (None: the system does not tell)."""

    value: str | None
    version: int
    applied_index: int | None

    def same_state(self, other: Answer) -> bool:
        return self.value == other.value and self.version == other.version


@dataclass
class NodeProgress:
    node: str
    pending: list[str]
    rounds: int = 0
    reads: int = 0
    failed: int = 0
    behind: dict[str, str] = field(default_factory=dict)  # key -> last answer, described
    differs: dict[str, str] = field(default_factory=dict)
    last_error: str = ""


class ReplicaRounds:
    """Which key to read next from which node, and what the answers mean so far."""

    def __init__(self, keys: list[str], references: dict[str, Answer]) -> None:
        self.keys = [k for k in keys if k in references]
        self.unreferenced = [k for k in keys if k not in references]  # final read failed
        self.references = dict(references)
        self.nodes: dict[str, NodeProgress] = {}
        self.skipped: dict[str, str] = {}  # node -> why it was not read

    def skip(self, node: str, why: str) -> None:
        self.skipped[node] = why

    def start(self, node: str) -> NodeProgress:
        progress = self.nodes[node] = NodeProgress(node, list(self.keys))
        return progress

    def refresh(self, key: str, answer: Answer) -> None:
        """A fresh linearizable read of `key`: the reference from now on."""
        self.references[key] = answer

    def judge(self, node: str, key: str, answer: Answer) -> str:
        """"agrees" (settled), "behind" (read it again) or "differs" (differs at or past
        the reference's index: take a fresh reference, then read it again)."""
        progress = self.nodes[node]
        progress.reads += 1
        ref = self.references[key]
        if answer.same_state(ref):
            progress.pending.remove(key)
            progress.behind.pop(key, None)
            progress.differs.pop(key, None)
            return "agrees"
        text = f"{answer.value!r} v{answer.version} at index {answer.applied_index}"
        if (answer.applied_index is not None and ref.applied_index is not None
                and answer.applied_index < ref.applied_index):
            progress.behind[key] = text
            return "behind"
        progress.differs[key] = text
        return "differs"

    def summary(self) -> dict[str, Any]:
        nodes = {}
        for node, p in self.nodes.items():
            nodes[node] = {"agree": len(self.keys) - len(p.pending), "keys": len(self.keys),
                           "rounds": p.rounds, "reads": p.reads, "failed_reads": p.failed,
                           "behind": dict(p.behind), "differs": dict(p.differs),
                           "unanswered": [k for k in p.pending
                                          if k not in p.behind and k not in p.differs]}
            if p.last_error and nodes[node]["unanswered"]:
                nodes[node]["last_error"] = p.last_error
        return {"keys": len(self.keys), "unreferenced_keys": self.unreferenced,
                "nodes": nodes, "skipped": dict(self.skipped)}

    def line(self, node: str) -> str:
        """One progress line for `node`, after its rounds."""
        p = self.nodes[node]
        agree = len(self.keys) - len(p.pending)
        head = f"replica reads: {node}: {agree}/{len(self.keys)} keys agree"
        if not p.pending:
            return f"{head} ({p.rounds} round{'s' if p.rounds != 1 else ''})"
        parts = []
        if p.differs:
            parts.append(f"{len(p.differs)} differ at or past the final read's index "
                         f"({_first(p.differs)})")
        if p.behind:
            parts.append(f"{len(p.behind)} still behind ({_first(p.behind)})")
        silent = len(p.pending) - len(p.differs) - len(p.behind)
        if silent:
            parts.append(f"{silent} unanswered ({p.last_error or 'no answer'})")
        return f"{head} after {p.rounds} rounds; " + "; ".join(parts)


def _first(found: dict[str, str]) -> str:
    key, text = next(iter(found.items()))
    return f"{key}: {text}"


def round_pause(rounds: int) -> float:
    return min(ROUND_PAUSE_S * 2 ** max(0, rounds - 1), MAX_ROUND_PAUSE_S)
