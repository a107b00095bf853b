"""Raft's Figure 2 rules, checked from outside the core on every input it takes.

What it is for: a rule broken inside the core (a planted bug, a refactoring gone wrong)
often leaves no trace in any client's history — a leader that ignores a higher term, or
commits an entry of an older term by counting, is usually rescued by the next election or
the next append. The core's own assertions (`RaftCore.check_invariants`) look at one state;
this watch looks at each transition — the state before an input, the input, the state
after — and compares it with what Figure 2 of the Raft paper allows:

- a message of a higher term moves the node to that term (PreVote traffic, and the vote
  requests a node in a leader's lease ignores, excepted: thesis §9.6, §4.2.3);
- an APPEND of an older term changes neither the log nor the commit index;
- an APPEND truncates the log only from an entry that conflicts with one it carries;
- a follower commits no further than the last entry the APPEND verified;
- a follower told of an entry that contradicts its committed log says so (Raft §5.4);
- a snapshot is installed over a log only if the log holds its last entry, index and
  term (Raft §7);
- a node votes at most once per term;
- with PreVote on, a node raises its term to stand for election only once a majority
  granted its pre-vote for that term, or when the leader told it to (TIMEOUT_NOW:
  thesis §9.6, §3.10);
- a candidate becomes leader only with the grants of a majority of voters in its term;
- a leader never shortens its log (Leader Append-Only);
- a leader moves its commit index only to an entry of its own term (Figure 8), held by a
  majority, counting its own copy only up to what its disk has made durable (§10.2.1);
- a leader changes membership one server at a time, with the previous change committed
  and an entry of its own term committed first (thesis §4.1);
- a leader whose follower keeps rejecting APPENDs at or after the index it acknowledged
  finds out why (Figure 2: "decrement nextIndex and retry"; docs/raft.md, a follower
  whose log went backwards) rather than probing the same index forever.

The node shells (system/kv/node.py, system/sim/shell.py) call the core through it and log
each finding with a `safety` field; the harness gathers them into the history and a run
with one is INVALID (checker/safety_reports.py).

What it must never do: change the core or its inputs, or find a broken rule in the safe
core (tests/raft/test_watch.py runs the safe core through the simulator's swarm and
demands silence). Pure: no clock, I/O or randomness; cheap enough to run on every message.
"""

from __future__ import annotations

from typing import NamedTuple

from system.raft.core import RaftCore, Ready, Role
from system.raft.messages import Message, MessageType

MAX_REPORTS = 100  # per node: the first ones say what broke; the rest would repeat it
# A follower rejecting, this many times in a row, APPENDs at or after the index it had
# acknowledged, its leader's record of it unchanged: the leader probes it forever. The safe
# core settles it in one verify round (a stale duplicate rejection, or a log that went
# backwards: docs/raft.md); the real node re-probes with every heartbeat answer, so this is
# a few seconds of probing one index.
REJECTED_AT_MATCH_LIMIT = 200

# Messages whose higher term need not move the node (see the module docstring).
_TERM_EXEMPT = frozenset({MessageType.PRE_VOTE, MessageType.VOTE})


class _Before(NamedTuple):
    term: int
    role: Role
    vote: str | None
    committed: int
    last: int
    conflict: int  # APPEND overlapping our log: the first index it contradicts (0: none)


class RuleWatch:
    def __init__(self) -> None:
        self.reports: list[tuple[str, str]] = []  # (rule, what was seen), oldest first
        self._reported = 0
        self._grants: set[str] = set()  # granted VOTE answers of `_grant_term`
        self._grant_term = 0
        self._pre_grants: set[str] = set()  # granted PRE_VOTE answers for `_pre_grant_term`
        self._pre_grant_term = 0
        # follower -> ((term, its match), rejections at or after it in a row)
        self._rejected_at_match: dict[str, tuple[tuple[int, int], int]] = {}

    # -- the calls a shell makes instead of the core's ----------------------------------

    def step(self, core: RaftCore, m: Message) -> None:
        ignored = core.ignored_message_count
        try:
            before = self._before(core, m)
            if m.type is MessageType.VOTE_RESPONSE and not m.reject \
                    and m.term == before.term and before.role is Role.CANDIDATE:
                self._note_grant(m.term, m.src)
            if m.type is MessageType.PRE_VOTE_RESPONSE and not m.reject \
                    and m.term == before.term + 1 and before.role is Role.PRE_CANDIDATE:
                if m.term != self._pre_grant_term:
                    self._pre_grant_term, self._pre_grants = m.term, set()
                self._pre_grants.add(m.src)
        except (AttributeError, TypeError, ValueError):
            # Not a well-formed Message: the core refuses it (`malformed`) and the node
            # goes on; the watch has nothing to compare and must not stop it either.
            core.step(m)
            return
        match = None
        if m.type is MessageType.APPEND_RESPONSE and before.role is Role.LEADER \
                and m.term == before.term and (progress := core.progress.get(m.src)) is not None:
            match = progress.match
        core.step(m)
        if core.ignored_message_count == ignored:  # malformed input is the core's to refuse
            self._after_step(core, m, before)
            if match is not None:
                self._check_rejections(core, m, match)
        self._after_input(core, before, told_to_campaign=m.type is MessageType.TIMEOUT_NOW)

    def tick(self, core: RaftCore) -> None:
        before = self._before(core, None)
        core.tick()
        self._after_input(core, before)

    def advance(self, core: RaftCore, ready: Ready) -> None:
        before = self._before(core, None)
        core.advance(ready)
        self._after_input(core, before)

    def change_membership(self, core: RaftCore, kind, node: str, info: str = ""
                          ) -> tuple[int, int]:  # noqa: ANN001 - MembershipChangeKind
        committed, config_index = core.log.committed, core.config_index
        committed_term = core.log.term(committed)
        index, term = core.change_membership(kind, node, info)
        if config_index > committed:
            self._report("membership-changes-overlap",
                         f"{core.id}, leader of term {term}, appended a membership change at "
                         f"{index} while the one at {config_index} was not committed "
                         f"(commit {committed}): one change at a time (Raft thesis §4.1)")
        if committed_term != term:
            self._report("membership-change-before-commit-in-term",
                         f"{core.id}, leader of term {term}, appended a membership change at "
                         f"{index} before committing an entry of its term (its commit "
                         f"{committed} is of term {committed_term}): Raft thesis §4.1, "
                         f"Ongaro's raft-dev correction of 2015")
        return index, term

    def take(self) -> list[tuple[str, str]]:
        """The findings since the last call."""
        fresh = self.reports[self._reported:]
        self._reported = len(self.reports)
        return fresh

    # -- the rules ------------------------------------------------------------------------

    def _before(self, core: RaftCore, m: Message | None) -> _Before:
        log = core.log
        last = log.last_index()
        conflict = 0
        if m is not None and m.type is MessageType.APPEND and m.index <= last:
            conflict = _first_conflict(core, m)
        return _Before(core.term, core.role, core.vote, log.committed, last, conflict)

    def _after_step(self, core: RaftCore, m: Message, b: _Before) -> None:
        mtype = m.type
        if m.term <= b.term and mtype is not MessageType.APPEND \
                and mtype is not MessageType.SNAPSHOT:
            return  # the common case (an answer, a heartbeat): nothing to compare
        if m.term > b.term and core.term < m.term and mtype not in _TERM_EXEMPT and not (
                mtype is MessageType.PRE_VOTE_RESPONSE and not m.reject):
            self._report("higher-term-ignored",
                         f"{core.id} ({b.role.value}, term {b.term}) took a "
                         f"{mtype.name} of term {m.term} from {m.src} and stayed at term "
                         f"{core.term}: a higher term makes a server a follower of it "
                         f"(Raft Figure 2)")
        if mtype is MessageType.SNAPSHOT and m.snapshot is not None:
            self._check_snapshot(core, m, b)
        if mtype is not MessageType.APPEND:
            return
        log = core.log
        last, committed = log.last_index(), log.committed
        if m.term < b.term:
            if last != b.last or committed != b.committed:
                self._report("stale-append-taken",
                             f"{core.id} (term {b.term}) took an APPEND of term {m.term} "
                             f"from {m.src}: log end {b.last} -> {last}, commit "
                             f"{b.committed} -> {committed}; an append of an older term "
                             f"must be refused (Raft Figure 2)")
            return
        if last < b.last and (b.conflict == 0 or last < b.conflict - 1):
            where = f"the first conflict is at {b.conflict}" if b.conflict else \
                "none of its entries conflicts with ours"
            self._report("truncated-without-conflict",
                         f"{core.id} cut its log from {b.last} to {last} on an APPEND from "
                         f"{m.src} (entries {m.index + 1}..{m.index + len(m.entries)}); "
                         f"{where}: only a conflicting entry may remove entries "
                         f"(Raft Figure 2)")
        if 0 < b.conflict <= b.committed and not core.log_diverged:
            self._report("committed-conflict-unnoticed",
                         f"{core.id} took an APPEND from {m.src} whose entry at {b.conflict} "
                         f"contradicts its own, at or below its commit index {b.committed}, "
                         f"and did not say its committed log diverged: a committed entry "
                         f"is never overwritten (Raft §5.4), so the two logs cannot both "
                         f"be right")
        verified = m.index + len(m.entries)
        if committed > max(b.committed, verified):
            self._report("commit-past-verified",
                         f"{core.id} moved its commit index {b.committed} -> {committed} "
                         f"on an APPEND from {m.src} that verified entries only up to "
                         f"{verified}: commit = min(leaderCommit, index of last new entry) "
                         f"(Raft Figure 2)")

    def _check_rejections(self, core: RaftCore, m: Message, match: int) -> None:
        progress = core.progress.get(m.src)
        if not m.reject or progress is None or progress.match != match or match == 0 \
                or m.index < match or progress.diverged:
            self._rejected_at_match.pop(m.src, None)
            return
        key = (core.term, match)
        seen, count = self._rejected_at_match.get(m.src, (key, 0))
        count = count + 1 if seen == key else 1
        self._rejected_at_match[m.src] = (key, count)
        if count == REJECTED_AT_MATCH_LIMIT:
            self._report("rejections-at-match-ignored",
                         f"{core.id}, leader of term {core.term}, took {count} rejections in a "
                         f"row from {m.src} of APPENDs at or after index {match}, which "
                         f"{m.src} had acknowledged, and still records it as matching there: "
                         f"its log went backwards (or the rejections are stale) and the "
                         f"leader must find out which, not probe the same index forever "
                         f"(Figure 2: decrement nextIndex and retry; docs/raft.md)")

    def _check_snapshot(self, core: RaftCore, m: Message, b: _Before) -> None:
        meta, log = m.snapshot, core.log
        if meta.index <= b.committed or log.committed < meta.index:
            return  # not installed (yet)
        ours = log.term(meta.index)
        if ours is not None and ours != meta.term:
            self._report("snapshot-kept-conflicting-log",
                         f"{core.id} took {m.src}'s snapshot up to {meta.index} (term "
                         f"{meta.term}) and kept a log whose entry there is of term {ours}: "
                         f"the log is kept only if it holds the snapshot's last entry, index "
                         f"and term (Raft §7)")

    def _after_input(self, core: RaftCore, b: _Before, told_to_campaign: bool = False) -> None:
        role, term = core.role, core.term
        if term > b.term and core.vote == core.id and role in (Role.CANDIDATE, Role.LEADER) \
                and core.config.pre_vote and not told_to_campaign:
            self._check_pre_vote(core)
        if term == b.term and b.vote is not None and core.vote != b.vote:
            self._report("voted-twice",
                         f"{core.id} voted for {b.vote} and then for {core.vote} in term "
                         f"{term}: one vote per term (Raft Figure 2)")
        if role is not Role.LEADER:
            return
        if b.role is not Role.LEADER or b.term != term:
            self._check_election(core)
            return
        log = core.log
        if log.last_index() < b.last:
            self._report("leader-log-shrank",
                         f"{core.id}, leader of term {term}, cut its log from {b.last} to "
                         f"{log.last_index()}: a leader never overwrites or deletes its "
                         f"entries (Raft Figure 3, Leader Append-Only)")
        committed = log.committed
        if committed <= b.committed:
            return
        entry_term = log.term(committed)
        if entry_term != term:
            self._report("leader-committed-old-term",
                         f"{core.id}, leader of term {term}, moved its commit index "
                         f"{b.committed} -> {committed}, an entry of term {entry_term}: "
                         f"only entries of the leader's term commit by counting "
                         f"(Raft §5.4.2, Figure 8)")
        held = _quorum_match(core)
        if committed > held:
            self._report("leader-committed-without-majority",
                         f"{core.id}, leader of term {term}, moved its commit index "
                         f"{b.committed} -> {committed}, but a majority holds only up to "
                         f"{held} (its own copy counts up to its durable index "
                         f"{core.durable_index}: Raft thesis §10.2.1)")

    def _check_election(self, core: RaftCore) -> None:
        voters = set(core.membership.voters)
        granted = ({core.id} | (self._grants if self._grant_term == core.term else set()))
        count = len(granted & voters)
        if count < len(voters) // 2 + 1:
            self._report("leader-without-majority-of-votes",
                         f"{core.id} became leader of term {core.term} with the votes of "
                         f"{sorted(granted & voters)} of the term: a majority of "
                         f"{sorted(voters)} must grant (Raft Figure 2)")

    def _check_pre_vote(self, core: RaftCore) -> None:
        voters = set(core.membership.voters)
        granted = {core.id} | (self._pre_grants if self._pre_grant_term == core.term else set())
        if len(granted & voters) < len(voters) // 2 + 1:
            self._report("election-without-pre-vote",
                         f"{core.id} raised its term to {core.term} to stand for election "
                         f"with the pre-votes of {sorted(granted & voters)} only: with "
                         f"PreVote on, a majority of {sorted(voters)} must grant first, or "
                         f"the leader must hand over (TIMEOUT_NOW), or a node cut off comes "
                         f"back with a term that deposes a healthy leader (thesis §9.6)")

    def _note_grant(self, term: int, voter: str) -> None:
        if term != self._grant_term:
            self._grant_term, self._grants = term, set()
        self._grants.add(voter)

    def _report(self, rule: str, text: str) -> None:
        if len(self.reports) < MAX_REPORTS:
            self.reports.append((rule, text))


def _first_conflict(core: RaftCore, m: Message) -> int:
    """The first index the APPEND contradicts in our log (its previous entry, then its
    entries; compacted entries are committed and so cannot conflict); 0 when none."""
    log = core.log
    term = log.term(m.index)
    if term is not None and term != m.log_term and m.index > log.snapshot_index:
        return m.index
    overlap = log.last_index() - m.index  # entries past our log's end cannot conflict
    for entry in m.entries[:max(overlap, 0)]:
        ours = log.term(entry.index)
        if ours is not None and ours != entry.term and entry.index > log.snapshot_index:
            return entry.index
    return 0


def _quorum_match(core: RaftCore) -> int:
    """The highest index a majority of voters holds, as the leader's progress records it,
    its own copy counted up to its durable index. Written again on purpose rather than
    calling `RaftCore.quorum_match_index`: a core that counts wrong (a leader counting its
    unsynced copy) must not be the judge of its own count."""
    voters = core.membership.voters
    matches = [p.match for peer, p in core.progress.items() if peer in voters and peer != core.id]
    if core.id in voters:
        matches.append(min(core.durable_index, core.log.last_index()))
    quorum = len(voters) // 2 + 1
    if len(matches) < quorum:
        return 0
    matches.sort(reverse=True)
    return matches[quorum - 1]
