"""Deliberately broken variants of the Raft core, the node shell and the store's state machine.

Each variant breaks exactly one safety rule, by subclassing (never by flags in production
code), so that the named-interleaving tests and the randomized simulation can show that
they detect the broken rule: a safety test that cannot fail proves nothing.

Each is a `SimVariant`, importable by the CLI to replay a failing seed, e.g.
    python -m system.sim --seed 12 --variant tests.raft.broken:VOTES_TWICE
"""

from __future__ import annotations

from dataclasses import replace

from system.kv.state_machine import KVStateMachine
from system.raft.core import CampaignKind, NotLeader, ProposalDropped, RaftCore, Role
from system.raft.messages import Message, MessageType
from system.raft.types import SnapshotMeta
from system.sim.clients import Attempt, ClientOp
from system.sim.shell import NodeShell
from system.sim.state_machine import encode_write
from system.sim.variant import SimVariant

# -- the core ---------------------------------------------------------------------------


class _WithoutLocalAssertions(RaftCore):
    """The core asserts its own local invariants after every input; a broken variant
    turns them off so that the cluster-level checks (the SafetyMonitor, linearizability)
    are what shows the effect of the broken rule."""

    def check_invariants(self) -> None:
        pass


class CommitsOldTermEntries(_WithoutLocalAssertions):
    """Figure 8 broken: commits any entry a majority holds, whatever its term (Raft §5.4.2
    says only entries of the current term are committed by counting)."""

    def may_commit_at(self, index: int) -> bool:
        return True


class VotesTwice(_WithoutLocalAssertions):
    """One vote per term broken: grants every candidate whose log is up to date, even
    after voting for another candidate in the same term (Raft §5.2)."""

    def may_grant_vote(self, m: Message) -> bool:
        if m.type is MessageType.PRE_VOTE:
            return super().may_grant_vote(m)
        return self.log_is_up_to_date(m.index, m.log_term)

    def record_vote(self, candidate: str) -> None:
        self._vote = candidate


class ForgetsVoteOnRestart(_WithoutLocalAssertions):
    """Persistent vote broken: a restarted node comes back without the vote it cast
    before crashing (as if `vote` were not part of the durable hard state)."""

    def __init__(self, config, rng, restored=None) -> None:  # noqa: ANN001
        if restored is not None:
            restored = replace(restored, hard_state=replace(restored.hard_state, vote=None))
        super().__init__(config, rng, restored)


class RestoresSnapshotOnly(_WithoutLocalAssertions):
    """Restart broken: the restarted core treats everything up to the durable commit
    index as already applied, so the shell, which rebuilt its state machine from the
    snapshot alone, never re-applies the committed log entries after the snapshot."""

    def __init__(self, config, rng, restored=None) -> None:  # noqa: ANN001
        super().__init__(config, rng, restored)
        self.log.applied = self.log.applying = self.log.committed


class ReadsWithoutQuorumCheck(_WithoutLocalAssertions):
    """ReadIndex broken: a read is confirmed without a majority acknowledging a
    heartbeat round, so a deposed leader serves stale data (thesis §6.4)."""

    def read_round_confirmed(self, acks: set) -> bool:
        return True


class SkipsPreVote(_WithoutLocalAssertions):
    """PreVote broken: on election timeout the node raises its term and campaigns at
    once, so a node cut off from the cluster returns with a high term and deposes a
    healthy leader (thesis §9.6)."""

    def campaign(self, kind: CampaignKind) -> None:
        if kind is CampaignKind.PRE_ELECTION:
            kind = CampaignKind.ELECTION
        super().campaign(kind)


class InstallsSnapshotByIndexOnly(_WithoutLocalAssertions):
    """InstallSnapshot broken: a follower that already has AN entry at the snapshot's
    index keeps its log and marks it committed, without checking that entry's term
    (Raft §7: keep the log only if it holds the snapshot's last entry, index AND term)."""

    def install_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        if self.log.term(meta.index) is not None:
            self.log.commit_to(meta.index)
            return
        super().install_snapshot(meta, data)


class CountsUnsyncedOwnEntries(RaftCore):
    """Broken: the leader counts every entry of its log towards the commit quorum, as if
    it were durable the moment it was appended (the pre-§10.2.1 rule, unsafe once APPENDs
    leave before the leader's own fsync). The simulator sees it only in its pipelined
    ordering (`Simulation(pipeline=True)`), where a leader's APPENDs do leave first."""

    def quorum_match_index(self) -> int:
        matches = [p.match for p in self.progress.values()]
        matches.append(self.log.last_index())
        matches.sort(reverse=True)
        return matches[self.quorum - 1]


# -- the shell --------------------------------------------------------------------------


class AcknowledgesAtAppend(NodeShell):
    """"Acknowledged" confused with "appended": the shell answers the client as soon as
    the leader appended the write to its own log, before a majority has it (the design
    essay's lost write)."""

    def submit_write(self, op: ClientOp, attempt: Attempt) -> None:
        core = self.core
        assert core is not None and op.value is not None
        command = encode_write(op.request_id, op.key, op.value, op.expected_version)
        try:
            index, term = core.propose(command)
        except (NotLeader, ProposalDropped) as error:
            self.sim.attempt_refused(op, attempt, str(error))
            return
        attempt.index, attempt.term = index, term
        current = self.replica.read(op.key)
        self.sim.monitor.acknowledged_write(index, term, op.request_id)
        self.sim.attempt_answered(op, attempt, self.node_id, True, op.value, current.version + 1)
        self.after_input()


class SkipsFsync(NodeShell):
    """Durability broken: the shell writes what a Ready asks but never fsyncs before
    sending, so a power loss can take back a vote or an entry already promised to a
    candidate or a leader (Raft Figure 2: respond only after persisting)."""

    def skips_fsync(self) -> bool:
        return True


# -- the state machine ------------------------------------------------------------------


class IgnoresRequestIds(KVStateMachine):
    """Exactly-once broken: a retried write (same request id) is applied again (the
    store's state machine never finds the id it remembered)."""

    def _lookup(self, request_id: str, index: int) -> None:
        return None


COMMITS_OLD_TERM_ENTRIES = SimVariant(
    "commits-old-term-entries", core_class=CommitsOldTermEntries,
    description=CommitsOldTermEntries.__doc__ or "",
)
VOTES_TWICE = SimVariant("votes-twice", core_class=VotesTwice, description=VotesTwice.__doc__ or "")
FORGETS_VOTE_ON_RESTART = SimVariant(
    "forgets-vote-on-restart", core_class=ForgetsVoteOnRestart,
    description=ForgetsVoteOnRestart.__doc__ or "",
)
RESTORES_SNAPSHOT_ONLY = SimVariant(
    "restores-snapshot-only", core_class=RestoresSnapshotOnly,
    description=RestoresSnapshotOnly.__doc__ or "",
)
READS_WITHOUT_QUORUM_CHECK = SimVariant(
    "reads-without-quorum-check", core_class=ReadsWithoutQuorumCheck,
    description=ReadsWithoutQuorumCheck.__doc__ or "",
)
SKIPS_PRE_VOTE = SimVariant(
    "skips-pre-vote", core_class=SkipsPreVote, description=SkipsPreVote.__doc__ or ""
)
INSTALLS_SNAPSHOT_BY_INDEX_ONLY = SimVariant(
    "installs-snapshot-by-index-only", core_class=InstallsSnapshotByIndexOnly,
    description=InstallsSnapshotByIndexOnly.__doc__ or "",
)
ACKNOWLEDGES_AT_APPEND = SimVariant(
    "acknowledges-at-append", shell_class=AcknowledgesAtAppend,
    description=AcknowledgesAtAppend.__doc__ or "",
)
SKIPS_FSYNC = SimVariant(
    "skips-fsync", shell_class=SkipsFsync, description=SkipsFsync.__doc__ or ""
)
COUNTS_UNSYNCED_OWN_ENTRIES = SimVariant(
    "counts-unsynced-own-entries", core_class=CountsUnsyncedOwnEntries,
    description=CountsUnsyncedOwnEntries.__doc__ or "",
)
IGNORES_REQUEST_IDS = SimVariant(
    "ignores-request-ids", state_machine_class=IgnoresRequestIds,
    description=IgnoresRequestIds.__doc__ or "",
)

ALL = {
    "COMMITS_OLD_TERM_ENTRIES": COMMITS_OLD_TERM_ENTRIES,
    "VOTES_TWICE": VOTES_TWICE,
    "FORGETS_VOTE_ON_RESTART": FORGETS_VOTE_ON_RESTART,
    "RESTORES_SNAPSHOT_ONLY": RESTORES_SNAPSHOT_ONLY,
    "READS_WITHOUT_QUORUM_CHECK": READS_WITHOUT_QUORUM_CHECK,
    "SKIPS_PRE_VOTE": SKIPS_PRE_VOTE,
    "INSTALLS_SNAPSHOT_BY_INDEX_ONLY": INSTALLS_SNAPSHOT_BY_INDEX_ONLY,
    "ACKNOWLEDGES_AT_APPEND": ACKNOWLEDGES_AT_APPEND,
    "SKIPS_FSYNC": SKIPS_FSYNC,
    "IGNORES_REQUEST_IDS": IGNORES_REQUEST_IDS,
    "COUNTS_UNSYNCED_OWN_ENTRIES": COUNTS_UNSYNCED_OWN_ENTRIES,
}


# -- lost durable state (docs/raft.md, "A follower whose log went backwards") ------------


class IgnoresFollowerLogWentBackwards(_WithoutLocalAssertions):
    """The leader does not notice a follower whose log went backwards: a rejection at or
    after the index the follower had acknowledged is treated like any other (stale, by
    the flow control), so the leader probes at match + 1 forever."""

    def verify_follower_match(self, peer, progress, hint) -> None:  # noqa: ANN001
        progress.probe_sent = False  # as before: the same probe again, at match + 1


class VotesAfterLosingEntries(_WithoutLocalAssertions):
    """A voter told it lost entries it had acknowledged still votes, judging candidates
    against its shortened log (Raft §5.4.1 assumes a voter never loses what it stored)."""

    def lost_entries_forbid_vote(self) -> bool:
        return False


class AnswersBelowCommitAsMatch(_WithoutLocalAssertions):
    """A follower answers every APPEND below its commit index with "I match up to my
    commit index", without comparing the entry there with its own (the etcd shortcut,
    taken on trust): a follower whose committed log diverged from the leader's is never
    told apart from a healthy one, keeps voting, and the leader probes it forever."""

    def committed_entry_conflict(self, m: Message) -> int:
        return 0


IGNORES_FOLLOWER_LOG_WENT_BACKWARDS = SimVariant(
    "ignores-follower-log-went-backwards", core_class=IgnoresFollowerLogWentBackwards,
    description=IgnoresFollowerLogWentBackwards.__doc__ or "",
)
VOTES_AFTER_LOSING_ENTRIES = SimVariant(
    "votes-after-losing-entries", core_class=VotesAfterLosingEntries,
    description=VotesAfterLosingEntries.__doc__ or "",
)
ANSWERS_BELOW_COMMIT_AS_MATCH = SimVariant(
    "answers-below-commit-as-match", core_class=AnswersBelowCommitAsMatch,
    description=AnswersBelowCommitAsMatch.__doc__ or "",
)


# -- membership changes (thesis §4.1) -----------------------------------------------------


class AllowsTwoMembershipChangesInFlight(_WithoutLocalAssertions):
    """One change at a time broken: the leader appends a membership change while the
    previous one is not committed, so the memberships two steps apart (whose majorities
    need not overlap) can both be in use."""

    def membership_change_problem(self) -> str:
        return ""


class ChangesMembershipBeforeCommittingInTerm(_WithoutLocalAssertions):
    """The leader appends a membership change before it has committed an entry of its
    own term (the single-server change bug Ongaro reported on raft-dev in 2015): an
    uncommitted change of an earlier leader, unseen by this one, can combine with its own
    change into two memberships whose majorities do not overlap."""

    def membership_change_problem(self) -> str:
        if self._config_index > self.log.committed:
            return super().membership_change_problem()
        return ""


ALLOWS_TWO_MEMBERSHIP_CHANGES_IN_FLIGHT = SimVariant(
    "allows-two-membership-changes-in-flight", core_class=AllowsTwoMembershipChangesInFlight,
    description=AllowsTwoMembershipChangesInFlight.__doc__ or "",
)
CHANGES_MEMBERSHIP_BEFORE_COMMITTING_IN_TERM = SimVariant(
    "changes-membership-before-committing-in-term",
    core_class=ChangesMembershipBeforeCommittingInTerm,
    description=ChangesMembershipBeforeCommittingInTerm.__doc__ or "",
)

# Variants the named interleavings catch; the randomized run is measured on them
# separately (docs/raft-testing.md), since its faults rarely reach these rules.
MEMBERSHIP_AND_LOST_STATE = {
    "IGNORES_FOLLOWER_LOG_WENT_BACKWARDS": IGNORES_FOLLOWER_LOG_WENT_BACKWARDS,
    "VOTES_AFTER_LOSING_ENTRIES": VOTES_AFTER_LOSING_ENTRIES,
    "ANSWERS_BELOW_COMMIT_AS_MATCH": ANSWERS_BELOW_COMMIT_AS_MATCH,
    "ALLOWS_TWO_MEMBERSHIP_CHANGES_IN_FLIGHT": ALLOWS_TWO_MEMBERSHIP_CHANGES_IN_FLIGHT,
    "CHANGES_MEMBERSHIP_BEFORE_COMMITTING_IN_TERM": CHANGES_MEMBERSHIP_BEFORE_COMMITTING_IN_TERM,
}


# -- snapshot metadata (issue 12, point 0: the monitor takes no snapshot on trust) -----------


class SnapshotsWithCurrentTerm(NodeShell):
    """Snapshot metadata broken: the shell labels its snapshot with the node's current term
    instead of the term of the last entry it covers, so the (index, term) a follower
    installs names no entry of the log (Raft §7: the last included index AND term)."""

    def apply(self, entry) -> None:  # noqa: ANN001
        super().apply(entry)
        if self.core is not None and entry.index == self.applied_index:
            self.applied_term = self.core.term


SNAPSHOTS_WITH_CURRENT_TERM = SimVariant(
    "snapshots-with-current-term", shell_class=SnapshotsWithCurrentTerm,
    description=SnapshotsWithCurrentTerm.__doc__ or "",
)


# -- Figure 2's receiver rules (issue 12, point 0; also driven one core at a time by tests/raft/test_receiver_rules.py) ----


class CountsVotesFromOlderTerms(_WithoutLocalAssertions):
    """Broken: a granting vote response from an earlier term counts for this election."""

    def step(self, m: Message) -> None:
        if m.type is MessageType.VOTE_RESPONSE and m.term < self.term and self.role is Role.CANDIDATE:
            m = replace(m, term=self.term)
        super().step(m)


class AcceptsAppendsFromOlderTerms(_WithoutLocalAssertions):
    """Broken: an append from a deposed leader is taken as if it were current."""

    def step(self, m: Message) -> None:
        if m.type is MessageType.APPEND and m.term < self.term:
            m = replace(m, term=self.term)
        super().step(m)


class CommitsPastVerifiedEntries(_WithoutLocalAssertions):
    """Broken: the follower commits up to the leader's commit index as far as its own log
    goes, including entries the append did not verify (left by an older leader)."""

    def handle_append(self, m: Message) -> None:
        super().handle_append(m)
        if self.log.match_term(m.index, m.log_term):
            self.log.commit_to(min(m.commit, self.log.last_index()))


class TruncatesWithoutAConflict(_WithoutLocalAssertions):
    """Broken: every accepted append replaces the log after its entries, so a delayed,
    shorter append erases entries the follower already acknowledged."""

    def handle_append(self, m: Message) -> None:
        if m.entries and self.log.match_term(m.index, m.log_term) \
                and m.index >= self.log.committed:
            self.log.append(m.entries)
        super().handle_append(m)


class IgnoresHigherTermAnswers(_WithoutLocalAssertions):
    """Broken: a leader ignores a follower's answer that carries a higher term."""

    def step(self, m: Message) -> None:
        if self.role is Role.LEADER and m.term > self.term and m.type in (
                MessageType.APPEND_RESPONSE, MessageType.HEARTBEAT_RESPONSE):
            return
        super().step(m)


COUNTS_VOTES_FROM_OLDER_TERMS = SimVariant(
    "counts-votes-from-older-terms", core_class=CountsVotesFromOlderTerms,
    description=CountsVotesFromOlderTerms.__doc__ or "",
)
ACCEPTS_APPENDS_FROM_OLDER_TERMS = SimVariant(
    "accepts-appends-from-older-terms", core_class=AcceptsAppendsFromOlderTerms,
    description=AcceptsAppendsFromOlderTerms.__doc__ or "",
)
COMMITS_PAST_VERIFIED_ENTRIES = SimVariant(
    "commits-past-verified-entries", core_class=CommitsPastVerifiedEntries,
    description=CommitsPastVerifiedEntries.__doc__ or "",
)
TRUNCATES_WITHOUT_A_CONFLICT = SimVariant(
    "truncates-without-a-conflict", core_class=TruncatesWithoutAConflict,
    description=TruncatesWithoutAConflict.__doc__ or "",
)
IGNORES_HIGHER_TERM_ANSWERS = SimVariant(
    "ignores-higher-term-answers", core_class=IgnoresHigherTermAnswers,
    description=IgnoresHigherTermAnswers.__doc__ or "",
)

# Variants of issue 12's point 0, measured before and after the randomized run learned to
# vary the configuration and hold messages across terms (docs/raft-testing.md).
EXPLORATION = {
    "SNAPSHOTS_WITH_CURRENT_TERM": SNAPSHOTS_WITH_CURRENT_TERM,
    "COUNTS_VOTES_FROM_OLDER_TERMS": COUNTS_VOTES_FROM_OLDER_TERMS,
    "ACCEPTS_APPENDS_FROM_OLDER_TERMS": ACCEPTS_APPENDS_FROM_OLDER_TERMS,
    "COMMITS_PAST_VERIFIED_ENTRIES": COMMITS_PAST_VERIFIED_ENTRIES,
    "TRUNCATES_WITHOUT_A_CONFLICT": TRUNCATES_WITHOUT_A_CONFLICT,
    "IGNORES_HIGHER_TERM_ANSWERS": IGNORES_HIGHER_TERM_ANSWERS,
}
