"""Membership changes aimed at the two windows the store's membership rule guards.

Raft changes its membership one server at a time, and only (docs/raft.md, thesis §4.1):
- one change at a time: two changes in flight can leave memberships two steps apart, whose
  majorities need not overlap;
- after the leader has committed an entry of its own term: a change by an earlier leader
  that the new one never saw can combine with its own into two memberships whose
  majorities do not overlap (Ongaro, raft-dev 2015).

The plain `member` fault (remove, wipe, rejoin) waits for each change to commit, so it never
opens either window. These shapes do, and each pairs the change with a partition that
separates the old and the new membership's majorities, so that a store that lets both
decide elects two leaders, and the checkers see a stale read or a lost write:

- two-in-flight: the leader and a minority (floor((n-1)/2) nodes with it) are cut from
  the rest; at once the leader is asked to remove one node of the other side, and, while
  that change is pending, to remove the next (as many as make the leader's side a majority
  of what is left: two with 3 or 5 voters). A safe leader refuses every change after the
  first ("a membership change is in progress") and the first never commits (its
  membership's majority is across the cut); a leader that takes them all commits the last
  membership on its side alone, while the other side, still on the old membership,
  elects a leader of its own.
- change-at-new-leader: the leader is cut from every peer; the moment another node says
  it leads, it is asked to remove the old leader (what an operator does with a dead
  leader). A safe leader refuses until it has committed an entry of its term ("has not yet
  committed an entry of its term"); the change is then retried as usual and commits a
  moment later. With an even number of voters (where two one-server changes of the same
  membership can have disjoint majorities) the isolated old leader is first asked to
  remove a node of the other half — a change nobody else sees — and when the new leader
  answers, the cluster is regrouped into the old leader's half and the new leader's half.
  A broken leader commits its change on its half; the old leader's pending membership is
  a majority on the other. (That split elects the old leader again only if a voter of
  the new leader missed its first append: the window is one round trip.)

Each change's outcome is a `member-change` event in the history, with one line saying
what happened (committed, refused and why, no answer). The heal reconnects every link and
brings every node the changes removed back as a voter (killed, wiped, added as a learner,
started, promoted): a node removed while it ran still holds the old membership.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from nemesis import partitions

if TYPE_CHECKING:
    from nemesis.faults import ActiveFault, Nemesis

SHAPES = ("two-in-flight", "change-at-new-leader", "remove-and-rejoin")
# The simulator cannot re-admit a node (no identity to wipe): remove-and-rejoin does not
# run there, and change-at-new-leader asks once, where a safe core refuses.
SIM_SHAPES = ("two-in-flight", "change-at-new-leader")
PENDING_POLL_S = 0.003  # a CONFIG entry is pending for a round trip and an fsync or two
PENDING_WAIT_S = 1.0  # the second change goes anyway if the first was not seen pending
LEADER_POLL_S = 0.01
FIRST_LEADER_POLL_S = 0.002  # between rounds of asking every candidate to make the change  # how often the others are asked whether one of them leads
NEW_LEADER_WAIT_S = 15.0
MIN_CHANGE_WAIT_S = 2.0
SETTLE_WAIT_S = 30.0  # after the heal, for one leader whose membership is committed
SETTLE_POLL_S = 0.1
EARLY_REFUSAL = "not yet committed an entry of its term"


def side_sizes(voters: int) -> tuple[int, int]:
    """(nodes on the leader's side, removals) for two-in-flight: the side is a minority of
    every membership until the last removal, then a majority of what is left."""
    side = (voters - 1) // 2
    return side, voters - 2 * side + 1


def halves(voters: list[str], old: str, new: str, removed: str, rng: Any) -> tuple[list[str], list[str]]:
    """The old leader's half and the new leader's half of an even membership: `removed`
    (the old leader's pending change) goes with the new leader."""
    rest = [v for v in voters if v not in (old, new, removed)]
    rng.shuffle(rest)
    size = len(voters) // 2
    return sorted([old, *rest[:size - 1]]), sorted([new, removed, *rest[size - 1:]])


class Changes:
    """Membership changes sent to one node each, in threads (the first one blocks until it
    commits, and the point is to send the next meanwhile); each outcome recorded."""

    def __init__(self, nemesis: Nemesis, timeout_s: float) -> None:
        self.nemesis = nemesis
        self.timeout_s = timeout_s
        self.fault_id: int | None = None  # known once the fault is registered
        self.outcomes: list[dict[str, Any]] = []
        self._unrecorded: list[dict[str, Any]] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def send(self, at: str, action: str, node: str, *, then_retry: bool = False) -> None:
        if not self.nemesis.platform.changes_wait:  # appended at once (the simulator)
            self._send(at, action, node, then_retry)
            return
        thread = threading.Thread(target=self._send, args=(at, action, node, then_retry),
                                  name=f"member-{action}-{node}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def send_to_first_leader(self, candidates: list[str], action: str, node: str) -> None:
        """Ask each of `candidates` (each from a thread of its own), again and again, until
        one answers as leader (committed or refused): the change lands the moment a new
        leader takes requests, before it can have committed anything of its term. Then as
        `send(then_retry)`."""
        taken = threading.Event()
        deadline = time.monotonic() + self.timeout_s
        for at in candidates:
            thread = threading.Thread(target=self._send_first,
                                      args=(at, action, node, taken, deadline),
                                      name=f"member-{action}-{node}-at-{at}", daemon=True)
            self._threads.append(thread)
            thread.start()
        waiter = threading.Thread(target=self._none_took, args=(candidates, action, node,
                                                                taken, deadline), daemon=True)
        self._threads.append(waiter)
        waiter.start()

    def _send_first(self, at: str, action: str, node: str, taken: threading.Event,
                    deadline: float) -> None:
        while time.monotonic() < deadline and not taken.is_set() \
                and not self.nemesis._stop.is_set():
            if self._send(at, action, node, then_retry=True, quiet_unavailable=True):
                taken.set()
                return
            time.sleep(FIRST_LEADER_POLL_S)

    def _none_took(self, candidates: list[str], action: str, node: str,
                   taken: threading.Event, deadline: float) -> None:
        if not taken.wait(max(0.0, deadline - time.monotonic()) + 1.0):
            self._record(", ".join(candidates), action, node, "unanswered",
                         f"no new leader took it within {self.timeout_s:g} s", deadline - self.timeout_s)

    def _send(self, at: str, action: str, node: str, then_retry: bool,
              quiet_unavailable: bool = False) -> bool:
        """One attempt at `at`, recorded; False (not recorded) when `quiet_unavailable`
        and `at` was not the leader."""
        platform = self.nemesis.platform
        started = time.monotonic()
        try:
            platform.change_membership_at(at, action, node, timeout_s=self.timeout_s)
            outcome, detail = "committed", "committed"
            if not platform.changes_wait:
                outcome, detail = "appended", "appended (it commits as the run goes on)"
        except Exception as exc:  # every outcome is recorded, none is an error of the nemesis
            name = type(exc).__name__
            if quiet_unavailable and name == "MembershipUnavailable" and time.monotonic() - started < 1.0:
                return False
            outcome = "refused" if name == "MembershipRefused" else "unanswered"
            detail = f"{outcome}: {exc}"
        self._record(at, action, node, outcome, detail, started)
        if then_retry and outcome == "refused" and EARLY_REFUSAL in detail:
            # The rule delays the change, it does not forbid it: as an operator would.
            started = time.monotonic()
            try:
                platform.change_membership(action, node, timeout_s=self.timeout_s)
                outcome, detail = "committed", "committed on retry, once the leader had committed in its term"
            except Exception as exc:
                outcome, detail = "unanswered", f"retried, no commit: {exc}"
            self._record("leader", action, node, outcome, detail, started)
        return True

    def _record(self, at: str, action: str, node: str, outcome: str, detail: str,
                started: float) -> None:
        value = {"fault": "member", "phase": "step", "nodes": [node],
                 "node": node, "change": action, "at": at, "outcome": outcome,
                 "description": f"{action} {node} at {at}: {detail}"}
        if self.nemesis.platform.changes_wait:  # never a wall clock in a simulated history
            value["seconds"] = round(time.monotonic() - started, 3)
            value["description"] += f" ({value['seconds']:g} s)"
        with self._lock:
            self.outcomes.append(value)
            if self.fault_id is None:  # recorded after the fault's start record
                self._unrecorded.append(value)
                return
        self.nemesis.record("member-change", {**value, "id": self.fault_id})

    def started(self, fault_id: int) -> None:
        """The fault is registered (its start record written): record what came before."""
        with self._lock:
            self.fault_id = fault_id
            waiting, self._unrecorded = self._unrecorded, []
        for value in waiting:
            self.nemesis.record("member-change", {**value, "id": fault_id})

    def join(self) -> None:
        for thread in self._threads:
            thread.join(self.timeout_s * 2 + 5.0)

    def committed(self) -> list[str]:
        with self._lock:
            return [o["node"] for o in self.outcomes if o["outcome"] == "committed"]

    def appended(self) -> list[str]:
        with self._lock:
            return [o["node"] for o in self.outcomes if o["outcome"] == "appended"]


class MemberShapes:
    """The `member` fault's aimed shapes; `Nemesis._member` deals them with the plain one."""

    def __init__(self, nemesis: Nemesis) -> None:
        self.nemesis = nemesis
        self.platform = nemesis.platform

    def begin(self, shape: str) -> ActiveFault | None:
        if shape == "two-in-flight":
            return self.two_in_flight()
        if shape == "change-at-new-leader":
            return self.change_at_new_leader()
        raise ValueError(f"unknown member shape {shape!r}; known: {', '.join(SHAPES)}")

    def _skip(self, shape: str, why: str) -> None:
        self.nemesis.record("nemesis-skip", {"fault": "member", "shape": shape,
                                             "description": f"{shape}: {why}"})

    def _change_timeout(self) -> float:
        return max(MIN_CHANGE_WAIT_S, self.nemesis.interval_s)

    def two_in_flight(self) -> ActiveFault | None:
        nemesis, rng = self.nemesis, self.nemesis.rng
        voters, _ = self.platform.membership()
        leader = self.platform.leader()
        if leader is None or leader not in voters or len(voters) < 3:
            self._skip("two-in-flight", f"needs a leader among 3 or more voters (leader "
                                        f"{leader or 'unknown'}, voters {', '.join(sorted(voters))})")
            return None
        others = sorted(voters - {leader})
        size, count = side_sizes(len(voters))
        side = sorted([leader, *rng.sample(others, size - 1)])
        across = [n for n in nemesis.nodes if n not in side]
        removed = rng.sample([n for n in others if n not in side], count)
        graph = partitions.components([side, across])
        links, heal_links = nemesis.cut(graph)
        changes = Changes(nemesis, self._change_timeout())
        for i, node in enumerate(removed):
            changes.send(leader, "remove", node)
            if i == 0:
                self._wait_pending(leader)
        fault: ActiveFault | None = None

        def heal() -> dict[str, Any]:
            changes.join()
            heal_links()
            return self._restore(removed, changes)

        fault = nemesis._register(
            "member", sorted(set(side) | set(removed)),
            f"two-in-flight: {' '.join(side)} | {' '.join(across)}; remove "
            f"{' then '.join(removed)} at {leader}, the next while the first is pending",
            heal, {"shape": "two-in-flight", "target": "leader", "leader": leader,
                   "removing": removed, "graph": partitions.to_json(graph),
                   "cut": [list(link) for link in links]}, "remove-member")
        changes.started(fault.id)
        return fault

    def change_at_new_leader(self) -> ActiveFault | None:
        nemesis, rng = self.nemesis, self.nemesis.rng
        voters, _ = self.platform.membership()
        old = self.platform.leader()
        if old is None or old not in voters or len(voters) < 3:
            self._skip("change-at-new-leader", f"needs a leader among 3 or more voters "
                       f"(leader {old or 'unknown'}, voters {', '.join(sorted(voters))})")
            return None
        if self.platform.name == "sim":
            return self._sim_change_at_new_leader(old)
        others = sorted(voters - {old})
        even = len(voters) % 2 == 0
        graph = partitions.isolate(nemesis.nodes, old)
        links, heal_links = nemesis.cut(graph)
        changes = Changes(nemesis, self._change_timeout())
        stale = rng.choice(others) if even else None
        if stale is not None:  # a change the isolated old leader appends and nobody sees
            changes.send(old, "remove", stale)
        # Sent before any of them leads, so that it lands the moment one does.
        changes.send_to_first_leader(others, "remove", old)
        started = time.monotonic()
        new = self._wait_new_leader(old, others)
        waited = round(time.monotonic() - started, 3)
        regroup = None
        if new is not None and stale is not None and new != stale:
            mine, _ = halves(sorted(voters), old, new, stale, rng)
            regroup = partitions.components([mine, [n for n in nemesis.nodes if n not in mine]])
            links, heal_links = self._recut(links, regroup)
        removed = [n for n in (old, stale) if n is not None]
        fault: ActiveFault | None = None

        def heal() -> dict[str, Any]:
            changes.join()
            heal_links()
            return self._restore(removed, changes)

        text = (f"change-at-new-leader: {old} cut from its peers"
                + (f" after appending remove {stale}" if stale else "")
                + (f"; {new} led after {waited:g} s; every other node asked to remove {old} until one led"
                   if new else f"; no new leader within {waited:g} s")
                + (f"; regrouped {partitions.describe(regroup)}" if regroup is not None else ""))
        shown = regroup if regroup is not None else graph
        fault = nemesis._register(
            "member", sorted({old, *(n for n in (new, stale) if n)}), text, heal,
            {"shape": "change-at-new-leader", "target": "leader", "leader": old,
             "new_leader": new, "stale_change": stale, "waited_s": waited,
             "graph": partitions.to_json(shown), "cut": [list(link) for link in links]},
            "remove-member")
        changes.started(fault.id)
        return fault

    def _sim_change_at_new_leader(self, old: str) -> ActiveFault:
        """The simulator's change-at-new-leader: `old` cut from every peer; the moment
        another node leads (after the delivery that elected it), it is asked once to
        remove `old` (`SimPlatform.aim_change_at_new_leader`). A safe core refuses, having
        committed nothing of its term; the change is not retried (a removal that commits
        cannot be undone here, see SIM_SHAPES). `landed`: the new leader was asked before
        it had committed an entry of its term."""
        nemesis, platform = self.nemesis, self.platform
        graph = partitions.isolate(nemesis.nodes, old)
        links, heal_links = nemesis.cut(graph)
        platform.aim_change_at_new_leader(old)
        changes = Changes(nemesis, self._change_timeout())

        def heal() -> dict[str, Any]:
            aim = platform.end_change_aim() or {}
            heal_links()
            if aim.get("outcome"):
                changes._record(aim["new"], "remove", old, aim["outcome"], aim["detail"], 0.0)
            landed = bool(aim.get("outcome")) and aim.get("committed_in_term") is False
            value = {"landed": landed, "new_leader": aim.get("new"),
                     "new_term": aim.get("new_term"), "outcome": aim.get("outcome")}
            if aim.get("outcome") == "appended":  # only a core that broke the rule takes it
                value["removed_for_good"] = old
            return value

        fault = nemesis._register(
            "member", [old], f"change-at-new-leader: {old} cut from its peers; the first "
            f"node to lead asked at once to remove it", heal,
            {"shape": "change-at-new-leader", "target": "leader", "leader": old,
             "graph": partitions.to_json(graph), "cut": [list(link) for link in links]},
            "remove-member")
        changes.started(fault.id)
        return fault

    # ----- helpers ---------------------------------------------------------------------

    def _recut(self, links: list[tuple[str, str]], graph: Any) -> tuple[list, Any]:
        """From the cut `links` to the cut `graph` asks for: the new cuts first, then the
        old ones it does not keep healed (never a moment with both sides joined)."""
        wanted = partitions.cuts(graph)
        self.platform.cut_links([link for link in wanted if link not in links])
        for src, dst in links:
            if (src, dst) not in wanted:
                self.platform.heal_link(src, dst)
        return wanted, self.nemesis.healer(wanted)

    def _wait_pending(self, leader: str) -> bool:
        """Until `leader` reports a CONFIG entry appended and not committed (the first
        change in flight), or PENDING_WAIT_S; whether it was seen."""
        deadline = time.monotonic() + PENDING_WAIT_S
        while time.monotonic() < deadline:
            st = self.platform.status(leader, timeout_s=0.3)
            if st is None or not hasattr(st, "config_index"):
                return False
            if st.config_index > st.commit_index:
                return True
            time.sleep(PENDING_POLL_S)
        return False

    def _wait_new_leader(self, old: str, others: list[str]) -> str | None:
        """The first of `others` to say it leads, polled every LEADER_POLL_S."""
        deadline = time.monotonic() + NEW_LEADER_WAIT_S
        while time.monotonic() < deadline and not self.nemesis._stop.is_set():
            for node in others:
                st = self.platform.status(node, timeout_s=0.2)
                if st is not None and st.role == "leader":
                    return node
            time.sleep(LEADER_POLL_S)
        return None

    def _settled_membership(self) -> tuple[set[str], set[str]]:
        """(voters, learners) once every answering node follows one leader whose latest
        membership is committed: just after the heal a deposed leader may still answer
        with a membership that never committed, and a voter must not be wiped on its word.
        After SETTLE_WAIT_S, the leader's word as it stands."""
        if not self.platform.changes_wait:  # the simulator: no time passes in a heal
            return self.platform.membership()
        deadline = time.monotonic() + SETTLE_WAIT_S
        while time.monotonic() < deadline:  # also at the end of the run (stop is set)
            statuses = {n: self.platform.status(n, timeout_s=0.3) for n in self.nemesis.nodes}
            leader = self.platform.leader()
            st = statuses.get(leader) if leader else None
            if st is not None and not hasattr(st, "config_index"):
                break  # a system that does not say: take the leader's word
            if st is not None and st.config_index <= st.commit_index:
                followers = [statuses.get(v) for v in st.voters if v != leader]
                if all(f is None or f.leader_id == leader for f in followers):
                    return set(st.voters), set(st.learners)
            time.sleep(SETTLE_POLL_S)
        return self.platform.membership(timeout_s=30.0)

    def _restore(self, nodes: list[str], changes: Changes) -> dict[str, Any]:
        """Every node in `nodes` a voter again: one the changes removed (it may still run,
        on the old membership) is killed, wiped and rejoined; one still a voter is kept."""
        nemesis, platform = self.nemesis, self.platform
        voters, learners = self._settled_membership()
        rejoined, kept = [], []
        for node in nodes:
            if node in voters:
                kept.append(node)
                continue
            if node not in learners:
                if platform.is_running(node):
                    nemesis.expected_down.add(node)
                    platform.kill(node)
                platform.wipe(node)
            nemesis._rejoin(node)
            rejoined.append(node)
        return {"rejoined": rejoined, "kept": kept,
                "committed": changes.committed(), "appended": changes.appended()}
