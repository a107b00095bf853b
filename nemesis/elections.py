"""The `election` fault: faults aimed at an election in progress.

An election is decided within a round trip of the voters hearing the candidates, so a
fault drawn on a timer almost never lands in one, and after a fault that leaves most nodes
up, PreVote, randomized timeouts and the leader lease make two candidates of one term rare
(a broken "one vote per term" was caught on local in 2 of 5 seeds, and only where every
node happened to start at once). This fault builds the election itself, from pauses and
kills alone, and watches the nodes' Status (role, term) to time each step.

- split-vote: the voters that any majority needs (n - quorum of the followers) are frozen
  (SIGSTOP / cgroup freezer), then the leader is killed. The others cannot reach a
  majority without the frozen ones, so they all become pre-candidates for the same next
  term and wait; once each says so, the voters are thawed at once and find every
  candidate's request in their sockets together. A voter that grants two candidates of
  one term (`votes-twice`) elects both.
- vote-then-restart: as far as the pre-candidates; then they are frozen too, the voters
  thawed (granting the pre-votes) and frozen again, one candidate thawed until it reports
  itself a candidate for the new term and frozen with its vote requests in the voters'
  sockets; the voters are thawed until each is at that term (it has answered), then
  killed and restarted, each frozen as soon as it answers Status (before its election
  timer can fire: containers start one after another, seconds apart). Only then is the
  second candidate (cut from the first) thawed until it is a candidate of the same term,
  frozen with its requests in the restarted voters' sockets, and the voters thawed
  together, then it. A voter that forgets its vote across a restart
  (`forgets-vote-on-restart`) elects it, and the first candidate, thawed last, finds the
  earlier grants and leads the same term too.

The start record (`election`) carries `shape`, what was aimed (`window`: the term, the
candidates, the voters) and `landed`: whether the window was open when the strike was
made (every candidate still a pre-candidate for the same term as the voters were thawed;
for vote-then-restart, the voters had moved to the first candidate's term before they
were killed, came back frozen at that term, and the second candidate became a candidate
of it while they were still frozen there), with `landed_evidence`, and what happened next (`leaders`: term -> the nodes seen
leading it in the seconds after). Healed by restarting the killed leader. Needs 5 nodes or
more (with 3 or 4 a candidate reaches a majority with the one shared voter alone).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nemesis.faults import ActiveFault, Nemesis

log = logging.getLogger("nemesis")

SHAPES = ("split-vote", "vote-then-restart", "deposed-leader", "late-grant")
HELD_LANE_SHAPES = frozenset({"late-grant"})  # need a platform that holds one peer lane
MIN_NODES = 5
POLL_S = 0.01
OPEN_TIMEOUT_S = 15.0  # the pre-candidates' election timeouts, on a loaded machine
STEP_TIMEOUT_S = 5.0  # a thawed node reaches the next step (it read its socket)
START_TIMEOUT_S = 60.0  # a restarted voter answers Status (a loaded machine)
WATCH_S = 2.0
SETTLE_S = 0.5
REQUESTS_OUT_S = 0.25  # under the election timeout's least 0.5 s
# The store's least election timeout: 25 ticks of an asyncio.sleep(0.02) loop, and a
# loaded loop only ticks slower. A node running less than this cannot have campaigned.
LEAST_ELECTION_TIMEOUT_S = 0.5
SETTLE_TIMEOUT_S = 20.0  # after the last fault's heal, the cluster agrees on one leader  # a thawed node's loop reads what waited in its sockets (a loaded machine)
  # how long the leaders of the terms after the strike are watched


def quorum(n: int) -> int:
    return n // 2 + 1


def split(nodes: list[str], leader: str, rng: Any) -> tuple[list[str], list[str]]:
    """(voters to freeze, candidates) among the followers of `leader`: with the leader
    gone and the frozen voters silent, the candidates are one short of a majority each."""
    followers = sorted(n for n in nodes if n != leader)
    frozen = sorted(rng.sample(followers, len(nodes) - quorum(len(nodes))))
    return frozen, [n for n in followers if n not in frozen]


class Election:
    """One `election` fault on a Nemesis (`begin`); the nodes it hurts are recorded."""

    def __init__(self, nemesis: Nemesis) -> None:
        self.nemesis = nemesis
        self.platform = nemesis.platform
        self.frozen: set[str] = set()  # paused by this fault and not yet resumed
        self.killed: set[str] = set()
        self.cut: list[tuple[str, str]] = []  # links this fault cut and has not healed
        self.held = False  # a peer lane held (late-grant), released at the latest by _undo
        self.watching: tuple[str, list[str]] | None = None  # lanes read (late-grant)
        self.began = time.monotonic()

    # ----- the steps ---------------------------------------------------------------------

    def begin(self) -> ActiveFault | None:
        nemesis = self.nemesis
        shapes = SHAPES if hasattr(self.platform, "hold_lane") else tuple(
            s for s in SHAPES if s not in HELD_LANE_SHAPES)
        shape = nemesis._deal("election-shape", shapes)
        settled = self._wait(self._settled_leader, SETTLE_TIMEOUT_S)
        if settled is None:
            nemesis.record("nemesis-skip", {"fault": "election", "shape": shape, "description":
                                            f"{shape}: no leader that every node follows "
                                            f"within {SETTLE_TIMEOUT_S:g} s"})
            return None
        leader, term = settled
        if shape == "deposed-leader":
            return self._deposed_leader(leader, term)
        voters, candidates = split(nemesis.nodes, leader, nemesis.rng)
        window: dict[str, Any] = {"kind": shape, "old_leader": leader, "old_term": term,
                                  "voters": voters, "candidates": candidates}

        def strike() -> tuple[bool, str]:
            term_now = self._prelude(leader, voters, candidates)
            if term_now is None:
                self._thaw(voters)
                return False, (f"{' '.join(voters + candidates)} were not all pre-candidates "
                               f"of one term within {OPEN_TIMEOUT_S:g} s of the leader's kill")
            window["term"] = term_now + 1
            if shape == "late-grant":
                return self._late_grant(voters, candidates, term_now, window)
            if shape == "split-vote":
                return self._split_vote(voters, candidates, term_now)
            return self._vote_then_restart(voters, candidates, term_now, window)

        landed, why = self._struck(strike, window)
        text = (f"{shape}: leader {leader} killed, voters {' '.join(voters)} frozen, "
                f"candidates {' '.join(candidates)} ({'landed' if landed else 'missed'}: "
                f"{why})")
        return self._record(shape, sorted(self.killed), text, window, landed, why)

    def _struck(self, strike, window: dict[str, Any]) -> tuple[bool, str]:  # noqa: ANN001
        """Run `strike` (-> landed, why) and watch who leads after it; then thaw what it
        froze. A step that fails undoes everything the fault did before the error goes on."""
        try:
            landed, why = strike()
            window["leaders"] = self._watch_leaders()
        except Exception:
            self._undo()
            raise
        self._undo_pauses()
        window["cut_until_heal"] = [list(link) for link in self.cut]
        # The record is written once the strike is made; its first step was this long before.
        window["seconds_since_first_step"] = round(time.monotonic() - self.began, 2)
        return landed, why

    def _deposed_leader(self, leader: str, term: int) -> ActiveFault:
        """Cut the leader from every peer and freeze it; once the others elect a successor
        of a newer term, heal its links to the successor's followers (not to the
        successor) and thaw it. It still believes it leads `term` (a frozen node's
        check-quorum does not run), sends its heartbeats and its clients' entries, and
        the followers answer with their newer term: the only news of it that can reach
        the old leader, which must step down on it (Raft Figure 2). A leader that ignores
        an answer of a higher term (`ignores-higher-term-answers`) goes on leading its
        old term, and the rule watch names it at the first such answer."""
        nemesis = self.nemesis
        others = [n for n in nemesis.nodes if n != leader]
        window: dict[str, Any] = {"kind": "deposed-leader", "old_leader": leader,
                                  "old_term": term}

        def strike() -> tuple[bool, str]:
            cut = [(a, b) for o in others for a, b in ((o, leader), (leader, o))]
            self.platform.cut_links(cut)
            self.cut = cut
            self._freeze([leader])
            self._step(f"leader {leader} of term {term} cut from its peers and frozen")
            successor = self._wait(lambda: self._leader_among(others, term), OPEN_TIMEOUT_S)
            if successor is None:
                return False, (f"no node of {' '.join(others)} led a term after {term} "
                               f"within {OPEN_TIMEOUT_S:g} s")
            return self._thaw_deposed(leader, term, successor, window)

        landed, why = self._struck(strike, window)
        text = (f"deposed-leader: leader {leader} of term {term} cut off and frozen, then "
                f"thawed among its successor's followers ({'landed' if landed else 'missed'}"
                f": {why})")
        return self._record("deposed-leader", [leader], text, window, landed, why)

    def _thaw_deposed(self, leader: str, term: int, successor: tuple[str, int],
                      window: dict[str, Any]) -> tuple[bool, str]:
        new, new_term = successor
        window["successor"], window["new_term"] = new, new_term
        keep = [(new, leader), (leader, new)]
        self.platform.heal_links([link for link in self.cut if link not in keep])
        self.cut = keep
        self._step(f"{new} leads term {new_term}; {leader}'s links healed but to {new}")
        self._thaw([leader])
        first = self._wait(lambda: self._status(leader), STEP_TIMEOUT_S)
        learned = self._wait(lambda: (self._term_of(leader) or 0) >= new_term, STEP_TIMEOUT_S)
        seen = (first.role, first.term) if first is not None else None
        window["first_answer_after_thaw"] = list(seen) if seen else None
        window["learned_new_term"] = learned is not None
        after = (f"it {'moved to term ' + str(self._term_of(leader)) if learned else 'stayed at term ' + str(self._term_of(leader))} "
                 f"within {STEP_TIMEOUT_S:g} s, {new} still cut from it")
        if seen != ("leader", term) and learned is None:
            return False, f"{leader} answered {seen} after its thaw, not leader of term {term}; {after}"
        return True, (f"{leader} thawed while {new} led term {new_term}, its heartbeats "
                      f"reaching the followers of term {new_term} (first answer after "
                      f"the thaw: {seen}); {after}")

    def _leader_among(self, nodes: list[str], term: int) -> tuple[str, int] | None:
        for node in nodes:
            st = self._status(node)
            if st is not None and st.role == "leader" and st.term > term:
                return node, st.term
        return None

    def _record(self, shape: str, nodes: list[str], text: str, window: dict[str, Any],
                landed: bool, why: str) -> ActiveFault:
        nemesis = self.nemesis
        why = nemesis.count_aimed(shape, landed, why)
        leaders = window.get("leaders", {})
        window["two_leaders_in_one_term"] = any(len(v) > 1 for v in leaders.values())
        seen = "; ".join(f"term {t}: {' '.join(ns)}" for t, ns in leaders.items())
        text = f"{text}; leaders after: {seen or 'none seen'}"
        return nemesis._register("election", nodes, text, self._heal(sorted(self.killed)),
                                 {"shape": shape, "target": shape, "window": window,
                                  "landed": landed, "landed_evidence": why}, "election")

    def _prelude(self, leader: str, voters: list[str], candidates: list[str]) -> int | None:
        """Cut the voters from the leader until their leader lease is over (each a
        pre-candidate: a voter grants a pre-vote only then, and a frozen node's lease does
        not run out, its ticks stop with it), freeze them, kill the leader, and wait until
        every candidate is a pre-candidate of the same term: its first round of pre-votes
        is then in the frozen voters' sockets. Returns that term, or None if they never
        all got there. (The voters keep their links to the candidates: a link cut and
        healed leaves a connection that takes the first message after the heal and drops
        it, which would stagger the answers.)"""
        cut = [(a, b) for v in voters for a, b in ((v, leader), (leader, v))]
        self.platform.cut_links(cut)
        self.cut = cut
        # Let the leader commit past every voter's log (with the candidates: they are a
        # majority with it): then each voter finds every candidate's log up to date (Raft
        # §5.4.1), whichever follower happened to lag when the leader died.
        lasts = [st.last_index for v in voters if (st := self._status(v)) is not None]
        self._wait(lambda: (st := self._status(leader)) is not None
                   and st.commit_index > max(lasts, default=0), STEP_TIMEOUT_S)
        self._step(f"voters {' '.join(voters)} cut from leader {leader}")
        term = self._wait(lambda: self._pre_candidates(voters, leaderless=True), OPEN_TIMEOUT_S)
        self._step(f"voters leaderless at term {term}; freezing them, killing {leader}")
        self._freeze(voters)
        self.nemesis.expected_down.add(leader)
        self.killed.add(leader)
        self.platform.kill(leader)
        self._heal_cut()
        if term is None:
            return None
        if self._wait(lambda: self._pre_candidates(candidates) == term, OPEN_TIMEOUT_S) is None:
            return None
        self._step(f"candidates {' '.join(candidates)} pre-candidates of term {term}")
        return term

    def _cut_candidates(self, candidates: list[str]) -> None:
        """Cut the candidates from each other until the fault heals: the first to win
        would otherwise depose the other with its first APPEND before the other's grants
        arrive (they do arrive, a few ms apart), and its vote request would move the other
        to the new term as a follower before it asks. Each still reaches every voter."""
        self.cut = [(a, b) for a in candidates for b in candidates if a != b]
        self.platform.cut_links(self.cut)

    def _heal_cut(self) -> None:
        for a, b in self.cut:
            self.platform.heal_link(a, b)
        self.cut = []

    def _split_vote(self, voters: list[str], candidates: list[str], term: int
                    ) -> tuple[bool, str]:
        """Thaw every voter at once; landed when every candidate was still a pre-candidate
        of `term` (asking for term + 1) just before."""
        self._cut_candidates(candidates)
        still = self._pre_candidates(candidates)
        self._thaw(voters)
        if still != term:
            return False, (f"the candidates were no longer all pre-candidates of term {term} "
                           f"when the voters were thawed")
        return True, (f"{' '.join(candidates)} were all pre-candidates for term {term + 1}, "
                      f"waiting on the frozen voters, when {' '.join(voters)} were thawed "
                      f"together")

    def _vote_then_restart(self, voters: list[str], candidates: list[str], term: int,
                           window: dict[str, Any]) -> tuple[bool, str]:
        first, second = candidates[0], candidates[1]
        others = candidates[2:]  # with 7 nodes or more: asked by both, like the voters
        self._cut_candidates(candidates)
        self._freeze(candidates)
        self._thaw(voters)  # they grant the queued pre-votes; the grants wait in sockets
        answered = self._wait(lambda: self._all_status(voters), STEP_TIMEOUT_S)
        # Status is answered beside the Raft loop: give the loop time to read its sockets
        # (nothing the voters do here shows on their Status).
        self.nemesis._stop.wait(SETTLE_S)
        self._step(f"voters {' '.join(voters)} thawed to answer the pre-votes")
        self._freeze(voters)
        if answered is None:
            return False, f"{' '.join(voters)} did not answer after they were thawed"
        self._thaw([first, *others])
        asked = self._wait(lambda: self._role_at(first, ("candidate", "leader"), term + 1),
                           STEP_TIMEOUT_S)
        # A candidate fsyncs its vote before it sends its requests: let them go out (into
        # the frozen voters' sockets; nothing can answer), well within its election timeout.
        self.nemesis._stop.wait(REQUESTS_OUT_S)
        self._freeze([first])
        if asked is None:
            return False, f"{first} did not become a candidate for term {term + 1}"
        self._step(f"{first} a candidate for term {term + 1}, frozen")
        self._thaw(voters)  # they grant `first`; the grants wait in its socket
        moved = self._wait(lambda: all(self._term_of(v) == term + 1 for v in voters),
                           STEP_TIMEOUT_S)
        terms = {v: self._term_of(v) for v in voters}
        window["voter_terms_before_kill"] = terms
        self._step(f"voters at terms {terms}; killing them")
        self.nemesis.expected_down.update(voters)
        self.platform.kill_nodes(voters)
        restarted = self._restart_frozen(voters)
        window["voters_restarted"] = restarted
        self._step(f"voters restarted and frozen at {restarted}; thawing {second}")
        thawed_at = time.monotonic()
        self._thaw([second])
        asked_again = self._wait(lambda: self._role_at(second, ("candidate",), term + 1),
                                 STEP_TIMEOUT_S)
        self.nemesis._stop.wait(REQUESTS_OUT_S)  # its requests wait in the voters' sockets
        second_seen = self._status(second)
        self._freeze([second])
        # Its election timer restarted when it became a candidate, after the thaw began:
        # under the least timeout it was still asking for term + 1 when it froze.
        second_ran = round(time.monotonic() - thawed_at, 2)
        window["second_ran_s"] = second_ran
        self._step(f"{second} {'a candidate for term ' + str(term + 1) if asked_again else 'not a candidate'}"
                   f", frozen; thawing the voters together, then {second}")
        self._thaw(voters)  # they answer `second` first: a thawed loop reads before it ticks
        self._thaw([second])
        self._wait(lambda: self._role_at(second, ("leader",), term + 1), STEP_TIMEOUT_S)
        self._step(f"{second} thawed; thawing {first}")
        self._thaw([first])
        if moved is None:
            return False, (f"the voters had not all reached term {term + 1} (their terms "
                           f"{terms}) when they were killed")
        late = {v: seen for v, seen in restarted.items() if seen is None
                or seen[1] != term + 1 or seen[2] >= LEAST_ELECTION_TIMEOUT_S}
        if late:
            return False, (f"restarted voters not frozen at term {term + 1} within "
                           f"{LEAST_ELECTION_TIMEOUT_S:g} s of their first answer (role, "
                           f"term, seconds from answer to freeze; none: never answered): "
                           f"{late}")
        seen = (second_seen.role, second_seen.term) if second_seen is not None else None
        if asked_again is None or seen != ("candidate", term + 1):
            return False, (f"{second} was not a candidate for term {term + 1} once thawed "
                           f"and until frozen (it answered {seen} just before)")
        if second_ran >= LEAST_ELECTION_TIMEOUT_S:
            return False, (f"{second} ran {second_ran:g} s from its thaw to its freeze: its "
                           f"election timer may have fired before the voters answered")
        return True, (f"{' '.join(voters)} answered {first}'s vote request for term "
                      f"{term + 1}, were killed, restarted and frozen at term {term + 1} "
                      f"({restarted}); {second} became a candidate for term {term + 1} "
                      f"while they were frozen there and was frozen {second_ran:g} s "
                      f"after its thaw, its requests waiting in their sockets until they "
                      f"were thawed together")

    def _late_grant(self, voters: list[str], candidates: list[str], term: int,
                    window: dict[str, Any]) -> tuple[bool, str]:
        """A vote granted in one term that reaches its candidate in the next (thesis §3.4:
        a candidate counts only grants of its current term). The voters answer the queued
        pre-votes (not to the other candidates, who stay pre-candidates); `first` is
        thawed and asks for term + 1, its request reaching `late` only, whose grant is
        held on its peer lane; `first` cannot win term + 1. Then the others are let back
        in: they grant `first`'s pre-votes and it asks for term + 2, and the moment that
        request leaves, before the others can answer, the held grant of term + 1 is
        delivered. A candidate that counts it (`counts-votes-from-older-terms`) leads term
        + 2 with one real grant short of a majority, and the rule watch names it."""
        platform, stop = self.platform, self.nemesis._stop
        late, first = voters[0], candidates[0]
        others = candidates[1:]
        rest = [*voters[1:], *others]
        window.update(candidate=first, late_voter=late)
        self._freeze(candidates)
        to_others = [(v, o) for v in voters for o in others]
        platform.cut_links(to_others)
        self.cut += to_others
        self._thaw(voters)  # they grant the queued pre-votes; `first`'s grants wait in its socket
        answered = self._wait(lambda: self._all_status(voters), STEP_TIMEOUT_S)
        stop.wait(SETTLE_S)
        self._freeze(voters)
        if answered is None:
            return False, f"{' '.join(voters)} did not answer after they were thawed"
        from_first = [(first, n) for n in rest]
        platform.cut_links(from_first)
        self.cut += from_first
        platform.hold_lane(late, first)
        self.held = True
        released = platform.release_on_vote(first, rest, term + 2, (late, first))
        self.watching = (first, rest)
        self._thaw([first])
        asked = self._wait(lambda: self._role_at(first, ("candidate",), term + 1),
                           STEP_TIMEOUT_S)
        stop.wait(REQUESTS_OUT_S)  # its requests: into `late`'s socket, the rest cut
        if asked is None:
            return False, f"{first} did not become a candidate for term {term + 1}"
        self._step(f"{first} a candidate for term {term + 1}; thawing {late}, its answers held")
        self._thaw([late])
        voted = self._wait(lambda: self._term_of(late) == term + 1, STEP_TIMEOUT_S)
        stop.wait(SETTLE_S)  # it answers once its vote is durable
        self._freeze([late])
        held = platform.lane_held_bytes(late, first)
        window["held_bytes"] = held
        if voted is None or not held:
            return False, (f"{late} {'did not move to term ' + str(term + 1) if voted is None else 'sent nothing'}"
                           f" after {first} asked for its vote")
        platform.heal_links(from_first + to_others)
        self.cut = [link for link in self.cut if link not in from_first + to_others]
        self._step(f"{late}'s grant for term {term + 1} held ({held} bytes); thawing {' '.join(rest)}")
        self._thaw(rest)
        fired = self._wait(released.is_set, OPEN_TIMEOUT_S)
        self._wait(lambda: self._role_at(first, ("leader",), term + 2), STEP_TIMEOUT_S)
        window["first_after"] = list(s) if (s := self._role_term(first)) else None
        if fired is None:
            return False, (f"{first} did not ask for term {term + 2} within "
                           f"{OPEN_TIMEOUT_S:g} s of {' '.join(rest)}'s thaw")
        return True, (f"{late} granted {first} term {term + 1}, held; {first} lost that "
                      f"term, won pre-votes for term {term + 2} from {' '.join(rest)}, and "
                      f"the held grant ({held} bytes) reached it as it asked for votes of "
                      f"term {term + 2}; it then answered {window['first_after']}")

    def _role_term(self, node: str) -> tuple[str, int] | None:
        st = self._status(node)
        return (st.role, st.term) if st is not None else None

    def _restart_frozen(self, voters: list[str]) -> dict[str, list[Any] | None]:
        """Start each killed voter and freeze it as soon as it answers Status, within its
        first election timeout (0.5 s at least): started one after another (a container
        takes seconds), the first would otherwise campaign for the next term while the
        others start, and take the second candidate there with it. Returns voter ->
        [role, term, seconds from that answer to the end of its freeze] as it first
        answered (None: it never did; it is not frozen). Its Raft loop ticks from about
        when it serves Status: a freeze under the least election timeout after the answer
        is in time."""
        seen: dict[str, list[Any] | None] = {}
        for v in voters:
            self.platform.start_node(v)
            st = self._wait(lambda v=v: self._status(v) or self.platform.exit_code(v) is not None,
                            START_TIMEOUT_S)
            if st is not None and st is not True:
                answered = time.monotonic()
                self._freeze([v])
                seen[v] = [st.role, st.term, round(time.monotonic() - answered, 2)]
            else:
                seen[v] = None
            self.nemesis.expected_down.discard(v)
        return seen

    def _step(self, what: str) -> None:
        """One step of the fault, in harness.log with the seconds since it began."""
        log.info("election fault, %.2f s: %s", time.monotonic() - self.began, what)

    def _heal(self, killed: list[str]):  # noqa: ANN202
        def heal() -> dict[str, Any]:
            self._heal_cut()
            for node in killed:
                if not self.platform.is_running(node):
                    self.platform.start_node(node)
                self.nemesis.expected_down.discard(node)
            return {}
        return heal

    # ----- pauses, undone whatever happens ----------------------------------------------

    def _freeze(self, nodes: list[str]) -> None:
        for node in nodes:
            self.frozen.add(node)
            self.platform.pause(node)

    def _thaw(self, nodes: list[str]) -> None:
        for node in nodes:
            self.platform.resume(node)
            self.frozen.discard(node)

    def _undo_pauses(self) -> None:
        self._thaw(sorted(self.frozen))
        self._undo_lanes()

    def _undo_lanes(self) -> None:
        if self.watching is not None:
            self.platform.stop_watching(*self.watching)
            self.watching = None
        if self.held:
            self.platform.release_held()
            self.held = False

    def _undo(self) -> None:
        """A step failed: nothing of this fault may stay in place."""
        try:
            self._undo_pauses()
            self._heal_cut()
        finally:
            for node in sorted(self.killed):
                if not self.platform.is_running(node):
                    self.platform.start_node(node)
                self.nemesis.expected_down.discard(node)

    # ----- watching -----------------------------------------------------------------------

    def _status(self, node: str) -> Any:
        if node in self.frozen:
            return None  # a frozen node cannot answer; do not wait for it
        return self.platform.status(node, timeout_s=0.3)

    def _settled_leader(self) -> tuple[str, int] | None:
        """(leader, term) when every node answers and follows the same leader in the same
        term: an election of the fault's own making must not race one already going on
        (a deposed leader that still says it leads would be the wrong one to kill)."""
        seen = set()
        for node in self.nemesis.nodes:
            st = self._status(node)
            if st is None or not st.leader_id:
                return None
            seen.add((st.leader_id, st.term))
        return seen.pop() if len(seen) == 1 else None

    def _pre_candidates(self, nodes: list[str], leaderless: bool = False) -> int | None:
        """The term every one of `nodes` is a pre-candidate of, or None. `leaderless`:
        or a follower that knows no leader (a pre-candidate refused by a majority)."""
        terms = set()
        for node in nodes:
            st = self._status(node)
            if st is None or not (st.role == "pre-candidate" or (
                    leaderless and st.role == "follower" and not st.leader_id)):
                return None
            terms.add(st.term)
        return terms.pop() if len(terms) == 1 else None

    def _all_status(self, nodes: list[str]) -> bool:
        return all(self._status(n) is not None for n in nodes)

    def _role_at(self, node: str, roles: tuple[str, ...], term: int) -> bool:
        st = self._status(node)
        return st is not None and st.role in roles and st.term == term

    def _term_of(self, node: str) -> int | None:
        st = self._status(node)
        return st.term if st is not None else None

    def _watch_leaders(self) -> dict[str, list[str]]:
        """term -> the nodes seen leading it within WATCH_S (two names: two leaders)."""
        seen: dict[int, set[str]] = {}
        deadline = time.monotonic() + WATCH_S
        while time.monotonic() < deadline:
            for node in self.nemesis.nodes:
                if node in self.killed:
                    continue
                st = self._status(node)
                if st is not None and st.role == "leader":
                    seen.setdefault(st.term, set()).add(node)
            if self.nemesis._stop.wait(POLL_S):
                break
        return {str(t): sorted(ns) for t, ns in sorted(seen.items())}

    def _wait(self, probe, timeout_s: float):  # noqa: ANN001, ANN202
        """The first truthy (or non-None) value of `probe()` within `timeout_s`, else None."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = probe()
            if value is not None and value is not False:
                return value
            if self.nemesis._stop.wait(POLL_S):
                return None
        return None


def election(nemesis: Nemesis) -> ActiveFault | None:
    """Start one `election` fault (nemesis/faults.py dispatches here)."""
    if nemesis.platform.name == "sim":
        return sim_election(nemesis)
    return Election(nemesis).begin()


# split-vote needs a real process's sockets (a frozen voter's queue); vote-then-restart
# needs two candidates and a majority but for one of voters beside them: 5 nodes.
SIM_SHAPES = ("deposed-leader", "late-grant", "vote-then-restart")
SIM_SHAPE_MIN_NODES = {"vote-then-restart": 5}


def sim_election(nemesis: Nemesis) -> ActiveFault | None:
    """The simulator's `election` fault: the deposed-leader, late-grant and vote-then-restart
    shapes (the last from 5 nodes), timed by the cores' state on every tick
    (nemesis/platforms/sim.py `depose`, `trap_late_grant`, `trap_vote_restart`) rather than
    by Status calls. Whether it landed is known at the heal, and recorded
    there."""
    platform = nemesis.platform
    shapes = tuple(s for s in SIM_SHAPES
                   if len(nemesis.nodes) >= SIM_SHAPE_MIN_NODES.get(s, 0))
    shape = nemesis._deal("election-shape", shapes)
    leader = nemesis._leader_or_skip("election", shape)
    if leader is None:
        return None
    counts = nemesis.election_counts.setdefault(shape, {"aimed": 0, "landed": 0})

    def tally(landed: bool, why: str) -> dict[str, Any]:
        counts["aimed"] += 1
        counts["landed"] += int(landed)
        return {"landed": landed, "landed_evidence": why,
                "detail": f"{'landed' if landed else 'missed'}: {why}"}

    if shape == "deposed-leader":
        term = platform.depose(leader)
        text = (f"deposed-leader: leader {leader} of term {term} cut off and paused until "
                f"another node leads a newer term, then resumed among its followers")

        def heal() -> dict[str, Any]:
            successor = platform.end_depose()
            for other in nemesis.nodes:
                if other != leader:
                    platform.heal_link(other, leader)
                    platform.heal_link(leader, other)
            if successor is None:
                return tally(False, "no other node led a newer term while it was away")
            return tally(True, f"{successor[0]} led term {successor[1]} when {leader} "
                               f"was resumed, cut from it alone")
        nodes = [leader]
    elif shape == "vote-then-restart":
        text = (f"vote-then-restart: leader {leader} killed; every vote request kept until "
                f"two candidates ask in one term, the voters restarted between the first's "
                f"requests and the second's")

        def judge(trap: dict[str, Any]) -> tuple[bool, str]:
            if trap.get("fired"):
                return True, (f"{' '.join(trap['voters'])} granted {trap['first']} their "
                              f"votes of term {trap['term']}, restarted, and were asked by "
                              f"{trap['second']} for the same term")
            if trap.get("first") is None:
                return False, ("no two nodes were candidates of one term with the voters "
                               "still below it")
            return False, (f"only {' '.join(trap['restarted']) or 'none'} of "
                           f"{' '.join(trap['voters'])} granted {trap['first']} and "
                           f"restarted in term {trap['term']}")
        heal = _killed_leader_trap(nemesis, leader, platform.trap_vote_restart,
                                   platform.end_vote_trap, judge, tally)
        nodes = [leader]
    else:
        text = (f"late-grant: leader {leader} killed; the vote grants of the next "
                f"candidate kept until it asks in a later term")

        def judge(trap: dict[str, Any]) -> tuple[bool, str]:
            if trap.get("fired"):
                return True, (f"{trap['grants']} grant(s) of term {trap['term']} reached "
                              f"{trap['candidate']} as a candidate of a later term")
            return False, ("no candidate was granted a vote" if trap.get("candidate") is None
                           else f"{trap['candidate']} never asked again after term "
                                f"{trap['term']}")
        heal = _killed_leader_trap(nemesis, leader, platform.trap_late_grant,
                                   platform.end_grant_trap, judge, tally)
        nodes = [leader]
    return nemesis._register("election", nodes, text, heal, {"shape": shape, "target": shape},
                             "election")


def _killed_leader_trap(nemesis: Nemesis, leader: str, arm, end, judge, tally):  # noqa: ANN001, ANN202
    """A simulator trap armed and the leader killed; returns the heal: disarm, restart the
    leader, and tally whether the trap fired (`judge(trap) -> (landed, why)`)."""
    platform = nemesis.platform
    arm()
    nemesis.expected_down.add(leader)
    platform.kill(leader)

    def heal() -> dict[str, Any]:
        trap = end() or {}
        platform.start_node(leader)
        nemesis.expected_down.discard(leader)
        return tally(*judge(trap))
    return heal
