"""Test-only UNSAFE Raft cores: each breaks exactly one rule of the protocol, on purpose.

What it is for: proving that the checks can fail. A safety test, the simulator's monitor
or a harness run (`python -m nemesis run --unsafe NAME`) that never sees a broken core
proves nothing. Each variant is a subclass of RaftCore overriding one decision (never a
flag in system/raft/core.py: the real core knows nothing of this module). The unit and
simulator tests use them through tests/raft/broken.py; a real node builds its core from
one with `python -m system.kv serve --unsafe NAME` (system/kv/unsafe.py), the simulator
with `python -m nemesis run --platform sim --unsafe NAME` (system/sim/unsafe.py).

What it must never do: be reachable without the variant's name AND MAO_ALLOW_UNSAFE=1
(system/kv/unsafe.py `unsafe_mode` refuses otherwise); a safe node never builds one.
"""

from __future__ import annotations

from dataclasses import replace

from system.raft.core import CampaignKind, RaftCore, Role
from system.raft.messages import Message, MessageType
from system.raft.types import SnapshotMeta


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


# By the name `--unsafe NAME` takes, in the order `--help` lists them.
VARIANTS: dict[str, type[RaftCore]] = {
    "commits-old-term-entries": CommitsOldTermEntries,
    "votes-twice": VotesTwice,
    "forgets-vote-on-restart": ForgetsVoteOnRestart,
    "restores-snapshot-only": RestoresSnapshotOnly,
    "reads-without-quorum-check": ReadsWithoutQuorumCheck,
    "skips-pre-vote": SkipsPreVote,
    "installs-snapshot-by-index-only": InstallsSnapshotByIndexOnly,
    "ignores-follower-log-went-backwards": IgnoresFollowerLogWentBackwards,
    "votes-after-losing-entries": VotesAfterLosingEntries,
    "answers-below-commit-as-match": AnswersBelowCommitAsMatch,
    "allows-two-membership-changes-in-flight": AllowsTwoMembershipChangesInFlight,
    "changes-membership-before-committing-in-term": ChangesMembershipBeforeCommittingInTerm,
    "counts-votes-from-older-terms": CountsVotesFromOlderTerms,
    "accepts-appends-from-older-terms": AcceptsAppendsFromOlderTerms,
    "commits-past-verified-entries": CommitsPastVerifiedEntries,
    "truncates-without-a-conflict": TruncatesWithoutAConflict,
    "ignores-higher-term-answers": IgnoresHigherTermAnswers,
}
