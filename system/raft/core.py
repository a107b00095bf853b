"""The Raft consensus algorithm for one node, as a deterministic sans-I/O state machine.

Theory of operation
-------------------
A `RaftCore` moves only when called, and never does anything on its own:

- `tick()`: one unit of logical time passed. Followers and candidates count ticks towards
  an election timeout randomized in [T, 2T) with the injected `random.Random`; leaders
  count ticks towards heartbeats and towards the CheckQuorum / leader-transfer deadline.
- `step(message)`: a message from a peer arrived.
- `propose(data)` / `read_index(context)`: a client wants a write / a linearizable read.
- `transfer_leadership(target)`, `compact(index, data)`: operator and shell requests.

Everything the node must do in response accumulates inside it and is taken out as one
`Ready` value (cf. etcd-io/raft's RawNode). The shell carries a Ready out IN ORDER:
persist hard state, entries and any received snapshot (fsync if `must_sync`); then send
the messages; then restore a received snapshot and apply committed entries; then answer
reads; then call `advance(ready)`. Because every message leaves in the same Ready as
the state it depends on, and messages are sent only after that state is durable, a vote
or an append acknowledgement is never sent before what it promises is on disk
(Raft Figure 2, "respond after persisting").

The rules, each in its own overridable method so a test can break exactly one by
subclassing (the name says which rule and where it comes from):

- elections: `campaign`, `may_grant_vote` and `record_vote` (one vote per term, §5.2),
  `log_is_up_to_date` (§5.4.1), `heard_from_leader_recently` (a PreVote is refused while
  a leader is alive, thesis §9.6), `in_leader_lease` (with CheckQuorum, higher-term
  (pre)votes are ignored while a leader is alive, thesis §4.2.3);
- leadership: `maybe_step_down_without_quorum` (CheckQuorum, thesis §6.2);
- commitment: `quorum_match_index` and `may_commit_at` (only entries of the current
  term are committed by counting replicas: Raft §5.4.2, Figure 8); the leader appends a
  NOOP at the start of its term so that earlier entries get committed promptly (§8);
  `entries_to_apply` hands out committed entries only;
- replication: `maybe_send_append`, batching (max_append_entries / max_append_bytes),
  pipelining (max_inflight_appends per follower, see progress.py), fast back-tracking with
  reject_hint / reject_term (etcd's findConflictByTerm);
- snapshots: `compact` drops the log prefix; `send_snapshot` streams the snapshot in
  chunks of `snapshot_chunk_bytes` to a follower whose next entry was compacted away;
- ReadIndex (thesis §6.4): `read_barrier_open` (the leader has committed an entry of
  its own term) and `read_round_confirmed` (a majority acknowledged a heartbeat round
  started after the read); the reads and rounds themselves are kept in read_only.py;
- leader transfer (thesis §3.10): catch the target up, send TIMEOUT_NOW, refuse
  proposals meanwhile, give up after an election timeout.

Proposals are appended to the leader's log at once but sent to followers when the next
Ready is taken, so every proposal made between two Readies travels in one APPEND per
follower: batching falls out of the Ready cycle.

Local invariants (commit never decreases, applied <= commit, a leader holds its own vote,
...) are asserted after every input by `check_invariants`.

- membership (thesis §4.1): `change_membership` appends a CONFIG entry (one server
  added as a learner, promoted or removed; `membership_change_problem` allows one change
  at a time, after an entry of the leader's term is committed); a membership takes effect
  when appended (`configuration_in_effect`); majorities count voters only;
- lost durable state: `verify_follower_match` / `follower_log_went_backwards` (a follower
  whose log went backwards is caught up again) and `lost_entries_forbid_vote` (it does not
  vote until it has); `committed_entry_conflict` / `committed_log_diverged` (a follower
  whose COMMITTED log conflicts with the leader's refuses instead of answering as a
  match, and votes no more) and `follower_log_diverged` / `maybe_send_repair_snapshot`
  (the leader reports it, then replaces its log and state with a snapshot).
This module must never do I/O, read a clock or use global randomness.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum

from system.raft.log import RaftLog
from system.raft.messages import Message, MessageType
from system.raft.progress import Progress, ProgressState
from system.raft.read_only import ReadIndexQueue, ReadState, decode_round
from system.raft.types import (
    Entry,
    EntryKind,
    HardState,
    Membership,
    NodeId,
    PersistentState,
    SnapshotMeta,
)

# VOTE.context of a campaign started by TIMEOUT_NOW: voters must not ignore it on account
# of their leader lease, since the leader itself asked for it (thesis §3.10).
TRANSFER_CONTEXT = b"leader-transfer"

# APPEND.context to a follower that lost entries it had acknowledged: b"catch-up:" + the
# 8-byte big-endian index it must reach again before it may vote (docs/raft.md).
CATCH_UP_PREFIX = b"catch-up:"


def encode_catch_up(index: int) -> bytes:
    return CATCH_UP_PREFIX + index.to_bytes(8, "big")


# APPEND.context of a probe at the index a follower had acknowledged, sent when its
# rejection suggests it lost entries (a rejection can also be a stale duplicate): the
# follower echoes it in its APPEND_RESPONSE, so only a FRESH rejection confirms the loss.
VERIFY_PREFIX = b"verify:"


def encode_verify(nonce: int) -> bytes:
    return VERIFY_PREFIX + nonce.to_bytes(8, "big")


# APPEND_RESPONSE.context of a follower whose COMMITTED log conflicts with the leader's
# (docs/raft.md, "A follower whose committed log diverged"): b"diverged:" + the 8-byte
# index where the two logs were found to differ + the follower's 8-byte commit index.
DIVERGED_PREFIX = b"diverged:"


def encode_diverged(at: int, commit: int) -> bytes:
    return DIVERGED_PREFIX + at.to_bytes(8, "big") + commit.to_bytes(8, "big")


def decode_diverged(context: bytes) -> tuple[int, int] | None:
    """(index where the logs differ, the follower's commit index), or None."""
    if len(context) == len(DIVERGED_PREFIX) + 16 and context.startswith(DIVERGED_PREFIX):
        body = context[len(DIVERGED_PREFIX) :]
        return int.from_bytes(body[:8], "big"), int.from_bytes(body[8:], "big")
    return None


def decode_catch_up(context: bytes) -> int:
    """The catch-up index an APPEND's context carries; 0 if it carries none."""
    if len(context) == len(CATCH_UP_PREFIX) + 8 and context.startswith(CATCH_UP_PREFIX):
        return int.from_bytes(context[len(CATCH_UP_PREFIX) :], "big")
    return 0

_MT = MessageType  # short local alias for the dispatch tables below


# ---------------------------------------------------------------------------------------
# Public records
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RaftConfig:
    """Static configuration of one node. Validated on construction (ValueError)."""

    node_id: NodeId
    # The bootstrap membership: used until the log (or a snapshot) holds a CONFIG entry,
    # which then wins. node_id is among voters or learners (a node joining an existing
    # cluster starts as a learner of it).
    voters: tuple[NodeId, ...]
    election_timeout_ticks: int = 10  # T: each election timeout is drawn from [T, 2T)
    heartbeat_interval_ticks: int = 1  # leader heartbeat period; < election_timeout_ticks
    pre_vote: bool = True  # run a PreVote round before bumping the term (thesis §9.6)
    check_quorum: bool = True  # leader steps down without a majority's contact (thesis §6.2)
    max_append_entries: int = 1024  # at most this many entries per APPEND; >= 1
    max_append_bytes: int = 1 << 20  # at most this many payload bytes per APPEND (>= 1 entry)
    max_inflight_appends: int = 32  # unacknowledged APPENDs per follower in REPLICATE state
    snapshot_chunk_bytes: int = 64 * 1024  # payload bytes per InstallSnapshot chunk
    learners: tuple[NodeId, ...] = ()  # bootstrap learners (non-voting members)
    # On (etcd): a leader sends an empty APPEND carrying a new commit index to every
    # follower that has all the entries as soon as the index moves. Off (hashicorp/raft's
    # CommitTimeout): the next APPEND or heartbeat carries it, at most
    # heartbeat_interval_ticks later. Either way nothing is committed or acknowledged
    # differently (the leader alone decides commitment and answers clients); off, a write
    # at low load costs one round of messages instead of two, and followers apply it up
    # to one heartbeat later (their stale reads are that much staler).
    eager_commit: bool = True

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError("invalid RaftConfig: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Every reason this configuration is unusable, written for the operator."""
        problems: list[str] = []
        if not isinstance(self.node_id, str) or not self.node_id:
            problems.append(f"node_id must be a non-empty string, got {self.node_id!r}")
        if not isinstance(self.voters, tuple) or not self.voters:
            problems.append(f"voters must be a non-empty tuple of node ids, got {self.voters!r}")
        else:
            if any(not isinstance(v, str) or not v for v in self.voters):
                problems.append(f"every voter must be a non-empty string, got {self.voters!r}")
            if len(set(self.voters)) != len(self.voters):
                problems.append(f"voters contains duplicates: {self.voters!r}")
            learners = self.learners if isinstance(self.learners, tuple) else ()
            if not isinstance(self.learners, tuple) or any(
                not isinstance(v, str) or not v for v in self.learners
            ):
                problems.append(f"learners must be a tuple of node ids, got {self.learners!r}")
            elif set(self.learners) & set(self.voters):
                problems.append(
                    f"{sorted(set(self.learners) & set(self.voters))} listed as both voter "
                    "and learner")
            if self.node_id not in self.voters and self.node_id not in learners:
                problems.append(f"node_id {self.node_id!r} is not among voters {self.voters!r}")
        for name in (
            "election_timeout_ticks",
            "heartbeat_interval_ticks",
            "max_append_entries",
            "max_append_bytes",
            "max_inflight_appends",
            "snapshot_chunk_bytes",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append(f"{name} must be a positive integer, got {value!r}")
        if (
            isinstance(self.election_timeout_ticks, int)
            and isinstance(self.heartbeat_interval_ticks, int)
            and self.heartbeat_interval_ticks >= self.election_timeout_ticks
        ):
            problems.append(
                f"heartbeat_interval_ticks ({self.heartbeat_interval_ticks}) must be smaller "
                f"than election_timeout_ticks ({self.election_timeout_ticks}), or followers "
                "time out between heartbeats"
            )
        for name in ("pre_vote", "check_quorum", "eager_commit"):
            if not isinstance(getattr(self, name), bool):
                problems.append(f"{name} must be a bool, got {getattr(self, name)!r}")
        return problems


class Role(Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre-candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


class CampaignKind(Enum):
    PRE_ELECTION = "pre-election"  # PreVote round at term+1; our term does not change
    ELECTION = "election"  # a real election: term+1, vote for ourselves
    TRANSFER = "transfer"  # TIMEOUT_NOW: an election voters join despite their lease


class NotLeader(Exception):  # noqa: N818 -- name fixed by the contract
    """This node cannot serve the request because it is not the leader."""

    def __init__(self, leader_id: NodeId | None, message: str = "") -> None:
        self.leader_id = leader_id  # the leader this node knows of, if any: retry there
        super().__init__(message or f"not the leader; current leader is {leader_id or 'unknown'}")


class ProposalDropped(Exception):  # noqa: N818 -- name fixed by the contract
    """The leader refused the proposal (e.g. a leader transfer is in progress); retry."""


@dataclass(frozen=True)
class Ready:
    """What the shell must do, in field order; see the module docstring."""

    hard_state: HardState | None = None  # persist if not None (None = unchanged)
    entries: tuple[Entry, ...] = ()  # append durably, first dropping stored entries >= [0].index
    # A snapshot received from the leader: persist it with `snapshot_data`. It is only
    # emitted when our log does NOT hold the snapshot's last entry, so every stored entry
    # is either covered by it or from a divergent history: drop them all (as etcd's
    # MemoryStorage.ApplySnapshot does); `entries` of the same Ready follow the snapshot.
    snapshot: SnapshotMeta | None = None
    snapshot_data: bytes = b""
    must_sync: bool = False  # fsync the above before sending `messages_after_persist`
    # Every message of this Ready, in the order the core produced them. A shell may send
    # them all after the above is durable (always correct), or split them:
    messages: tuple[Message, ...] = ()
    # ... the subset that depends on nothing this Ready persists: a leader's APPEND,
    # HEARTBEAT and SNAPSHOT at a term already durable. They may be sent BEFORE (or while)
    # this Ready is persisted (Raft thesis §10.2.1: the leader writes its log in parallel
    # with replicating it; the core counts the leader's own copy only up to the index it
    # has seen durable in `advance`, see `durable_index`) ...
    messages_before_persist: tuple[Message, ...] = ()
    # ... and the rest (votes, vote and append responses, anything else): strictly after.
    messages_after_persist: tuple[Message, ...] = ()
    committed_entries: tuple[Entry, ...] = ()  # apply in order (after restoring `snapshot`)
    read_states: tuple[ReadState, ...] = ()  # serve once applied >= index
    dropped_reads: tuple[bytes, ...] = ()  # answer "not leader" to these read contexts
    # Things an operator must hear about (the shell logs each as a WARNING), e.g. a
    # follower whose log went backwards.
    warnings: tuple[str, ...] = ()
    # Things that are wrong and will not mend themselves (the shell logs each as an
    # ERROR), e.g. a follower whose committed log diverged from the leader's.
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class Status:
    """A read-only view of a node for operators, tests and invariant checks."""

    node_id: NodeId
    role: Role
    term: int
    leader_id: NodeId | None
    commit_index: int
    applied_index: int
    last_index: int
    snapshot_index: int
    voters: tuple[NodeId, ...] = ()  # the membership in effect on this node
    learners: tuple[NodeId, ...] = ()


class MembershipChangeKind(Enum):
    """One server at a time (thesis §4.1): any two majorities of the old and the new
    membership overlap, so no two leaders can be elected across a change."""

    ADD_LEARNER = "add-learner"  # a new, non-voting member that receives the log
    PROMOTE = "promote"  # a caught-up learner becomes a voter
    REMOVE = "remove"  # a voter or a learner leaves


class MembershipChangeRefused(ValueError):
    """The leader will not append this membership change now; the message says why and
    what to do (wait for the change in progress, catch the learner up, ...)."""


# ---------------------------------------------------------------------------------------
# The state machine
# ---------------------------------------------------------------------------------------


class RaftCore:
    """One Raft node. Not thread-safe; driven by one caller."""

    def __init__(
        self,
        config: RaftConfig,
        rng: random.Random,
        restored: PersistentState | None = None,
    ) -> None:
        if not isinstance(config, RaftConfig):
            raise TypeError(f"config must be a RaftConfig, got {type(config).__name__}")
        if not isinstance(rng, random.Random):
            raise TypeError(
                f"rng must be a random.Random (injected, seeded), got {type(rng).__name__}"
            )
        self.config = config
        self.id: NodeId = config.node_id
        self.rng = rng
        self._bootstrap = Membership(config.voters, config.learners)
        # The membership in effect (derived from `configuration_in_effect()`): every other
        # member (replication targets, learners included), the voters, the majority size.
        self.membership: Membership = self._bootstrap
        self.peers: tuple[NodeId, ...] = ()
        self._voter_peers: tuple[NodeId, ...] = ()
        self._voter_set: frozenset[NodeId] = frozenset()
        self.quorum: int = 1
        # The latest membership in our log (its CONFIG entry at _config_index; 0 = from the
        # snapshot or the bootstrap configuration). Thesis §4.1: it takes effect at once.
        self._latest_membership: Membership = self._bootstrap
        self._config_index: int = 0

        hard = restored.hard_state if restored else HardState()
        snapshot = restored.snapshot if restored else None
        if snapshot is not None and snapshot.index == 0:
            snapshot = None
        self._term: int = hard.term  # current term; never decreases
        self._vote: NodeId | None = hard.vote  # whom we voted for in _term; set at most once
        # We lost entries we had acknowledged (a leader told us); no vote until our commit
        # index reaches this again. 0 = nothing lost. Durable (HardState.catch_up_to).
        self._catch_up_to: int = hard.catch_up_to
        # Set by the shell (`withhold_vote`): why this node may not vote or campaign now
        # (e.g. its data directory is new while the cluster knows it as a voter). "" = may.
        self._vote_withheld: str = ""
        stored = restored.entries if restored else ()
        if snapshot is not None and stored and stored[0].index <= snapshot.index:
            # Entries the snapshot covers are redundant (a shell may keep them): skip.
            stored = tuple(e for e in stored if e.index > snapshot.index)
        self.log = RaftLog(snapshot, stored, hard.commit)
        if snapshot is not None and self._term < snapshot.term:
            raise ValueError(
                f"restored term {self._term} is below the snapshot's term {snapshot.term}"
            )
        if self.log.entries and self._term < self.log.entries[-1].term:
            raise ValueError(
                f"restored term {self._term} is below the last entry's term "
                f"{self.log.entries[-1].term}"
            )
        # Latest snapshot (ours or the leader's) and its bytes, to send to lagging followers.
        self._snapshot: SnapshotMeta | None = snapshot
        self._snapshot_data: bytes = restored.snapshot_data if (restored and snapshot) else b""

        self._role: Role = Role.FOLLOWER
        self.progress: dict[NodeId, Progress] = {}  # leader: one per peer
        self._leader_id: NodeId | None = None
        # Ticks since we last heard from a valid leader (follower/candidate) or since the
        # last CheckQuorum check (leader). 0 <= election_elapsed.
        self.election_elapsed: int = 0
        self.heartbeat_elapsed: int = 0  # leader: ticks since the last heartbeat broadcast
        # This term's election timeout in ticks, in [T, 2T); redrawn on every role change.
        self.randomized_election_timeout: int = config.election_timeout_ticks
        self._votes: dict[NodeId, bool] = {}  # (pre-)candidate: answers received, incl. self
        self.lead_transferee: NodeId | None = None  # leader: transfer target in progress

        # ReadIndex state (leader only).
        self._committed_in_term: bool = False  # leader committed an entry of its own term
        self.reads = ReadIndexQueue()  # reads waiting for the barrier or their round

        # Follower: InstallSnapshot chunks assembled so far (volatile, lost on crash).
        self._assembling: SnapshotMeta | None = None
        self._assembly: bytearray = bytearray()

        # Output accumulated for the next Ready.
        self._messages: list[Message] = []
        self._read_states: list[ReadState] = []
        self._dropped_reads: list[bytes] = []
        self._warnings: list[str] = []
        self._errors: list[str] = []
        # Follower: why our COMMITTED log conflicts with the leader's ("" = it does not,
        # as far as we know). Volatile; what survives a crash is `_catch_up_to`, set above
        # our commit index so that we still grant no vote (`committed_log_diverged`).
        self._diverged: str = ""
        self._diverged_at: int = 0  # where (follower), when _diverged
        self._verify_counter: int = 0  # nonces of verify probes (verify_follower_match)
        self._received_snapshot: SnapshotMeta | None = None  # to persist + restore
        self._needs_broadcast: bool = False  # leader: new entries/commit to send at Ready
        self._last_hard_state: HardState = HardState(
            hard.term, hard.vote, self.log.committed, hard.catch_up_to
        )
        # Every entry at or below this index is durable on this node (a shell finished the
        # Ready that carried it: `advance`) AND is the entry our log holds there. A leader
        # counts its own copy towards a commit quorum only up to here (`quorum_match_index`),
        # which is what lets the shell send APPENDs before its own fsync. Lowering it is
        # always safe (commits just wait for followers); it must never overstate.
        self.durable_index: int = self.log.last_index()
        # Diagnostics: messages refused as malformed or misaddressed, and why (last one).
        self.ignored_message_count: int = 0
        self.last_ignored_reason: str = ""

        self._rescan_membership()
        self._apply_membership(self.configuration_in_effect())
        self.become_follower(self._term, None)

    # -- read-only views ---------------------------------------------------------------

    @property
    def role(self) -> Role:
        return self._role

    @property
    def term(self) -> int:
        return self._term

    @property
    def leader_id(self) -> NodeId | None:
        return self._leader_id

    @property
    def vote(self) -> NodeId | None:
        return self._vote

    @property
    def commit_index(self) -> int:
        return self.log.committed

    @property
    def applied_index(self) -> int:
        return self.log.applied

    @property
    def snapshot_meta(self) -> SnapshotMeta | None:
        return self._snapshot

    @property
    def log_diverged(self) -> str:
        """Why this node's committed log conflicts with its leader's ("" if it does not, as
        far as it knows): it applied entries the cluster no longer has. It grants no vote,
        never campaigns and accepts no entries; a shell stops it (docs/raft.md)."""
        return self._diverged

    @property
    def config_index(self) -> int:
        """Log index of the latest membership change (CONFIG entry) in our log, 0 if none:
        the change is pending while it is above the commit index (thesis §4.1)."""
        return self._config_index

    def snapshot_transfers(self) -> dict[NodeId, tuple[int, int, int]]:
        """Leader: the followers being sent a snapshot, each as (snapshot index, bytes
        acknowledged so far, snapshot size); empty on any other node. Read-only, for
        operators and test harnesses that want to see the transfer windows."""
        size = len(self._snapshot_data)
        return {peer: (p.pending_snapshot, p.snapshot_offset, size)
                for peer, p in self.progress.items() if p.state is ProgressState.SNAPSHOT}

    def log_entries(self) -> tuple[Entry, ...]:
        """The entries held in memory after the snapshot point."""
        return tuple(self.log.entries)

    def status(self) -> Status:
        return Status(
            node_id=self.id,
            role=self._role,
            term=self._term,
            leader_id=self._leader_id,
            commit_index=self.log.committed,
            applied_index=self.log.applied,
            last_index=self.log.last_index(),
            snapshot_index=self.log.snapshot_index,
            voters=self.membership.voters,
            learners=self.membership.learners,
        )

    def __repr__(self) -> str:
        return (
            f"RaftCore({self.id}, {self._role.value}, term={self._term}, "
            f"leader={self._leader_id}, commit={self.log.committed}, "
            f"last={self.log.last_index()})"
        )

    # -- membership (thesis §4.1) --------------------------------------------------------

    def configuration_in_effect(self) -> Membership:
        """The membership this node acts on: the latest one in its log, committed or not
        (thesis §4.1). Overridable so a test can break exactly this rule."""
        return self._latest_membership

    def membership_at(self, index: int) -> Membership:
        """The membership as of log index `index` (for a snapshot at that index)."""
        if index >= self._config_index:
            return self._latest_membership
        for entry in reversed(self.log.slice(self.log.snapshot_index + 1, index + 1)):
            if entry.kind is EntryKind.CONFIG:
                return self._decode_membership(entry) or self._latest_membership
        return self._snapshot_membership()

    def _snapshot_membership(self) -> Membership:
        snapshot = self._snapshot if hasattr(self, "_snapshot") else None
        if snapshot is not None and snapshot.voters:
            return snapshot.membership
        return self._bootstrap

    def _decode_membership(self, entry: Entry) -> Membership | None:
        try:
            return Membership.decode(entry.data)
        except ValueError as error:
            self.ignored_message_count += 1
            self.last_ignored_reason = f"CONFIG entry {entry.index} is unreadable: {error}"
            return None

    def _rescan_membership(self) -> None:
        """Find the latest membership in the log, else the snapshot's, else bootstrap."""
        for entry in reversed(self.log.entries):
            if entry.kind is EntryKind.CONFIG:
                membership = self._decode_membership(entry)
                if membership is not None:
                    self._latest_membership, self._config_index = membership, entry.index
                    return
        self._latest_membership = self._snapshot_membership()
        self._config_index = self.log.snapshot_index if self._snapshot_membership() is not self._bootstrap else 0

    def _note_log_change(self, first_changed: int, new_entries: tuple[Entry, ...] | list[Entry]) -> None:
        """Entries from `first_changed` on were replaced by `new_entries`: keep the latest
        membership of the log current."""
        if first_changed <= self._config_index:
            self._rescan_membership()  # the entry holding it was truncated
            return
        for entry in reversed(new_entries):
            if entry.kind is EntryKind.CONFIG:
                membership = self._decode_membership(entry)
                if membership is not None:
                    self._latest_membership, self._config_index = membership, entry.index
                return

    def _refresh_membership(self) -> None:
        membership = self.configuration_in_effect()
        if membership != self.membership:
            self._apply_membership(membership)
        self.maybe_step_down_after_removal()

    def _apply_membership(self, membership: Membership) -> None:
        self.membership = membership
        self._voter_set = frozenset(membership.voters)
        self.quorum = len(membership.voters) // 2 + 1
        self.peers = tuple(m for m in membership.members() if m != self.id)
        self._voter_peers = tuple(v for v in membership.voters if v != self.id)
        if self._role is Role.LEADER:
            last = self.log.last_index()
            for peer in self.peers:
                if peer not in self.progress:
                    progress = Progress(last + 1, self.config.max_inflight_appends)
                    progress.recent_active = True  # a new member: give it a period
                    self.progress[peer] = progress
            for peer in list(self.progress):
                if peer not in self.peers:
                    del self.progress[peer]
            self._needs_broadcast = True
        if self.lead_transferee is not None and self.lead_transferee not in self._voter_set:
            self.lead_transferee = None

    def withhold_vote(self, reason: str) -> None:
        """The shell knows something the log cannot say: this node may have lost what it
        acknowledged (a new data directory under a known voter's id). Until `allow_vote`,
        it grants no vote or pre-vote and never campaigns; it still follows a leader."""
        self._vote_withheld = reason or "vote withheld by the shell"

    def allow_vote(self) -> None:
        self._vote_withheld = ""

    @property
    def vote_withheld(self) -> str:
        return self._vote_withheld

    @property
    def catch_up_to(self) -> int:
        """The index a leader told us we lost and must commit again before voting; 0 = none."""
        return self._catch_up_to

    def is_voter(self) -> bool:
        return self.id in self._voter_set

    def may_campaign(self) -> bool:
        """Who may stand for election (thesis §4.1, Figure 4.6): a voter of the membership
        in effect; and, while that membership is not yet committed, a voter of the one
        before it. A server removed by an uncommitted change may hold the most up-to-date
        log, whose vote no other server can win: if it never campaigned, no leader could
        be elected (found by swarming PreVote and CheckQuorum off: docs/raft-bugs-found.md).
        Elected, it counts only the voters of the new membership, commits it, and steps
        down (`maybe_step_down_after_removal`)."""
        if self.is_voter():
            return True
        if self._config_index == 0 or self.log.committed >= self._config_index:
            return False
        return self.id in self.membership_at(self._config_index - 1).voters

    def maybe_step_down_after_removal(self) -> bool:
        """Thesis §4.2.2: a leader that is not a voter of the membership in effect (it
        removed itself, or was demoted) keeps managing the cluster until that membership
        is committed, without counting itself, then steps down."""
        if (
            self._role is Role.LEADER
            and not self.is_voter()
            and self.log.committed >= self._config_index
        ):
            self.broadcast_append(commit_now=True)  # the remaining members learn it first
            self.become_follower(self._term, None)
            return True
        return False

    def change_membership(
        self, kind: MembershipChangeKind, node: NodeId, info: str = ""
    ) -> tuple[int, int]:
        """Append a membership change of one server (thesis §4.1); returns its (index,
        term) like `propose`. It takes effect at once, on the leader now and on each
        follower when the entry reaches its log. `info` is what the shell attaches to a
        new member (the KV node: its address). NotLeader, ProposalDropped during a leader
        transfer, MembershipChangeRefused when it is not allowed now."""
        if self._role is not Role.LEADER:
            raise NotLeader(self._leader_id)
        if self.lead_transferee is not None:
            raise ProposalDropped(
                f"leadership is being transferred to {self.lead_transferee}; retry there"
            )
        if not isinstance(kind, MembershipChangeKind):
            raise TypeError(f"kind must be a MembershipChangeKind, got {kind!r}")
        if not isinstance(node, str) or not node:
            raise MembershipChangeRefused(f"node id must be a non-empty string, got {node!r}")
        problem = self.membership_change_problem()
        if problem:
            raise MembershipChangeRefused(problem)
        current = self._latest_membership
        voters, learners = list(current.voters), list(current.learners)
        info_map = dict(current.member_info)
        if kind is MembershipChangeKind.ADD_LEARNER:
            if node in current.members():
                raise MembershipChangeRefused(f"{node} is already a member of {current.members()}")
            learners.append(node)
            info_map[node] = info
        elif kind is MembershipChangeKind.PROMOTE:
            if node not in learners:
                raise MembershipChangeRefused(
                    f"{node} is not a learner (learners: {current.learners}); add it as a "
                    "learner first")
            lag = self.learner_lag(node)
            if lag:
                raise MembershipChangeRefused(
                    f"learner {node} is not caught up: {lag}; promote it once it has caught up")
            learners.remove(node)
            voters.append(node)
        else:
            if node not in current.members():
                raise MembershipChangeRefused(f"{node} is not a member of {current.members()}")
            if current.voters == (node,):
                raise MembershipChangeRefused(f"{node} is the last voter; it cannot be removed")
            if node in voters:
                voters.remove(node)
            else:
                learners.remove(node)
            info_map.pop(node, None)
        membership = Membership(
            tuple(voters), tuple(learners),
            tuple(sorted((k, v) for k, v in info_map.items() if k in voters or k in learners)),
        )
        index = self.append_entry(membership.encode(), EntryKind.CONFIG)
        self._latest_membership, self._config_index = membership, index
        self._refresh_membership()
        self._needs_broadcast = True
        return index, self._term

    def membership_change_problem(self) -> str:
        """Why the leader may not append a membership change now ("" if it may).

        One change at a time: the previous one must be committed, else two changes in
        flight can yield two memberships with disjoint majorities. And the leader must
        have committed an entry of its own term first: otherwise a change by an earlier
        leader that it never saw can combine with its own into disjoint majorities
        (Ongaro, raft-dev 2015, "bug in single-server membership changes")."""
        if self._config_index > self.log.committed:
            return (
                f"a membership change is in progress (log entry {self._config_index}, not yet "
                f"committed; commit index {self.log.committed}); retry when it is committed"
            )
        if not self._committed_in_term:
            return (
                "this leader has not yet committed an entry of its term; retry in a moment"
            )
        return ""

    def learner_lag(self, node: NodeId) -> str:
        """"" if learner `node` is caught up (holds everything committed), else how far
        behind it is."""
        progress = self.progress.get(node)
        match = progress.match if progress is not None else 0
        if match >= self.log.committed:
            return ""
        return f"it holds entries up to {match}, the commit index is {self.log.committed}"

    # -- role transitions ----------------------------------------------------------------

    def _reset(self, term: int) -> None:
        """Common to every role change: move to `term`, restart the timers."""
        assert term >= self._term, f"term would go backwards: {self._term} -> {term}"
        if term != self._term:
            self._term = term
            self._vote = None
        self._leader_id = None
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.reset_randomized_election_timeout()
        self._votes = {}
        self.lead_transferee = None
        self._abandon_reads()

    def reset_randomized_election_timeout(self) -> None:
        """Draw this term's election timeout from [T, 2T) (Raft §5.2: randomized timeouts
        make split votes rare)."""
        base = self.config.election_timeout_ticks
        self.randomized_election_timeout = base + self.rng.randrange(base)

    def become_follower(self, term: int, leader_id: NodeId | None) -> None:
        self._reset(term)
        self._role = Role.FOLLOWER
        self._leader_id = leader_id
        self.progress = {}

    def become_pre_candidate(self) -> None:
        """PreVote (thesis §9.6): ask whether we could win at term+1 WITHOUT changing our
        term or vote, so a node that cannot win never disrupts the cluster."""
        assert self._role is not Role.LEADER, "a leader cannot become a pre-candidate"
        self._role = Role.PRE_CANDIDATE
        self._leader_id = None
        self._votes = {}
        self.progress = {}
        self._abandon_reads()

    def become_candidate(self) -> None:
        assert self._role is not Role.LEADER, "a leader cannot become a candidate"
        self._reset(self._term + 1)
        self._role = Role.CANDIDATE
        self._vote = self.id  # Raft §5.2: vote for yourself
        self.progress = {}

    def become_leader(self) -> None:
        assert self._role is Role.CANDIDATE, f"only a candidate can lead, not a {self._role}"
        term = self._term
        self._reset(term)
        self._role = Role.LEADER
        self._leader_id = self.id
        last = self.log.last_index()
        max_inflight = self.config.max_inflight_appends
        self.progress = {peer: Progress(last + 1, max_inflight) for peer in self.peers}
        self._committed_in_term = False
        # Raft §8: a NOOP of our own term lets us commit (by counting, §5.4.2) every earlier
        # entry, and tells us our commit index is current (needed by ReadIndex).
        self.append_entry(b"", EntryKind.NOOP)
        self._needs_broadcast = True

    # -- inputs: time ------------------------------------------------------------------------

    def tick(self) -> None:
        if self._role is Role.LEADER:
            self._tick_leader()
        else:
            self._tick_election()
        self._refresh_membership()
        self.check_invariants()

    def _tick_election(self) -> None:
        if not self.may_campaign():
            self.election_elapsed = min(self.election_elapsed + 1, 1 << 30)
            return  # a learner (or a removed server) never campaigns
        self.election_elapsed += 1
        if self.election_elapsed >= self.randomized_election_timeout:
            self.election_elapsed = 0
            self.campaign(
                CampaignKind.PRE_ELECTION if self.config.pre_vote else CampaignKind.ELECTION
            )

    def _tick_leader(self) -> None:
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        for progress in self.progress.values():
            if progress.state is ProgressState.SNAPSHOT:
                progress.snapshot_idle_ticks += 1
        if self.election_elapsed >= self.config.election_timeout_ticks:
            self.election_elapsed = 0
            if self.config.check_quorum and self.maybe_step_down_without_quorum():
                return
            if self.lead_transferee is not None:
                # Thesis §3.10: a transfer that did not finish within an election timeout
                # is aborted, so the cluster accepts proposals again.
                self.lead_transferee = None
        if self.heartbeat_elapsed >= self.config.heartbeat_interval_ticks:
            self.heartbeat_elapsed = 0
            self.broadcast_heartbeat()

    def maybe_step_down_without_quorum(self) -> bool:
        """CheckQuorum (thesis §6.2): a leader that has not heard from a majority within
        an election timeout steps down, so a partitioned leader stops serving. Returns
        whether it stepped down. Resets every peer's recent_active for the next period."""
        active = 1 if self.is_voter() else 0  # ourselves
        voters = self._voter_set
        for peer, progress in self.progress.items():
            if progress.recent_active and peer in voters:
                active += 1
            progress.recent_active = False
        if active >= self.quorum:
            return False
        self.become_follower(self._term, None)
        return True

    # -- inputs: client requests -------------------------------------------------------------

    def propose(self, data: bytes) -> tuple[int, int]:
        """Append a client command; returns its (index, term). It is committed only when an
        entry with that index AND term comes out in `Ready.committed_entries`."""
        if self._role is not Role.LEADER:
            raise NotLeader(self._leader_id)
        if self.lead_transferee is not None:
            raise ProposalDropped(
                f"leadership is being transferred to {self.lead_transferee}; retry there "
                "or after the transfer ends"
            )
        if not isinstance(data, bytes):
            raise TypeError(f"proposal data must be bytes, got {type(data).__name__}")
        index = self.append_entry(data, EntryKind.NORMAL)
        self._needs_broadcast = True
        return index, self._term

    def append_entry(self, data: bytes, kind: EntryKind) -> int:
        """Leader: append one entry of the current term to our own log."""
        index = self.log.append_new(self._term, data, kind)
        if not self._voter_peers:
            # A single-node cluster is its own majority; it commits once the entry is
            # durable (`advance_durable`), and this call commits nothing new before that.
            self.maybe_commit()
        return index

    def read_index(self, context: bytes) -> None:
        """Start a linearizable read (thesis §6.4). The answer is a later ReadState with
        this context (serve once applied >= its index) or a dropped_reads entry."""
        if self._role is not Role.LEADER:
            raise NotLeader(self._leader_id)
        if not isinstance(context, bytes):
            raise TypeError(f"read context must be bytes, got {type(context).__name__}")
        if not self.read_barrier_open():
            # Until an entry of our term is committed our commit index may be behind the
            # previous leader's: queue (the NOOP will open the barrier soon).
            self.reads.wait_for_barrier(context)
            return
        self._start_read_round([context])

    def read_barrier_open(self) -> bool:
        """ReadIndex rule 1: the leader has committed an entry of its current term, so its
        commit index is at least that of every earlier leader (Leader Completeness)."""
        return self._committed_in_term

    def read_round_confirmed(self, acks: set[NodeId]) -> bool:
        """ReadIndex rule 2: a majority (including us) acknowledged the heartbeat round,
        so no other leader with a newer term had been elected when it started."""
        voters = self._voter_set
        return sum(1 for node in acks if node in voters) + self.is_voter() >= self.quorum

    def _start_read_round(self, contexts: list[bytes]) -> None:
        round_id = self.reads.start_round(contexts, self.log.committed)
        self._maybe_release_reads(round_id)  # a single-node cluster needs no heartbeat
        if self.reads.pending:
            self.broadcast_heartbeat()

    def _maybe_release_reads(self, round_id: int) -> None:
        acks = self.reads.acks.get(round_id)
        if acks is not None and self.read_round_confirmed(acks):
            self._read_states.extend(self.reads.release_through(round_id))

    def _abandon_reads(self) -> None:
        """Leadership lost (or never had): these reads will never be confirmed."""
        if self.reads or self.reads.acks:
            self._dropped_reads.extend(self.reads.abandon())
        self._committed_in_term = False

    def transfer_leadership(self, target: NodeId) -> None:
        """Hand leadership to `target` (thesis §3.10): bring it up to date, then tell it
        to campaign at once. Proposals are refused until the transfer ends or times out."""
        if self._role is not Role.LEADER:
            raise NotLeader(self._leader_id)
        if target not in self._voter_set:
            raise ValueError(f"cannot transfer leadership to {target!r}: not a voter")
        if target != self.id and target not in self.progress:
            raise ValueError(f"cannot transfer leadership to {target!r}: not a peer")
        if self.lead_transferee == target:
            return  # already in progress
        if target == self.id:
            self.lead_transferee = None  # we stay: abandon any transfer in progress
            return
        self.lead_transferee = target  # replaces any earlier target
        self.election_elapsed = 0  # the transfer gets one election timeout
        progress = self.progress[target]
        if progress.match == self.log.last_index():
            self._send(Message(_MT.TIMEOUT_NOW, self.id, target, self._term))
        else:
            self.maybe_send_append(target, send_if_empty=True)

    def compact(self, index: int, data: bytes) -> None:
        """The shell durably saved a snapshot of its state machine at applied `index`:
        drop the log up to it, and keep (meta, data) to send to lagging followers."""
        if not isinstance(data, bytes):
            raise TypeError(f"snapshot data must be bytes, got {type(data).__name__}")
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"compact index must be an int, got {type(index).__name__}")
        if index > self.log.applied:
            raise ValueError(
                f"cannot compact to {index}: only {self.log.applied} is applied (a snapshot "
                "must describe applied state)"
            )
        if index <= self.log.snapshot_index:
            # Already compacted that far (e.g. a leader's snapshot was installed while the
            # shell was saving its own): the older snapshot is simply not needed.
            return
        term = self.log.term(index)
        assert term is not None
        self.log.compact(index)
        membership = self.membership_at(index)
        self._snapshot = SnapshotMeta(
            index, term, membership.voters, membership.learners, membership.member_info
        )
        self._snapshot_data = data

    # -- inputs: messages ----------------------------------------------------------------------

    def step(self, message: Message) -> None:
        """Handle one message from a peer. Misaddressed, unknown-sender, malformed and
        stale messages are ignored (never raise); see `ignored_message_count`."""
        problem = self.malformed(message)
        if problem:
            self.ignored_message_count += 1
            self.last_ignored_reason = problem
            return
        m = message
        mtype = m.type
        timer: tuple[int, int] | None = None  # the election timer to keep (see below)
        if m.term > self._term:
            if (
                (mtype is _MT.PRE_VOTE or mtype is _MT.VOTE)
                and m.context != TRANSFER_CONTEXT
                and self.in_leader_lease()
            ):
                # Thesis §9.6 / §4.2.3: we heard from a leader within the minimum election
                # timeout, so ignore (no term bump, no answer) a disruptive candidate.
                return
            if mtype is _MT.PRE_VOTE:
                pass  # a PreVote never changes our term
            elif mtype is _MT.PRE_VOTE_RESPONSE and not m.reject:
                pass  # a granted PreVote echoes the proposed term; we have not moved yet
            else:
                leader = m.src if mtype in _FROM_LEADER else None
                if mtype is _MT.VOTE and self._role is not Role.LEADER:
                    # Raft Figure 2: only hearing from the leader or granting a vote
                    # restarts the election timer. A candidate we refuse (its log is
                    # behind ours) moves our term but not our timer, or a server that
                    # cannot win, campaigning on a short timeout, would keep the ones
                    # that can from ever timing out (found by the swarm with PreVote
                    # off: docs/raft-bugs-found.md).
                    timer = (self.election_elapsed, self.randomized_election_timeout)
                self.become_follower(m.term, leader)
        elif m.term < self._term:
            if mtype is _MT.APPEND or mtype is _MT.HEARTBEAT:
                # A stale leader (e.g. back from a partition): tell it our term so it steps
                # down. With CheckQuorum/PreVote it could otherwise never learn it.
                self._send(Message(_MT.APPEND_RESPONSE, self.id, m.src, self._term))
            elif mtype is _MT.PRE_VOTE:
                self._send(Message(_MT.PRE_VOTE_RESPONSE, self.id, m.src, self._term, reject=True))
            return  # every other stale message is ignored (Raft §5.1)

        if mtype is _MT.PRE_VOTE or mtype is _MT.VOTE:
            self.handle_vote_request(m)
            if timer is not None and self._vote != m.src:
                self.keep_election_timer(timer)
        elif self._role is Role.LEADER:
            self.step_leader(m)
        elif self._role is Role.FOLLOWER:
            self.step_follower(m)
        else:
            self.step_candidate(m)
        if self._catch_up_to and self.log.committed >= self._catch_up_to:
            self._catch_up_to = 0  # caught up: our log holds what we had lost again
        self._refresh_membership()
        self.check_invariants()

    def keep_election_timer(self, timer: tuple[int, int]) -> None:
        """After refusing a higher-term VOTE: the election timer runs on from where it was
        (elapsed ticks, this term's timeout), as if the request had not come (Figure 2)."""
        self.election_elapsed, self.randomized_election_timeout = timer

    def malformed(self, m: Message) -> str:
        """Why `m` must be ignored ("" if it is acceptable). Cheap checks only."""
        if not isinstance(m, Message):
            return f"not a Message: {type(m).__name__}"
        if type(m.type) is not MessageType or not (
            type(m.term) is int
            and type(m.index) is int
            and type(m.log_term) is int
            and type(m.commit) is int
        ):
            return "message type or a numeric field has the wrong type (a transport bug?)"
        if m.dst != self.id:
            return f"addressed to {m.dst!r}, not to {self.id!r}"
        # Thesis §4.1: messages from servers outside our latest membership are accepted
        # (a leader added after our log's end must reach us); only nonsense is refused.
        if not isinstance(m.src, str) or not m.src or m.src == self.id:
            return f"from {m.src!r}, which cannot be a peer of {self.id!r}"
        if m.term < 0 or m.index < 0 or m.log_term < 0 or m.commit < 0:
            return f"negative term or index in {m.type.value} from {m.src}"
        if m.term == 0 and m.type in _REQUESTS:
            return f"{m.type.value} from {m.src} at term 0 (terms of leaders start at 1)"
        entries = m.entries
        if entries:
            if m.type is not _MT.APPEND:
                return f"{m.type.value} carries entries"
            if (
                entries[0].index != m.index + 1
                or entries[-1].index != m.index + len(entries)
                or entries[0].term < max(1, m.log_term)
                or entries[-1].term > m.term
            ):
                return (
                    f"APPEND from {m.src} has entries that do not follow index {m.index} "
                    "contiguously within its term"
                )
        if m.type is _MT.SNAPSHOT and (m.snapshot is None or m.offset < 0):
            return f"SNAPSHOT from {m.src} without snapshot metadata or with a bad offset"
        return ""

    def in_leader_lease(self) -> bool:
        """CheckQuorum's leader lease: with check_quorum on, (pre)votes for a higher term
        are ignored (no answer, no term change) while we heard from a leader recently."""
        return self.config.check_quorum and self.heard_from_leader_recently()

    def heard_from_leader_recently(self) -> bool:
        """Whether we heard from a live leader (or are one) within the minimum election
        timeout: then no election is needed, and a PreVote is refused (thesis §9.6)."""
        return (
            self._leader_id is not None
            and self.election_elapsed < self.config.election_timeout_ticks
        )

    def handle_vote_request(self, m: Message) -> None:
        pre = m.type is _MT.PRE_VOTE
        response_type = _MT.PRE_VOTE_RESPONSE if pre else _MT.VOTE_RESPONSE
        if self.may_grant_vote(m):
            if not pre:
                self.record_vote(m.src)
                self.election_elapsed = 0  # a vote is a promise; do not campaign against it
            # Granted answers carry the candidate's term (PreVote: the proposed term).
            self._send(Message(response_type, self.id, m.src, m.term))
        else:
            self._send(Message(response_type, self.id, m.src, self._term, reject=True))

    def record_vote(self, candidate: NodeId) -> None:
        """Remember our vote for this term; it goes to disk in the next Ready, before the
        grant is sent."""
        assert self._vote in (None, candidate), (
            f"{self.id} would vote twice in term {self._term}: {self._vote} then {candidate}"
        )
        self._vote = candidate

    def may_grant_vote(self, m: Message) -> bool:
        """Raft §5.2 and §5.4.1: grant if we have not voted for anyone else in this term
        and the candidate's log is at least as up to date as ours. A PreVote (thesis
        §9.6) is granted if we WOULD vote at its term (ahead of ours) and have not heard
        from a leader within the election timeout."""
        can_vote = (
            self._vote == m.src
            or (self._vote is None and self._leader_id is None)
            or (m.type is _MT.PRE_VOTE and m.term > self._term)
        )
        if m.type is _MT.PRE_VOTE and self.heard_from_leader_recently():
            can_vote = False
        if self.lost_entries_forbid_vote() or self._vote_withheld:
            can_vote = False
        return can_vote and self.log_is_up_to_date(m.index, m.log_term)

    def lost_entries_forbid_vote(self) -> bool:
        """A voter that lost entries it had acknowledged (a leader told us: our log went
        backwards) grants no vote and no pre-vote, and stands for no election, until its
        commit index is back at the index it lost. Otherwise its shortened log would let it judge a candidate that
        lacks a committed entry "up to date" (§5.4.1 assumes a voter's log never loses
        what it acknowledged), and its vote could complete a majority that elects a
        leader without that entry (docs/raft.md). A follower whose committed log diverged
        from the leader's (`committed_log_diverged`) is in the same case, and worse."""
        return self._catch_up_to > self.log.committed or bool(self._diverged)

    def log_is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Raft §5.4.1 election restriction."""
        return self.log.is_up_to_date(last_index, last_term)

    # -- elections -------------------------------------------------------------------------------

    def campaign(self, kind: CampaignKind) -> None:
        """Start an election of the given kind (see CampaignKind)."""
        if self._role is Role.LEADER:
            return
        if not self.may_campaign():
            return  # learners and (committed) removed servers never stand for election
        if self.lost_entries_forbid_vote() or self._vote_withheld:
            # We know (or the shell knows) our log lacks entries a majority acknowledged: we could only win
            # with voters that lack them too, and then lose them (docs/raft.md).
            return
        if kind is CampaignKind.PRE_ELECTION:
            self.become_pre_candidate()
            vote_type = _MT.PRE_VOTE
            term = self._term + 1  # the term we would campaign in; ours does not move
        else:
            self.become_candidate()
            vote_type = _MT.VOTE
            term = self._term
        self._votes[self.id] = True
        if self._tally() is True:
            self._won_election()
            return
        context = TRANSFER_CONTEXT if kind is CampaignKind.TRANSFER else b""
        last_index, last_term = self.log.last_index(), self.log.last_term()
        for peer in self._voter_peers:
            self._send(
                Message(
                    vote_type,
                    self.id,
                    peer,
                    term,
                    log_term=last_term,
                    index=last_index,
                    context=context,
                )
            )

    def _tally(self) -> bool | None:
        """True: a majority granted; False: a majority refused; None: undecided."""
        voters = self._voter_set
        granted = sum(1 for node, v in self._votes.items() if v and node in voters)
        refused = sum(1 for node, v in self._votes.items() if not v and node in voters)
        if granted >= self.quorum:
            return True
        if refused >= self.quorum:
            return False
        return None

    def _won_election(self) -> None:
        if self._role is Role.PRE_CANDIDATE:
            self.campaign(CampaignKind.ELECTION)  # the real election; PreVote passed
        else:
            self.become_leader()

    def step_candidate(self, m: Message) -> None:
        mtype = m.type
        if mtype in _FROM_LEADER:
            # Same term, someone else won (Raft §5.2): follow it.
            self.become_follower(self._term, m.src)
            self.step_follower(m)
            return
        expected = _MT.PRE_VOTE_RESPONSE if self._role is Role.PRE_CANDIDATE else _MT.VOTE_RESPONSE
        if mtype is not expected:
            return
        if mtype is _MT.PRE_VOTE_RESPONSE and not m.reject and m.term != self._term + 1:
            # A grant from an earlier PreVote round (for the term we are now in, or
            # below): it says nothing about the term this round asks for.
            return
        self._votes.setdefault(m.src, not m.reject)
        result = self._tally()
        if result is True:
            self._won_election()
        elif result is False:
            self.become_follower(self._term, None)

    # -- follower --------------------------------------------------------------------------------

    def step_follower(self, m: Message) -> None:
        mtype = m.type
        if mtype in _FROM_LEADER:
            self.election_elapsed = 0
            self._leader_id = m.src
            if mtype is _MT.APPEND:
                self.handle_append(m)
            elif mtype is _MT.HEARTBEAT:
                self.handle_heartbeat(m)
            else:
                self.handle_snapshot(m)
        elif mtype is _MT.TIMEOUT_NOW:
            # Leader transfer: campaign now, skipping PreVote (the leader asked for it).
            # (A learner or removed server ignores it: campaign() refuses.)
            self.campaign(CampaignKind.TRANSFER)

    def handle_append(self, m: Message) -> None:
        log = self.log
        if m.context:
            lost = decode_catch_up(m.context)
            if lost > self._catch_up_to and lost > log.committed:
                self._catch_up_to = lost
        if self._diverged:
            # Nothing the leader sends can be appended to a log that contradicts its
            # committed prefix: keep saying so, never "match".
            self._send_diverged(m.src, self._diverged_at)
            return
        if m.index <= log.committed:
            conflict = self.committed_entry_conflict(m)
            if conflict:
                self.committed_log_diverged(m, conflict)
                return
        if m.index < log.committed:
            # Everything up to our commit index matches the leader's log (§5.4); tell it
            # where we are so it skips ahead. (Only as far as we checked: when the
            # entry at m.index is ours too, up to the last entry the APPEND carries.)
            index = log.committed
            if log.term(m.index) is not None:
                index = min(index, m.index + len(m.entries))
            self._send(
                Message(
                    _MT.APPEND_RESPONSE, self.id, m.src, self._term, index=index,
                    context=_echo(m.context),
                )
            )
            return
        if log.match_term(m.index, m.log_term):
            entries = m.entries
            last_new = m.index + len(entries)
            conflict = log.find_conflict(entries)
            if conflict:
                assert conflict > log.committed, (
                    f"{self.id}: leader {m.src} would overwrite committed entry {conflict}"
                )
                if conflict <= self.durable_index:
                    # The durable suffix from `conflict` on is about to be replaced.
                    self.durable_index = conflict - 1
                new_entries = entries[conflict - m.index - 1 :]
                log.append(new_entries)
                self._note_log_change(conflict, new_entries)
            # Raft Figure 2: commit = min(leaderCommit, index of last new entry).
            log.commit_to(min(m.commit, last_new))
            self._send(
                Message(
                    _MT.APPEND_RESPONSE, self.id, m.src, self._term, index=last_new,
                    context=_echo(m.context),
                )
            )
            return
        # Log inconsistency (§5.3): reject, with a hint that skips a whole term at once.
        hint_index = log.find_conflict_by_term(min(m.index, log.last_index()), m.log_term)
        hint_term = log.term(hint_index) or 0
        self._send(
            Message(
                _MT.APPEND_RESPONSE,
                self.id,
                m.src,
                self._term,
                index=m.index,
                reject=True,
                reject_hint=hint_index,
                reject_term=hint_term,
                context=_echo(m.context),
            )
        )

    def committed_entry_conflict(self, m: Message) -> int:
        """The first index at or below our commit index where the leader's log, as this
        APPEND shows it (the entry before `entries`, then `entries`), has another term
        than ours; 0 if none. Raft never lets that happen (Leader Completeness, §5.4):
        it means a node lost entries it had acknowledged and helped elect a leader
        without them. Answering such an APPEND as a match (the usual shortcut below the
        commit index) would leave the leader believing a log we do not have."""
        log = self.log
        committed = log.committed
        ours = log.term(m.index)
        if ours is not None and ours != m.log_term:
            return m.index
        for entry in m.entries:
            if entry.index > committed:
                break
            ours = log.term(entry.index)
            if ours is not None and ours != entry.term:
                return entry.index
        return 0

    def committed_log_diverged(self, m: Message, at: int) -> None:
        """Our entry at `at` (at or below our commit index) conflicts with leader
        `m.src`'s: we applied entries the cluster no longer has. Say so, to the operator
        (Ready.errors) and to the leader (a refusal it cannot take for a stale one); from
        now on refuse every APPEND, grant no vote and never campaign. The durable
        `catch_up_to` above our commit index keeps the vote refused across a restart
        (nothing can raise our commit index while we refuse every APPEND)."""
        log = self.log
        theirs = m.log_term if at == m.index else m.entries[at - m.index - 1].term
        self._diverged_at = at
        self._diverged = (
            f"this node's committed log diverged from leader {m.src}'s at index {at} (term "
            f"{log.term(at)} here, {theirs} at the leader), at or below its commit index "
            f"{log.committed}: it applied entries the cluster no longer has (lost by "
            "another node's disk?). It refuses entries, votes and elections until the "
            "leader replaces its log and state machine with a snapshot"
        )
        self._errors.append(self._diverged)
        self._catch_up_to = max(self._catch_up_to, log.committed + 1)
        self._send_diverged(m.src, at)

    def _send_diverged(self, to: NodeId, at: int) -> None:
        self._send(
            Message(
                _MT.APPEND_RESPONSE, self.id, to, self._term, index=at, reject=True,
                context=encode_diverged(at, self.log.committed),
            )
        )

    def handle_heartbeat(self, m: Message) -> None:
        # The leader caps the commit at our match, so it never exceeds our log. (Not
        # ours to learn while our committed log contradicts the leader's.)
        if not self._diverged:
            self.log.commit_to(min(m.commit, self.log.last_index()))
        self._send(Message(_MT.HEARTBEAT_RESPONSE, self.id, m.src, self._term, context=m.context))

    def handle_snapshot(self, m: Message) -> None:
        """One InstallSnapshot chunk (Raft §7). Chunks are assembled in volatile memory
        and the snapshot is handed to the shell (Ready.snapshot) once the last one
        arrives. Every chunk is answered with the offset we expect next, so the leader
        resumes from there whatever was lost, duplicated or reordered."""
        meta = m.snapshot
        assert meta is not None  # checked by malformed()
        log = self.log
        if meta.index <= log.committed and self._diverged:
            # Our commit index is no match for the leader's log: claim nothing.
            self._send_diverged(m.src, self._diverged_at)
            return
        if meta.index <= log.committed:
            # Not newer than what we know committed: nothing to install, say we are done.
            if self._assembling is not None and self._assembling.index <= log.committed:
                self._discard_assembly()
            self._send_snapshot_response(m.src, meta, index=log.committed, done=True)
            return
        if self._assembling != meta:
            if m.offset != 0:
                # A chunk of a snapshot we are not assembling: start it from byte 0.
                self._send_snapshot_response(m.src, meta, index=meta.index, reject=True)
                return
            self._assembling = meta  # a new snapshot replaces any partial one
            self._assembly = bytearray()
        assembly = self._assembly
        if m.offset > len(assembly):
            # A gap (a chunk was lost or overtaken): ask for the missing bytes.
            self._send_snapshot_response(
                m.src, meta, index=meta.index, offset=len(assembly), reject=True
            )
            return
        end = m.offset + len(m.data)
        if end > len(assembly):  # a duplicate of bytes already held adds nothing
            assembly[m.offset :] = m.data
        if not m.done:
            self._send_snapshot_response(m.src, meta, index=meta.index, offset=len(assembly))
            return
        data = bytes(assembly)
        self._discard_assembly()
        self.install_snapshot(meta, data)
        self._send_snapshot_response(m.src, meta, index=log.committed, done=True)

    def _discard_assembly(self) -> None:
        self._assembling = None
        self._assembly = bytearray()

    def _send_snapshot_response(
        self,
        to: NodeId,
        meta: SnapshotMeta,
        index: int,
        offset: int = 0,
        reject: bool = False,
        done: bool = False,
    ) -> None:
        self._send(
            Message(
                _MT.SNAPSHOT_RESPONSE,
                self.id,
                to,
                self._term,
                index=index,
                snapshot=meta,
                offset=offset,
                reject=reject,
                done=done,
            )
        )

    def install_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        """Adopt the leader's snapshot, newer than our commit index."""
        log = self.log
        if log.match_term(meta.index, meta.term) and not self._diverged:
            # We already hold that entry: just learn it is committed (etcd does the same).
            log.commit_to(meta.index)
            return
        if self._diverged:
            self._warnings.append(
                f"this node's diverged log and state machine are replaced by leader "
                f"{self._leader_id}'s snapshot at index {meta.index}: what it had applied up to its commit index "
                f"{log.committed} that the cluster no longer has is gone from it"
            )
        # Our whole log is replaced; until the snapshot's Ready is durable, only what was
        # committed (and so is in the snapshot too) is known durable and matching.
        self.durable_index = min(self.durable_index, log.committed)
        # A snapshot beyond our commit index replaces our log and state machine whole:
        # whatever our committed log got wrong is gone with it.
        self._diverged = ""
        log.restore(meta)
        self._snapshot = meta
        self._snapshot_data = data
        self._received_snapshot = meta
        self._rescan_membership()

    # -- leader ----------------------------------------------------------------------------------

    def step_leader(self, m: Message) -> None:
        mtype = m.type
        progress = self.progress.get(m.src)
        if progress is None:
            return
        if mtype is _MT.APPEND_RESPONSE:
            progress.recent_active = True
            self.handle_append_response(m, progress)
        elif mtype is _MT.HEARTBEAT_RESPONSE:
            progress.recent_active = True
            self.handle_heartbeat_response(m, progress)
        elif mtype is _MT.SNAPSHOT_RESPONSE:
            progress.recent_active = True
            self.handle_snapshot_response(m, progress)
        # Anything else at our own term (a VOTE_RESPONSE from an earlier election, a
        # stray APPEND) carries no information for a leader: ignore it.

    def handle_append_response(self, m: Message, progress: Progress) -> None:
        if m.context.startswith(DIVERGED_PREFIX):
            diverged = decode_diverged(m.context)
            if diverged is not None and m.reject:
                self.follower_log_diverged(m.src, progress, *diverged)
            return
        if progress.diverged:
            if not progress.verify_nonce or m.context != encode_verify(progress.verify_nonce):
                return  # sent before we found it diverged, or an older probe's answer
            # A fresh answer that is not "diverged" (the node was replaced, or lost the
            # flag in a restart): judge it like any other answer.
            progress.diverged = ()
            progress.verify_nonce = 0
        elif m.context.startswith(VERIFY_PREFIX):
            if not progress.verify_nonce or m.context != encode_verify(progress.verify_nonce):
                return  # the answer to an older verify probe: superseded, ignore
            progress.verify_nonce = 0
            if m.reject:
                # A fresh refusal of the very entry it had acknowledged: it lost entries.
                self.follower_log_went_backwards(m.src, progress, m.reject_hint)
                return
        elif m.reject and m.index >= progress.match > m.reject_hint:
            # The follower rejects an APPEND at or after what it had acknowledged, and its
            # log ends (reject_hint <= its last index) below that: it lost entries -- or
            # this is a stale duplicate of an older rejection. Ask again, at `match`.
            self.verify_follower_match(m.src, progress, m.reject_hint)
            return
        if m.index > self.log.last_index() and not m.reject:
            # It says its log matches ours beyond our last index: only its commit index
            # can be there (the answer to an APPEND below it), and a committed entry we
            # lack means its committed log diverged from ours (Leader Completeness).
            self.follower_log_diverged(m.src, progress, self.log.last_index() + 1, m.index)
            return
        if m.reject:
            # Fast back-tracking: jump to the follower's hint, refined by our own log so
            # that a whole term of conflicting entries is skipped in one round trip.
            next_probe = m.reject_hint
            if m.reject_term > 0:
                next_probe = self.log.find_conflict_by_term(m.reject_hint, m.reject_term)
            if progress.maybe_decrease_to(m.index, next_probe):
                if progress.state is ProgressState.REPLICATE:
                    progress.become_probe()
                self.maybe_send_append(m.src, send_if_empty=True)
            return
        updated = progress.maybe_update(m.index)
        if updated or (progress.match == m.index and progress.state is ProgressState.PROBE):
            # (A probe answered at the match we already knew, e.g. right after a snapshot,
            # also proves the logs agree there: start streaming.)
            if progress.state is ProgressState.PROBE:
                progress.become_replicate()
            elif (
                progress.state is ProgressState.SNAPSHOT
                and progress.match >= progress.pending_snapshot
            ):
                progress.become_probe()
                progress.become_replicate()
            if updated and self.maybe_commit() and self.config.eager_commit:
                self._needs_broadcast = True
            if m.src == self.lead_transferee and progress.match == self.log.last_index():
                self._send(Message(_MT.TIMEOUT_NOW, self.id, m.src, self._term))
        # Keep the pipeline full: send whatever the follower still lacks.
        while self.maybe_send_append(m.src, send_if_empty=False):
            pass

    def handle_heartbeat_response(self, m: Message, progress: Progress) -> None:
        if progress.diverged:
            if not self.maybe_send_repair_snapshot(m.src, progress):
                self.probe_diverged_follower(m.src, progress)
        elif progress.state is ProgressState.SNAPSHOT:
            # The follower is alive but no chunk was answered for a while: the chunk or
            # its answer was lost; resend it. (Not on every heartbeat answer: under
            # reordering that would multiply the chunks in flight.)
            if progress.snapshot_idle_ticks >= self.snapshot_resend_ticks():
                self.send_snapshot(m.src, progress)
        else:
            # Lost messages must not stall a follower forever: a heartbeat answer re-opens
            # a paused probe, and frees one slot of a full pipeline (as etcd does).
            progress.probe_sent = False
            if progress.state is ProgressState.REPLICATE and progress.is_paused():
                progress.inflight.popleft()
            if progress.match < self.log.last_index():
                self.maybe_send_append(m.src, send_if_empty=True)
        if m.context:
            round_id = decode_round(m.context)
            if self.reads.acknowledge(round_id, m.src) is not None:
                self._maybe_release_reads(round_id)

    def handle_snapshot_response(self, m: Message, progress: Progress) -> None:
        if progress.state is not ProgressState.SNAPSHOT:
            return
        if m.done:
            if m.index > self.log.last_index():
                # Done, with a commit index beyond our log: see handle_append_response.
                self.follower_log_diverged(m.src, progress, self.log.last_index() + 1, m.index)
                return
            progress.maybe_update(m.index)
            progress.become_probe()
            self.maybe_send_append(m.src, send_if_empty=True)
            return
        if m.snapshot is None or m.snapshot.index != progress.pending_snapshot:
            return  # about a snapshot we are no longer sending
        progress.snapshot_idle_ticks = 0
        if m.offset == progress.snapshot_offset and not m.reject:
            return  # the chunk at that offset is already on its way
        # Resume where the follower says it is (a stale answer at worst costs a resend
        # the follower acknowledges as a duplicate).
        progress.snapshot_offset = min(m.offset, len(self._snapshot_data))
        self.send_snapshot(m.src, progress)

    def verify_follower_match(self, peer: NodeId, progress: Progress, hint: int) -> None:
        """Probe `peer` at the index it acknowledged (with the entry's term), marked with
        a fresh nonce it echoes: its answer tells a real loss from a stale rejection."""
        term = self.log.term(progress.match)
        if term is None:
            # That entry is compacted away: no probe can name it. Restart the follower's
            # replication from its hint (a snapshot, if needed) without concluding anything.
            progress.match, progress.next = 0, max(hint, 0) + 1
            progress.state = ProgressState.PROBE
            progress.probe_sent = False
            progress.inflight.clear()
            self.maybe_send_append(peer, send_if_empty=True)
            return
        if not progress.verify_nonce:
            self._verify_counter += 1
            progress.verify_nonce = self._verify_counter
        # else: a round is out; ask again under its nonce, so that the answer to any of its
        # probes settles it. A fresh nonce per rejection never settled while the follower's
        # answers took longer than a heartbeat (every heartbeat answer re-opens a probe,
        # whose rejection superseded the round before its answer came: 200 rejections and
        # 6 s under the rollback fault's slowed link, found by the rule watch).
        self._send(
            Message(
                _MT.APPEND,
                self.id,
                peer,
                self._term,
                log_term=term,
                index=progress.match,
                commit=min(self.log.committed, progress.match),
                context=encode_verify(progress.verify_nonce),
            )
        )

    def follower_log_went_backwards(self, peer: NodeId, progress: Progress, last: int) -> None:
        """A follower whose log lost entries it had acknowledged (wiped, restored from an
        older copy): say so, forget its progress, and bring it back from where its log
        really ends (entries, or a snapshot if those were compacted). Without this the
        leader keeps probing at match + 1 forever: a rejection at or below `match` looks
        stale to the flow control (progress.maybe_decrease_to)."""
        self._warnings.append(
            f"follower {peer}'s log went backwards: it rejected an APPEND after index "
            f"{progress.match}, which it had acknowledged, and its log ends at or below "
            f"{last}; resetting its progress and sending it the missing entries; it will "
            f"not vote until it has caught up to {max(progress.match, progress.catch_up_to)}"
        )
        progress.reset_after_lost_entries(last)
        self.maybe_send_append(peer, send_if_empty=True)

    def follower_log_diverged(
        self, peer: NodeId, progress: Progress, at: int, their_commit: int
    ) -> None:
        """`peer`'s committed log conflicts with ours from index `at` on (at or below
        its commit index `their_commit`): it applied entries this cluster no longer has,
        which only lost durable state elsewhere can cause (a voter lost acknowledged
        entries and elected a leader without them). Say so once, count it for nothing
        (match 0) and stop streaming to it. Its refusals are not stale rejections: taken
        for ones (`Progress.maybe_decrease_to`), they had the leader probe it forever
        while it served, silently, writes the cluster no longer has. A heartbeat answer
        re-opens one probe, so a follower replaced in the meantime is found again."""
        if progress.reported_divergence != (at, their_commit):
            progress.reported_divergence = (at, their_commit)
            self._errors.append(
                f"follower {peer}'s committed log diverged from ours at index {at} (its "
                f"commit index {their_commit}, ours {self.log.committed}): it applied "
                "entries this cluster no longer has (lost by a node's disk?). It gets no "
                "entries and no vote; it is repaired with our snapshot once we have one "
                f"beyond index {their_commit}"
            )
        progress.diverged = (at, their_commit)
        progress.match = 0
        progress.verify_nonce = 0
        progress.catch_up_to = 0
        progress.become_probe()
        progress.next = self.log.last_index() + 1
        progress.probe_sent = True  # paused until a heartbeat answer
        self.maybe_send_repair_snapshot(peer, progress)

    def maybe_send_repair_snapshot(self, peer: NodeId, progress: Progress) -> bool:
        """Repair a diverged follower: our snapshot, if it lies beyond the follower's
        commit index, replaces its whole log and its state machine (it installs any
        snapshot beyond its commit index). Below that it would not: nothing lowers a
        commit or applied index, and a store refuses a snapshot older than its own. Until
        then `repair_snapshot_wanted` asks the shell for one. Returns whether it is sent."""
        their_commit = progress.diverged[1] if progress.diverged else 0
        snapshot = self._snapshot
        if not progress.diverged or snapshot is None or snapshot.index <= their_commit:
            return False
        progress.diverged = ()  # from here on, ordinary snapshot flow control (match 0)
        progress.become_snapshot(snapshot.index)
        return self.send_snapshot(peer, progress)

    def repair_snapshot_wanted(self) -> int:
        """Leader: 0, or an index its next snapshot must lie beyond to repair a follower
        whose committed log diverged (the follower's commit index): the shell should take
        one as soon as its applied index passes it, whatever its usual schedule."""
        if self._role is not Role.LEADER:
            return 0
        wanted = max((p.diverged[1] for p in self.progress.values() if p.diverged), default=0)
        snapshot_index = self._snapshot.index if self._snapshot is not None else 0
        return wanted if wanted >= snapshot_index else 0

    def probe_diverged_follower(self, peer: NodeId, progress: Progress) -> None:
        """One APPEND at our last entry, marked with a fresh nonce: a follower still
        diverged answers "diverged" again; any other fresh answer (the node was replaced
        by a new one) puts it back under ordinary flow control."""
        self._verify_counter += 1
        progress.verify_nonce = self._verify_counter
        last = self.log.last_index()
        self._send(
            Message(
                _MT.APPEND, self.id, peer, self._term, log_term=self.log.last_term(),
                index=last, context=encode_verify(progress.verify_nonce),
            )
        )

    def maybe_commit(self) -> bool:
        """Advance the commit index to the highest index a majority holds, if that entry
        is of the current term. Returns whether the commit index moved."""
        index = self.quorum_match_index()
        if index <= self.log.committed or not self.may_commit_at(index):
            return False
        self.log.commit_to(index)
        if not self._committed_in_term:
            self._committed_in_term = True
            queued = self.reads.take_awaiting_barrier()
            if queued:
                self._start_read_round(queued)
        return True

    def quorum_match_index(self) -> int:
        """The highest index stored durably on a majority, counting ourselves only up to
        our durable index: the shell may send APPENDs before its own fsync (thesis
        §10.2.1), so entries merely in our memory are not yet a replica."""
        voters = self._voter_set
        matches = [p.match for peer, p in self.progress.items() if peer in voters]
        if self.id in voters:
            matches.append(min(self.durable_index, self.log.last_index()))
        matches.sort(reverse=True)
        if len(matches) < self.quorum:
            return 0  # a voter has no progress yet (cannot happen on a leader)
        return matches[self.quorum - 1]

    def may_commit_at(self, index: int) -> bool:
        """Raft §5.4.2 (Figure 8): only an entry of the current term may be committed by
        counting replicas; earlier entries are committed indirectly, by Log Matching."""
        return self.log.term(index) == self._term

    def maybe_send_append(self, to: NodeId, send_if_empty: bool,
                          commit_now: bool = False) -> bool:
        """Send `to` the entries it lacks (bounded by the batch limits), or a snapshot if
        they were compacted away. With nothing new to send, an empty APPEND only to raise
        its commit index when `send_if_empty`, or when the index moved and either the
        config is `eager_commit` or the caller says `commit_now` (a leader about to stop
        sending heartbeats). Returns whether a message was sent."""
        progress = self.progress[to]
        if progress.is_paused():
            return False
        log = self.log
        prev_index = progress.next - 1
        prev_term = log.term(prev_index)
        if prev_term is None:
            return self.send_snapshot(to, progress)
        last = log.last_index()
        committed = log.committed
        if progress.next > last:
            # Nothing new to send: an empty APPEND only to raise the follower's commit
            # index, and not while APPENDs are in flight (the last one's answer brings us
            # back here; heartbeats carry the commit index meanwhile).
            if not send_if_empty and (
                progress.inflight or progress.sent_commit >= min(committed, prev_index)
                or not (self.config.eager_commit or commit_now)
            ):
                return False
            entries: tuple[Entry, ...] = ()
        else:
            high = min(last + 1, progress.next + self.config.max_append_entries)
            batch = log.slice(progress.next, high)
            max_bytes = self.config.max_append_bytes
            size = 0
            for count, entry in enumerate(batch):
                size += len(entry.data)
                if size > max_bytes and count > 0:
                    del batch[count:]
                    break
            entries = tuple(batch)
        context = b""
        if progress.catch_up_to:
            if progress.match >= progress.catch_up_to:
                progress.catch_up_to = 0
            else:
                context = encode_catch_up(progress.catch_up_to)
        self._send(
            Message(
                _MT.APPEND,
                self.id,
                to,
                self._term,
                log_term=prev_term,
                index=prev_index,
                entries=entries,
                commit=committed,
                context=context,
            )
        )
        progress.sent_commit = committed
        if entries:
            progress.sent_entries(entries[-1].index)
        elif progress.state is ProgressState.PROBE:
            progress.probe_sent = True
        return True

    def send_snapshot(self, to: NodeId, progress: Progress) -> bool:
        """InstallSnapshot (Raft §7): send the chunk of our latest snapshot at the offset
        `to` acknowledged. Returns whether a chunk was sent."""
        snapshot = self._snapshot
        if snapshot is None:
            return False  # cannot happen: entries are only compacted into a snapshot
        if (
            progress.state is not ProgressState.SNAPSHOT
            or progress.pending_snapshot != snapshot.index
        ):
            progress.become_snapshot(snapshot.index)
        offset = progress.snapshot_offset
        chunk = self.config.snapshot_chunk_bytes
        data = self._snapshot_data[offset : offset + chunk]
        done = offset + chunk >= len(self._snapshot_data)
        self._send(
            Message(
                _MT.SNAPSHOT,
                self.id,
                to,
                self._term,
                index=snapshot.index,
                snapshot=snapshot,
                offset=offset,
                data=data,
                done=done,
            )
        )
        progress.probe_sent = True
        progress.snapshot_idle_ticks = 0
        return True

    def snapshot_resend_ticks(self) -> int:
        """Ticks without any answer to a snapshot chunk before it is sent again."""
        return max(2, self.config.election_timeout_ticks // 2)

    def broadcast_append(self, commit_now: bool = False) -> None:
        """Send every follower what it lacks, or the new commit index (see
        `maybe_send_append` for when an APPEND carries only that)."""
        for peer in self.peers:
            self.maybe_send_append(peer, send_if_empty=False, commit_now=commit_now)

    def broadcast_heartbeat(self) -> None:
        context = self.reads.latest_round_context()
        committed = self.log.committed
        for peer, progress in self.progress.items():
            self._send(
                Message(
                    _MT.HEARTBEAT,
                    self.id,
                    peer,
                    self._term,
                    commit=min(progress.match, committed),
                    context=context,
                )
            )

    # -- output ------------------------------------------------------------------------------------

    def _send(self, message: Message) -> None:
        self._messages.append(message)

    def _hard_state_changed(self) -> bool:
        last = self._last_hard_state
        return (
            last.term != self._term
            or last.vote != self._vote
            or last.commit != self.log.committed
            or last.catch_up_to != self._catch_up_to
        )

    def has_ready(self) -> bool:
        return bool(
            self._messages
            or self._needs_broadcast
            or self.log.has_unstable()
            or self.log.committed > self.log.applying
            or self._received_snapshot is not None
            or self._read_states
            or self._dropped_reads
            or self._warnings
            or self._errors
            or self._hard_state_changed()
        )

    def ready(self) -> Ready:
        """Take out everything the shell must do now (see `Ready` for the order)."""
        if self._needs_broadcast:
            self._needs_broadcast = False
            if self._role is Role.LEADER:
                self.broadcast_append()
        log = self.log
        hard_state = None
        must_sync = False
        if self._hard_state_changed():
            last = self._last_hard_state
            must_sync = (
                last.term != self._term
                or last.vote != self._vote
                or last.catch_up_to != self._catch_up_to
            )
            hard_state = HardState(self._term, self._vote, log.committed, self._catch_up_to)
            self._last_hard_state = hard_state
        # (Readies are carried out one at a time, so every earlier Ready is durable now.)
        term_or_vote_changed = must_sync
        entries: tuple[Entry, ...] = ()
        if log.has_unstable():
            entries = tuple(log.unstable_entries())
            log.stable_to(entries[-1].index)
            must_sync = True
        snapshot = self._received_snapshot
        snapshot_data = b""
        if snapshot is not None:
            snapshot_data = self._snapshot_data
            self._received_snapshot = None
            must_sync = True
            log.applying = max(log.applying, snapshot.index)
        committed = tuple(self.entries_to_apply())
        if committed:
            log.mark_applying(committed[-1].index)
        messages = tuple(self._messages)
        before, after = self.split_messages(messages, term_or_vote_changed)
        ready = Ready(
            hard_state=hard_state,
            entries=entries,
            snapshot=snapshot,
            snapshot_data=snapshot_data,
            must_sync=must_sync,
            messages=messages,
            messages_before_persist=before,
            messages_after_persist=after,
            committed_entries=committed,
            read_states=tuple(self._read_states),
            dropped_reads=tuple(self._dropped_reads),
            warnings=tuple(self._warnings),
            errors=tuple(self._errors),
        )
        self._messages = []
        self._read_states = []
        self._dropped_reads = []
        self._warnings = []
        self._errors = []
        self.check_invariants()
        return ready

    def split_messages(
        self, messages: tuple[Message, ...], term_or_vote_changed: bool
    ) -> tuple[tuple[Message, ...], tuple[Message, ...]]:
        """Which messages may leave before this Ready is durable, which only after.

        Only a leader's replication traffic may go early, and only when this Ready does
        not change the term or vote it is sent under: an APPEND promises nothing about
        the leader's disk, because the leader counts itself only up to `durable_index`.
        Votes and all responses promise what is on disk (Raft Figure 2): after."""
        if not messages:
            return (), ()
        if self._role is not Role.LEADER or term_or_vote_changed:
            return (), messages
        term = self._term
        before = []
        after = []
        for m in messages:
            if m.type in _FROM_LEADER and m.term == term:
                before.append(m)
            else:
                after.append(m)
        return tuple(before), tuple(after)

    def entries_to_apply(self) -> list[Entry]:
        """Committed entries not yet handed out: only committed entries are ever applied
        (and so acknowledged). Overridable so a test can break exactly this rule."""
        return self.log.next_committed()

    def advance(self, ready: Ready) -> None:
        """The shell finished `ready`: its entries are durable and applied."""
        log = self.log
        applied = log.applied
        if ready.snapshot is not None:
            applied = max(applied, ready.snapshot.index)
        if ready.committed_entries:
            applied = max(applied, ready.committed_entries[-1].index)
        if applied > log.applied:
            log.applied_to(applied)
        self.advance_durable(ready)
        self._refresh_membership()
        self.check_invariants()

    def advance_durable(self, ready: Ready) -> None:
        """Record what `ready` made durable; a leader may now count its own copy of those
        entries (and commit, if followers already answered: the thesis §10.2.1 case
        where the followers' fsyncs finished before ours)."""
        log = self.log
        durable = self.durable_index
        snapshot = ready.snapshot
        if snapshot is not None and log.snapshot_index >= snapshot.index and log.match_term(
            snapshot.index, snapshot.term
        ):
            durable = max(durable, snapshot.index)
        if ready.entries:
            first, last = ready.entries[0], ready.entries[-1]
            # Only if those entries are still ours (no step replaced them while the shell
            # was persisting) and follow what was already durable.
            if first.index <= durable + 1 and log.match_term(last.index, last.term):
                durable = max(durable, last.index)
        if durable == self.durable_index:
            return
        self.durable_index = durable
        if self._role is Role.LEADER and self.maybe_commit() and self.config.eager_commit:
            self._needs_broadcast = True

    def check_invariants(self) -> None:
        """Local invariants, asserted after every input (cheap comparisons only). A
        broken variant made by a test may override this too, so that the cluster-level
        checker, rather than this assertion, shows the effect of the broken rule."""
        log = self.log
        assert log.snapshot_index <= log.committed <= log.last_index(), (
            f"{self.id}: commit {log.committed} outside the log "
            f"[{log.snapshot_index}, {log.last_index()}]"
        )
        assert log.applied <= log.applying <= log.committed, (
            f"{self.id}: applied {log.applied} / handed out {log.applying} passed the "
            f"commit index {log.committed} (only committed entries may be applied)"
        )
        assert log.committed >= self._last_hard_state.commit, (
            f"{self.id}: commit index went backwards"
        )
        if self._role is Role.LEADER:
            assert self._leader_id == self.id and self._vote == self.id, (
                f"{self.id}: leader of term {self._term} without its own vote"
            )


def _echo(context: bytes) -> bytes:
    """What an APPEND_RESPONSE echoes of its APPEND's context: a verify nonce only."""
    return context if context.startswith(VERIFY_PREFIX) else b""


_FROM_LEADER = frozenset({MessageType.APPEND, MessageType.HEARTBEAT, MessageType.SNAPSHOT})
# Sent only by a leader or a (pre-)candidate, hence always at a term >= 1.
_REQUESTS = _FROM_LEADER | {MessageType.VOTE, MessageType.PRE_VOTE, MessageType.TIMEOUT_NOW}
