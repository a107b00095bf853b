"""Raft's safety properties, checked continuously while the simulator runs.

What it is for: the simulator's node shells report to a `SafetyMonitor` every entry they
persist, every entry they apply, every snapshot they take or install, and the core's
role/term/commit after every input. The monitor keeps, over all time and all nodes:

- election safety (Raft Figure 3): at most one leader per term;
- log matching: two logs with an entry of the same (index, term) hold the same entries up
  to it. Checked in O(1) per entry with a hash chain: each node's entry at index i carries
  H(chain at i-1, term, kind, data); every (index, term) must map to one chain value;
- leader completeness: a leader's log holds every entry committed in earlier terms
  (its chain at the highest committed index equals the committed chain);
- state-machine safety: no two nodes apply different entries at one index, and two
  nodes' state machines agree wherever both snapshot or restore at the same index;
- snapshot integrity: every snapshot's (index, term) — taken, installed or restored — names
  the entry committed at that index (checked when it commits, if it has not yet);
- a live node's commit index never decreases, and never passes its last log index;
- a leader's commit index only moves to an entry of its own term (Figure 8, §5.4.2);
- no acknowledged write is lost: an entry acknowledged to a client stays the entry at
  its index forever;
- PreVote (Raft thesis §9.6): with pre_vote on, a node only starts a real election
  (raising its term) after a majority granted its pre-vote for that term, or when told
  to by TIMEOUT_NOW.

What it must never do: influence the run. It only reads what it is told and records
`Violation`s; the simulator decides what to do with them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from system.raft.messages import Message, MessageType
from system.raft.types import Entry, NodeId, SnapshotMeta


class Rule(Enum):
    ELECTION_SAFETY = "election safety"
    LOG_MATCHING = "log matching"
    LEADER_COMPLETENESS = "leader completeness"
    STATE_MACHINE_SAFETY = "state-machine safety"
    COMMIT_MONOTONIC = "commit index monotonic"
    COMMIT_BY_CURRENT_TERM = "a leader commits by counting only entries of its term"
    ACKNOWLEDGED_WRITE_LOST = "acknowledged write lost"
    EXACTLY_ONCE = "applied exactly once"
    PRE_VOTE = "pre-vote before raising the term"
    SNAPSHOT = "snapshot integrity"
    STORAGE = "durable log matches the core"
    LINEARIZABILITY = "linearizability"
    LIVENESS = "liveness after healing"
    NO_EXCEPTION = "no node raises"  # an assertion or error escaping a core or shell


@dataclass(frozen=True, slots=True)
class Violation:
    rule: Rule
    step: int  # the simulator step at which it was detected
    detail: str  # what was seen, in words a person can act on

    def line(self) -> str:
        return f"[step {self.step}] {self.rule.value}: {self.detail}"


_ROOT = b"\x00" * 16


def chain_hash(previous: bytes, entry: Entry) -> bytes:
    hasher = hashlib.blake2b(previous, digest_size=16)
    hasher.update(entry.term.to_bytes(8, "little"))
    hasher.update(entry.kind.value.encode())
    hasher.update(entry.data)
    return hasher.digest()


class _NodeLog:
    """The monitor's mirror of one node's durable log: index -> (term, chain)."""

    __slots__ = ("snapshot_index", "snapshot_term", "terms", "chains", "last_index")

    def __init__(self) -> None:
        self.snapshot_index = 0
        self.snapshot_term = 0
        self.terms: dict[int, int] = {0: 0}
        self.chains: dict[int, bytes] = {0: _ROOT}
        self.last_index = 0


class SafetyMonitor:
    """Collects violations of Raft's safety properties across a whole simulated run."""

    def __init__(self, voters: tuple[NodeId, ...], pre_vote: bool) -> None:
        self.voters = voters
        self.quorum = len(voters) // 2 + 1
        self.pre_vote = pre_vote
        self.step = 0  # set by the simulator before each step
        self.violations: list[Violation] = []
        self._seen_rules: set[tuple[Rule, str]] = set()
        self.leaders_by_term: dict[int, NodeId] = {}
        self.entry_chain: dict[tuple[int, int], bytes] = {}  # (index, term) -> chain
        self.committed_chain: dict[int, bytes] = {}  # index -> chain of the committed prefix
        self.committed_term: dict[int, int] = {}
        self.max_committed = 0
        self.applied: dict[int, tuple[int, bytes]] = {}  # index -> (term, entry digest)
        self.state_digest_at: dict[int, str] = {}  # applied index -> state-machine digest
        self.acknowledged: dict[int, tuple[int, str]] = {}  # index -> (term, request id)
        # Every snapshot's (index, term), by index, until the entry at that index commits:
        # a snapshot is of committed state, so its term must be the committed entry's.
        self._snapshot_terms: dict[int, dict[int, NodeId]] = {}
        self._logs: dict[NodeId, _NodeLog] = {n: _NodeLog() for n in voters}
        self._commit: dict[NodeId, int] = {}
        # Per node, the highest committed index whose entry the monitor has compared with
        # the committed chain (see `_observe_commit`).
        self._checked: dict[NodeId, int] = {}
        self._role_term: dict[NodeId, tuple[str, int]] = {}
        self._pre_vote_grants: dict[NodeId, dict[int, set[NodeId]]] = {n: {} for n in voters}
        self._told_to_campaign: dict[NodeId, bool] = {n: False for n in voters}
        # The voters a node's membership counts when it campaigns (membership changes);
        # the simulator replaces it. Default: the fixed voter set.
        self.voters_of: Callable[[NodeId], tuple[NodeId, ...]] = lambda node: self.voters

    # -- recording ---------------------------------------------------------------------

    def violate(self, rule: Rule, detail: str) -> None:
        # One report per (rule, detail): a broken invariant tends to repeat every step.
        if (rule, detail) in self._seen_rules:
            return
        self._seen_rules.add((rule, detail))
        self.violations.append(Violation(rule, self.step, detail))

    @property
    def ok(self) -> bool:
        return not self.violations

    # -- what the shells report --------------------------------------------------------

    def node_started(
        self, node: NodeId, snapshot: SnapshotMeta | None, entries: tuple[Entry, ...]
    ) -> None:
        """A node (re)started from durable state: rebuild its mirror from that state."""
        log = _NodeLog()
        self._logs[node] = log
        if snapshot is not None:
            self._install_snapshot_mirror(node, log, snapshot)
        self._append(node, log, entries)
        self._commit.pop(node, None)  # a restarted node may come back with a lower commit
        self._checked.pop(node, None)
        self._role_term.pop(node, None)
        self._told_to_campaign[node] = False

    def node_crashed(self, node: NodeId) -> None:
        self._commit.pop(node, None)
        self._checked.pop(node, None)
        self._role_term.pop(node, None)

    def persisted_entries(self, node: NodeId, entries: tuple[Entry, ...]) -> None:
        self._append(node, self._logs[node], entries)

    def persisted_snapshot(self, node: NodeId, snapshot: SnapshotMeta) -> None:
        """A snapshot received from the leader replaced the whole log."""
        log = self._logs[node]
        for index in [i for i in log.terms if i > snapshot.index]:
            del log.terms[index], log.chains[index]
        log.last_index = snapshot.index
        self._install_snapshot_mirror(node, log, snapshot)

    def compacted(self, node: NodeId, index: int, state_digest: str) -> None:
        log = self._logs[node]
        log.snapshot_index = index
        log.snapshot_term = log.terms.get(index, 0)
        self._check_snapshot_term(node, index, log.snapshot_term)
        self._check_state(node, index, state_digest, "compacted its state machine")

    def restored_state(self, node: NodeId, index: int, state_digest: str) -> None:
        self._check_state(node, index, state_digest, "restored its state machine from a snapshot")

    def applied_entry(self, node: NodeId, entry: Entry, state_digest: str | None) -> None:
        digest = hashlib.blake2b(entry.kind.value.encode() + entry.data, digest_size=16).digest()
        seen = self.applied.get(entry.index)
        if seen is None:
            self.applied[entry.index] = (entry.term, digest)
        elif seen != (entry.term, digest):
            self.violate(
                Rule.STATE_MACHINE_SAFETY,
                f"{node} applied entry (index={entry.index}, term={entry.term}) but another "
                f"node applied (index={entry.index}, term={seen[0]}) with different content",
            )
        acked = self.acknowledged.get(entry.index)
        if acked is not None and acked[0] != entry.term:
            self.violate(
                Rule.ACKNOWLEDGED_WRITE_LOST,
                f"write {acked[1]!r} was acknowledged as entry (index={entry.index}, "
                f"term={acked[0]}) but {node} applied term {entry.term} at that index",
            )
        log = self._logs[node]
        if entry.index > log.snapshot_index and log.terms.get(entry.index) != entry.term:
            self.violate(
                Rule.STATE_MACHINE_SAFETY,
                f"{node} applied (index={entry.index}, term={entry.term}) which is not the "
                f"entry in its own durable log (term {log.terms.get(entry.index)})",
            )
        if state_digest is not None:
            self._check_state(node, entry.index, state_digest, "applied up to")

    def needs_state_digest(self, index: int) -> bool:
        """Whether the shell should compute its state digest after applying `index`."""
        return index in self.state_digest_at

    def acknowledged_write(self, index: int, term: int, request_id: str) -> None:
        self.acknowledged[index] = (term, request_id)
        seen = self.applied.get(index)
        if seen is not None and seen[0] != term:
            self.violate(
                Rule.ACKNOWLEDGED_WRITE_LOST,
                f"write {request_id!r} acknowledged as (index={index}, term={term}) but "
                f"term {seen[0]} was applied at that index",
            )

    def delivered(self, message: Message) -> None:
        if message.type is MessageType.PRE_VOTE_RESPONSE and not message.reject:
            grants = self._pre_vote_grants[message.dst].setdefault(message.term, set())
            grants.add(message.src)
        elif message.type is MessageType.TIMEOUT_NOW:
            self._told_to_campaign[message.dst] = True

    def observe(self, node: NodeId, role: str, term: int, commit: int, last_index: int,
                term_of: Callable[[int], int | None] | None = None) -> None:
        """The core's role, term and commit index right after an input was handled, and
        how to read the term of an entry in its log (None: its written log is its log)."""
        previous = self._role_term.get(node)
        self._role_term[node] = (role, term)
        if role == "leader":
            holder = self.leaders_by_term.setdefault(term, node)
            if holder != node:
                self.violate(
                    Rule.ELECTION_SAFETY, f"two leaders in term {term}: {holder} and {node}"
                )
            if previous != (role, term):
                self._check_leader_log(node, term)
        if role == "candidate" and previous != (role, term):
            self._check_pre_vote(node, term)
        if previous == ("leader", term) and commit > self._commit.get(node, commit):
            # Raft §5.4.2 (Figure 8): a leader's commit index only moves by counting
            # replicas of an entry of its own term; older entries are committed with it.
            log_term = self._logs[node].terms.get(commit)
            if log_term != term:
                self.violate(
                    Rule.COMMIT_BY_CURRENT_TERM,
                    f"{node}, leader of term {term}, advanced its commit index to {commit}, "
                    f"an entry of term {log_term}",
                )
        self._observe_commit(node, commit, last_index, term_of)

    # -- checks --------------------------------------------------------------------------

    def _append(self, node: NodeId, log: _NodeLog, entries: tuple[Entry, ...]) -> None:
        if not entries:
            return
        first = entries[0].index
        if first <= log.last_index:
            for index in range(first, log.last_index + 1):
                log.terms.pop(index, None)
                log.chains.pop(index, None)
            log.last_index = first - 1
        if first != log.last_index + 1:
            self.violate(
                Rule.STORAGE,
                f"{node} was told to persist entries from {first} after its last index "
                f"{log.last_index}: a gap in its log",
            )
            return
        previous = log.chains.get(first - 1)
        if previous is None:  # below the snapshot base we cannot chain; start afresh
            previous = _ROOT
        for entry in entries:
            if entry.index != log.last_index + 1:
                self.violate(Rule.STORAGE, f"{node} persisted non-consecutive entries {entries}")
                return
            chain = chain_hash(previous, entry)
            known = self.entry_chain.setdefault((entry.index, entry.term), chain)
            if known != chain:
                self.violate(
                    Rule.LOG_MATCHING,
                    f"{node} holds entry (index={entry.index}, term={entry.term}) but its log "
                    f"up to that entry differs from another node's with the same entry",
                )
            log.terms[entry.index] = entry.term
            log.chains[entry.index] = chain
            log.last_index = entry.index
            previous = chain

    def _install_snapshot_mirror(self, node: NodeId, log: _NodeLog, snap: SnapshotMeta) -> None:
        for index in [i for i in log.terms if i < snap.index]:
            del log.terms[index], log.chains[index]
        chain = self.entry_chain.get((snap.index, snap.term))
        committed = self.committed_chain.get(snap.index)
        if committed is not None and chain is not None and committed != chain:
            self.violate(
                Rule.SNAPSHOT,
                f"{node} holds a snapshot at (index={snap.index}, term={snap.term}) that "
                "is not the committed entry at that index",
            )
        self._check_snapshot_term(node, snap.index, snap.term)
        log.snapshot_index, log.snapshot_term = snap.index, snap.term
        log.terms[snap.index] = snap.term
        log.chains[snap.index] = chain if chain is not None else _ROOT
        log.last_index = max(log.last_index, snap.index)

    def _check_snapshot_term(self, node: NodeId, index: int, term: int) -> None:
        """A snapshot's (index, term) against the committed log: now if that index has
        committed, else when it does (a snapshot is taken of applied, so committed, state;
        the metadata is not taken on trust just because no known entry matches it)."""
        committed = self.committed_term.get(index)
        if committed is None:
            self._snapshot_terms.setdefault(index, {}).setdefault(term, node)
        elif committed != term:
            self._snapshot_term_violation(node, index, term, committed)

    def _snapshot_term_violation(self, node: NodeId, index: int, term: int,
                                 committed: int) -> None:
        self.violate(
            Rule.SNAPSHOT,
            f"{node} holds a snapshot at (index={index}, term={term}) but the entry committed "
            f"at index {index} has term {committed}",
        )

    def _check_state(self, node: NodeId, index: int, digest: str, what: str) -> None:
        known = self.state_digest_at.setdefault(index, digest)
        if known != digest:
            self.violate(
                Rule.STATE_MACHINE_SAFETY,
                f"{node} {what} index {index} with a state that differs from another node's "
                "state at the same index",
            )

    def _observe_commit(self, node: NodeId, commit: int, last_index: int,
                        term_of: Callable[[int], int | None] | None) -> None:
        previous = self._commit.get(node)
        if previous is not None and commit < previous:
            self.violate(
                Rule.COMMIT_MONOTONIC, f"{node}'s commit index went from {previous} to {commit}"
            )
        self._commit[node] = commit
        if commit > last_index:
            self.violate(
                Rule.COMMIT_MONOTONIC,
                f"{node}'s commit index {commit} is past its last log index {last_index}",
            )
        # A follower may learn that an entry is committed while the entry that replaced an
        # older one at that index in its core is still waiting to be written (a pipelined
        # shell takes one Ready at a time): where the written log still holds another term
        # than the core's, the comparison waits until it is written.
        checked = self._checked.get(node, 0)
        log = self._logs[node]
        for index in range(checked + 1, commit + 1):
            if term_of is not None:
                ours = term_of(index)
                if ours is not None and index in log.terms and log.terms[index] != ours:
                    break
            chain = log.chains.get(index)
            if chain is None or chain == _ROOT:
                if index <= log.snapshot_index:
                    checked = index
                    continue  # compacted away before we saw it; the snapshot covers it
                break  # the core committed beyond what it persisted; the check above fires
            known = self.committed_chain.setdefault(index, chain)
            if known != chain:
                self.violate(
                    Rule.STATE_MACHINE_SAFETY,
                    f"{node} committed index {index} (term {log.terms.get(index)}) but a "
                    f"different entry (term {self.committed_term.get(index)}) was committed "
                    "there before: a committed entry was lost",
                )
            committed_term = self.committed_term.setdefault(index, log.terms[index])
            self.max_committed = max(self.max_committed, index)
            for term, holder in sorted(self._snapshot_terms.pop(index, {}).items()):
                if term != committed_term:
                    self._snapshot_term_violation(holder, index, term, committed_term)
            checked = index
        self._checked[node] = checked

    def _check_leader_log(self, node: NodeId, term: int) -> None:
        """Leader completeness (Raft §5.4): a new leader holds every committed entry."""
        top = self.max_committed
        if top == 0:
            return
        log = self._logs[node]
        if top <= log.snapshot_index:
            return  # covered by the snapshot; snapshot integrity is checked separately
        if log.chains.get(top) != self.committed_chain.get(top):
            self.violate(
                Rule.LEADER_COMPLETENESS,
                f"{node} became leader of term {term} without committed entry "
                f"(index={top}, term={self.committed_term.get(top)}) in its log "
                f"(it has term {log.terms.get(top)} there, last index {log.last_index})",
            )

    def _check_pre_vote(self, node: NodeId, term: int) -> None:
        if not self.pre_vote:
            return
        if self._told_to_campaign[node]:
            self._told_to_campaign[node] = False
            return
        voters = self.voters_of(node)
        quorum = len(voters) // 2 + 1
        grants = (self._pre_vote_grants[node].get(term, set()) | {node}) & set(voters)
        if len(grants) < quorum:
            self.violate(
                Rule.PRE_VOTE,
                f"{node} started an election for term {term} with pre-votes only from "
                f"{sorted(grants)} (needs {quorum} of {len(voters)})",
            )
