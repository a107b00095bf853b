"""Deliberately broken variants of the Raft core, the node shell and the store's state machine.

Each variant breaks exactly one safety rule, by subclassing (never by flags in production
code), so that the named-interleaving tests and the randomized simulation can show that
they detect the broken rule: a safety test that cannot fail proves nothing.

Each is a `SimVariant`, importable by the CLI to replay a failing seed, e.g.
    python -m system.sim --seed 12 --variant tests.raft.broken:VOTES_TWICE

The broken cores live in the product's unsafe area, system/raft/unsafe.py, so that the
harness can run them too (`python -m nemesis run --unsafe votes-twice`, a real node with
`serve --unsafe votes-twice`); this module re-exports them and their simulator variants
(system/sim/unsafe.py) under the names the tests use. The broken shells and state machine
below are the simulator's own and stay here.
"""

from __future__ import annotations

from system.kv.state_machine import KVStateMachine
from system.raft.core import NotLeader, ProposalDropped, RaftCore
from system.raft.unsafe import (  # noqa: F401 - re-exported for the tests
    AcceptsAppendsFromOlderTerms,
    AllowsTwoMembershipChangesInFlight,
    AnswersBelowCommitAsMatch,
    ChangesMembershipBeforeCommittingInTerm,
    CommitsOldTermEntries,
    CommitsPastVerifiedEntries,
    CountsVotesFromOlderTerms,
    ForgetsVoteOnRestart,
    IgnoresFollowerLogWentBackwards,
    IgnoresHigherTermAnswers,
    InstallsSnapshotByIndexOnly,
    ReadsWithoutQuorumCheck,
    RestoresSnapshotOnly,
    SkipsPreVote,
    TruncatesWithoutAConflict,
    VotesAfterLosingEntries,
    VotesTwice,
)
from system.sim import unsafe as sim_unsafe
from system.sim.clients import Attempt, ClientOp
from system.sim.shell import NodeShell
from system.sim.state_machine import encode_write
from system.sim.variant import SimVariant

# -- the core (system/raft/unsafe.py) ------------------------------------------------------

COMMITS_OLD_TERM_ENTRIES = sim_unsafe.COMMITS_OLD_TERM_ENTRIES
VOTES_TWICE = sim_unsafe.VOTES_TWICE
FORGETS_VOTE_ON_RESTART = sim_unsafe.FORGETS_VOTE_ON_RESTART
RESTORES_SNAPSHOT_ONLY = sim_unsafe.RESTORES_SNAPSHOT_ONLY
READS_WITHOUT_QUORUM_CHECK = sim_unsafe.READS_WITHOUT_QUORUM_CHECK
SKIPS_PRE_VOTE = sim_unsafe.SKIPS_PRE_VOTE
INSTALLS_SNAPSHOT_BY_INDEX_ONLY = sim_unsafe.INSTALLS_SNAPSHOT_BY_INDEX_ONLY
IGNORES_FOLLOWER_LOG_WENT_BACKWARDS = sim_unsafe.IGNORES_FOLLOWER_LOG_WENT_BACKWARDS
VOTES_AFTER_LOSING_ENTRIES = sim_unsafe.VOTES_AFTER_LOSING_ENTRIES
ANSWERS_BELOW_COMMIT_AS_MATCH = sim_unsafe.ANSWERS_BELOW_COMMIT_AS_MATCH
ALLOWS_TWO_MEMBERSHIP_CHANGES_IN_FLIGHT = sim_unsafe.ALLOWS_TWO_MEMBERSHIP_CHANGES_IN_FLIGHT
CHANGES_MEMBERSHIP_BEFORE_COMMITTING_IN_TERM = sim_unsafe.CHANGES_MEMBERSHIP_BEFORE_COMMITTING_IN_TERM
COUNTS_VOTES_FROM_OLDER_TERMS = sim_unsafe.COUNTS_VOTES_FROM_OLDER_TERMS
ACCEPTS_APPENDS_FROM_OLDER_TERMS = sim_unsafe.ACCEPTS_APPENDS_FROM_OLDER_TERMS
COMMITS_PAST_VERIFIED_ENTRIES = sim_unsafe.COMMITS_PAST_VERIFIED_ENTRIES
TRUNCATES_WITHOUT_A_CONFLICT = sim_unsafe.TRUNCATES_WITHOUT_A_CONFLICT
IGNORES_HIGHER_TERM_ANSWERS = sim_unsafe.IGNORES_HIGHER_TERM_ANSWERS


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
