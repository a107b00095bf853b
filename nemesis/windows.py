"""Leader faults aimed at the store's windows: a snapshot transfer, a membership change.

The nemesis's rhythm deals faults on a timer, blind to what the store is doing, so a fault
rarely lands while a leader streams a snapshot to a follower or while a new member catches
up before its promotion — windows where a bug can hide (a half-assembled snapshot, a
learner whose leader dies, a CONFIG entry in flight). The store reports both on its Status
RPC (docs/kv-node.md): `snapshots_sending` (follower, snapshot index, bytes acknowledged,
seconds), `config_index` (pending while above `commit_index`), `learners` and
`match_index`. This module watches the leader's Status and strikes the leader inside.

- snapshot-transfer (every other `kill` and every other `partition`): one follower is
  killed (kill) or cut from every node (partition) and kept away until the leader has
  compacted its log past the follower's last entry, so that it can only catch up from a
  snapshot; then it comes back, the leader's Status is polled until it reports the
  transfer, and the leader is struck.
- member-rejoin (every `member` fault's heal): the removed node is added as a learner and
  started on its empty directory; the leader's Status is polled until the learner is
  catching up (a snapshot transfer to it, else a match above 0 — it answered — and below
  the commit index), and the leader is struck before `member promote`, which then goes
  to the next leader.

The strike is a leader fault among those in `--faults` (kill, pause, and partition as
isolate-leader), dealt from a deck. Its start record (`kill`, `pause`, `start-partition`)
carries `window` (what was aimed at, as the leader reported it) and `landed`: whether the
window was still open once the fault had taken effect — judged from the follower, which
had not yet installed the snapshot (its `last_snapshot_index` below the transfer's
index), or for a rejoin, which was still a learner. The choices (which kind, which
follower, which strike) come from the nemesis's seeded source; when a window opens
depends on the store, as every leader target does.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from nemesis import partitions

if TYPE_CHECKING:
    from nemesis.faults import ActiveFault, Nemesis

# Runs that aim at windows start the nodes with these (unless --snapshot-entries is given):
# a snapshot every 500 entries, so that a follower kept away ~10 s at the default rate is
# past the leader's log; and 512-byte chunks, so that a transfer takes many round trips (one
# chunk in flight: a 36 KB snapshot of a 60 s run is 72) instead of one, and a strike can
# land between chunks (with 4 KiB chunks a transfer was over within ~20 ms, too soon for a
# poll to see it open).
WINDOW_SNAPSHOT_ENTRIES = 500
WINDOW_CHUNK_BYTES = 512
AIMED_KINDS = ("kill", "partition", "member")
POLL_S = 0.01  # how often the leader's Status is read while a window is awaited
LAG_POLL_S = 0.25  # how often the leader's snapshot index is read while a follower is away
# stale-snapshot: the cut comes when every node of the majority side is this many entries
# short of its next compaction: fewer than the old leader then appends for its clients
# before it steps down (8-12 measured at the default rate: the clients of two nodes of
# five for ~0.5 s), so the next snapshot falls inside them.
STALE_NEAR = (2, 6)
CONFIG_POLL_S = 0.003  # a CONFIG entry is pending for a round trip and an fsync or two
PROMOTE_WAIT_S = 90.0  # a learner catches up from an empty disk (faults.PROMOTE_TIMEOUT_S)
CAUGHT_UP_MARGIN = 100  # entries a learner may lag and still be promoted at once
LAG_MARGIN = 50  # entries a follower may still take between our read of its log and the fault
LAG_TIMEOUT_S = 90.0  # a follower is kept away at most this long waiting for a compaction
OPEN_TIMEOUT_S = 20.0  # a window must open within this once its cause is in place
STRIKES = ("kill", "pause", "partition")  # leader faults, in the order a deck round leads


def aims_at_windows(faults: list[str], workload: str, platform: str) -> bool:
    """Whether a run aims leader faults at windows: the kv workload on real processes with
    a fault that creates them (the simulator's nodes have no Status RPC to watch)."""
    return (workload == "kv" and platform in ("local", "docker", "ssh")
            and any(f in AIMED_KINDS for f in faults))


def node_args(faults: list[str], workload: str, platform: str, given: list[str]) -> list[str]:
    """The node flags a run that aims at windows adds to `given`."""
    if not aims_at_windows(faults, workload, platform):
        return []
    extra = []
    if "--snapshot-entries" not in given:
        extra += ["--snapshot-entries", str(WINDOW_SNAPSHOT_ENTRIES)]
    if "--snapshot-chunk-bytes" not in given:
        extra += ["--snapshot-chunk-bytes", str(WINDOW_CHUNK_BYTES)]
    return extra


class Windows:
    """Attached to a Nemesis (`attach`); the Nemesis asks it before starting an aimed kind."""

    def __init__(self, nemesis: Nemesis) -> None:
        self.nemesis = nemesis
        self.platform = nemesis.platform
        self.strikes = tuple(s for s in STRIKES if s in nemesis.faults) or ("kill",)
        self.counts: dict[str, dict[str, int]] = {}  # window -> {"aimed": n, "landed": n}

    @classmethod
    def attach(cls, nemesis: Nemesis) -> Windows:
        nemesis.leader_windows = cls(nemesis)
        return nemesis.leader_windows

    # ----- called by the Nemesis ----------------------------------------------------------

    def begin(self, kind: str) -> ActiveFault | None | bool:
        """Start `kind` aimed at a window, or False to let the Nemesis start it as usual.
        Every other kill or partition (a deck of two) aims at a snapshot transfer: the
        first kill, the second partition — the first partition of a run stays the plain
        isolate-leader its own deck leads with (a leader that acknowledges what it cannot
        commit is caught by it in short runs)."""
        if kind not in ("kill", "partition"):
            return False
        order = (("snapshot-transfer", "plain") if kind == "kill"
                 else ("plain", "snapshot-transfer", "stale-snapshot"))
        aim = self.nemesis._deal(f"window:{kind}", order)
        if aim == "plain":
            return False
        if aim == "stale-snapshot":
            return self._stale_snapshot_strike()
        return self._snapshot_strike(kind)

    def rejoin(self, node: str) -> dict[str, Any]:
        """The heal of a `member` fault with a strike at the leader while `node` rejoins:
        during its catch-up as a learner, or while its promotion's CONFIG entry is appended
        and not yet committed (dealt in turn); returns what the heal record says."""
        nemesis = self.nemesis
        voters, learners = self.platform.membership()
        if node not in voters and node not in learners:
            self.platform.change_membership("add", node)
        if not self.platform.is_running(node):
            self.platform.start_node(node)
        nemesis.expected_down.discard(node)
        strike, healer = None, None
        try:
            if node not in voters:
                aim = nemesis._deal("window:member", ("member-rejoin", "config-pending"))
                promoting = None
                if aim == "member-rejoin":
                    strike = self._member_strike(node)
                else:
                    strike, promoting = self._config_strike(node)
                if strike is not None:
                    # Healed after its interval whatever the promotion does: with 3 nodes a
                    # struck leader leaves no majority, and the promotion waits for it.
                    healer = threading.Thread(target=self._heal_later, args=(strike,),
                                              name="window-heal", daemon=True)
                    healer.start()
                if promoting is not None:
                    promoting.wait(PROMOTE_WAIT_S)  # it goes on at the next leader
            nemesis._rejoin(node)  # the promotion (if still due), at whichever node leads now
        finally:
            if healer is not None:
                healer.join()  # at most an interval from the strike
            elif strike is not None:
                nemesis._end(strike)
        return {"rejoined": node, "strike": strike.id if strike else None}

    def _heal_later(self, strike: ActiveFault) -> None:
        """Hold `strike` its interval (less if the run stops), then heal it."""
        left = strike.started + self.nemesis.interval_s - time.monotonic()
        self.nemesis._stop.wait(max(0.0, left))
        self.nemesis._end(strike)

    # ----- snapshot transfers -------------------------------------------------------------

    def _snapshot_strike(self, kind: str) -> ActiveFault | None:
        nemesis = self.nemesis
        leader = self.platform.leader()
        if leader is None:
            return False  # type: ignore[return-value]  # as usual: no window to aim at
        followers = sorted(n for n in nemesis.nodes if n != leader)
        follower = nemesis.rng.choice(followers)
        before = self.platform.status(follower)
        # What it may still receive between this read and the fault: a margin.
        last = (before.last_index if before is not None else 0) + LAG_MARGIN
        lag = self._keep_away(kind, follower, last)
        # Wait (bounded) until the leader compacted past the follower's log, then heal.
        compacted = self._wait(lambda: self._compacted_past(last), LAG_TIMEOUT_S, LAG_POLL_S)
        nemesis._end(lag)
        if compacted is None:
            self._skip(kind, "snapshot-transfer", f"no leader compacted past {follower}'s "
                       f"index {last} within {LAG_TIMEOUT_S:g} s", counted=False)
            return None
        seen = self._wait(lambda: self._sending_to(follower), OPEN_TIMEOUT_S)
        if seen is None:
            self._skip(kind, "snapshot-transfer", f"no leader reported a snapshot transfer "
                       f"to {follower} within {OPEN_TIMEOUT_S:g} s of its return")
            return None
        leader_now, send = seen
        window = {"kind": "snapshot-transfer", "leader": leader_now, "follower": follower,
                  "index": send.index, "offset": send.offset, "size": send.size,
                  "seconds": round(send.seconds, 3), "lag_fault": lag.id}
        return self._strike(leader_now, window, lambda: self._snapshot_open(follower, send.index))

    def _stale_snapshot_strike(self) -> ActiveFault | None:
        """A snapshot sent to a follower whose log holds, at the snapshot's index, an entry
        of another term (Raft §7: keep the log only if it holds the snapshot's last entry,
        index AND term). Once every other node is a few entries short of its next
        compaction, the leader and one follower are cut off together: the follower takes
        the entries the leader still appends for its clients (never committed), while the
        others elect a leader that commits its own entries at those indexes and compacts
        past the first of them. Healed the moment that snapshot index falls inside the
        follower's stale tail: the new leader can catch it up only with that snapshot."""
        nemesis = self.nemesis
        leader = self.platform.leader()
        if leader is None:
            return False  # type: ignore[return-value]  # as usual: no window to aim at
        follower = nemesis.rng.choice(sorted(n for n in nemesis.nodes if n != leader))
        rest = [n for n in nemesis.nodes if n not in (leader, follower)]
        every = self._snapshot_entries()
        near = self._wait(lambda: self._all_near_compaction(rest, every), OPEN_TIMEOUT_S)
        if near is None:
            self._skip("partition", "stale-snapshot", f"{' '.join(rest)} were not all within "
                       f"{STALE_NEAR[0]}-{STALE_NEAR[1]} entries of a compaction within "
                       f"{OPEN_TIMEOUT_S:g} s")
            return None
        first_stale = max(near) + 1  # the first index the others cannot have yet
        graph = partitions.components([[leader, follower], rest])
        links, heal_links = nemesis.cut(graph)
        text = (f"stale-snapshot: {leader} and {follower} cut off together until a leader of "
                f"{' '.join(rest)} compacts past index {first_stale}")
        outcome: dict[str, Any] = {}  # what the heal record says: where the snapshot fell

        def heal() -> dict[str, Any]:
            return {**heal_links(), **outcome}

        fault = nemesis._register("partition", [leader, follower], text, heal,
                                  {"shape": "stale-snapshot", "leader": leader,
                                   "graph": partitions.to_json(graph), "first_stale": first_stale,
                                   "cut": [list(link) for link in links]}, "start-partition")
        seen = self._wait(lambda: self._compacted_over(rest, first_stale), LAG_TIMEOUT_S)
        tail = self.platform.status(follower, timeout_s=0.3)
        if seen is None:
            nemesis._end(fault)
            self._skip("partition", "stale-snapshot", f"no leader of {' '.join(rest)} compacted "
                       f"past {first_stale} within {LAG_TIMEOUT_S:g} s", counted=False)
            return None
        new_leader, index = seen
        last = tail.last_index if tail is not None else 0
        landed = first_stale <= index <= last
        why = (f"{new_leader} compacted to {index}, {'inside' if landed else 'past'} "
               f"{follower}'s stale entries {first_stale}..{last}, when the partition healed")
        outcome.update(window={"kind": "stale-snapshot", "leader": new_leader,
                               "follower": follower, "index": index,
                               "first_stale": first_stale, "follower_last": last},
                       landed=landed, landed_evidence=why, detail=why)
        nemesis._end(fault)
        self._tally("stale-snapshot", landed)
        return None

    def _snapshot_entries(self) -> int:
        """The run's --snapshot-entries (node_args puts WINDOW_SNAPSHOT_ENTRIES unless given)."""
        args = list(getattr(self.platform.config, "node_args", ()))
        if "--snapshot-entries" in args[:-1]:
            return int(args[args.index("--snapshot-entries") + 1])
        return WINDOW_SNAPSHOT_ENTRIES

    def _all_near_compaction(self, nodes: list[str], every: int) -> list[int] | None:
        """Each node's last index when every one of `nodes` is STALE_NEAR entries short of
        its next compaction; else None."""
        lasts = []
        for node in nodes:
            st = self.platform.status(node, timeout_s=0.3)
            if st is None or not STALE_NEAR[0] <= st.snapshot_index + every - st.applied_index \
                    <= STALE_NEAR[1]:
                return None
            lasts.append(st.last_index)
        return lasts

    def _compacted_over(self, nodes: list[str], index: int) -> tuple[str, int] | None:
        for node in nodes:
            st = self.platform.status(node, timeout_s=0.3)
            if st is not None and st.role == "leader" and st.snapshot_index >= index:
                return node, st.snapshot_index
        return None

    def _keep_away(self, kind: str, follower: str, last: int) -> ActiveFault:
        """Kill `follower` or cut it from every node: a fault the Nemesis records and heals."""
        nemesis = self.nemesis
        text = f"snapshot-lag: {follower} kept away until the leader compacts past index {last}"
        if kind == "kill":
            nemesis.expected_down.add(follower)
            self.platform.kill(follower)

            def heal() -> dict[str, Any]:
                if not self.platform.is_running(follower):
                    self.platform.start_node(follower)
                nemesis.expected_down.discard(follower)
                return {}

            return nemesis._register("kill", [follower], text, heal,
                                     {"target": "snapshot-lag", "last_index": last}, "kill")
        graph = partitions.isolate(nemesis.nodes, follower)
        links, heal_links = nemesis.cut(graph)
        return nemesis._register("partition", [follower], text, heal_links,
                                 {"shape": "snapshot-lag", "graph": partitions.to_json(graph),
                                  "leader": None, "last_index": last,
                                  "cut": [list(link) for link in links]}, "start-partition")

    def _compacted_past(self, index: int) -> bool:
        leader = self.platform.leader()
        st = self.platform.status(leader) if leader else None
        return st is not None and st.role == "leader" and st.snapshot_index > index

    def _sending_to(self, follower: str) -> tuple[str, Any] | None:
        leader = self._leader_fast()
        st = self.platform.status(leader, timeout_s=0.3) if leader else None
        if st is None or st.role != "leader":
            self._known_leader = None
            return None
        for send in st.snapshots_sending:
            if send.peer == follower:
                return leader, send
        return None

    def _snapshot_open(self, follower: str, index: int) -> tuple[bool, str]:
        st = self._status(follower)
        if st is None:
            return False, f"{follower} did not answer Status after the strike"
        if st.last_snapshot_index >= index:
            return False, (f"{follower} had installed the snapshot (index "
                           f"{st.last_snapshot_index}) by the time the fault took effect")
        return True, (f"{follower} had not installed the snapshot at index {index} once the "
                      f"fault took effect (its latest installed: {st.last_snapshot_index})")

    # ----- membership changes -------------------------------------------------------------

    def _member_strike(self, node: str) -> ActiveFault | None:
        def catching_up() -> tuple[str, dict[str, Any]] | None:
            leader = self._leader_fast()
            st = self.platform.status(leader, timeout_s=0.3) if leader else None
            if st is None or st.role != "leader":
                self._known_leader = None
                return None
            if node not in st.learners:
                return None
            window = {"kind": "member-rejoin", "leader": leader, "learner": node,
                      "config_index": st.config_index,
                      "config_pending": st.config_index > st.commit_index,
                      "commit_index": st.commit_index,
                      "match_index": st.match_index.get(node, 0)}
            for send in st.snapshots_sending:
                if send.peer == node:
                    return leader, {**window, "snapshot": {
                        "index": send.index, "offset": send.offset, "size": send.size,
                        "seconds": round(send.seconds, 3)}}
            # Match 0: the learner has not answered yet (its process may still be starting).
            if 0 < window["match_index"] < st.commit_index:
                return leader, window
            return None

        seen = self._wait(catching_up, OPEN_TIMEOUT_S)
        if seen is None:
            self._skip("member", "member-rejoin", f"no leader reported {node} catching up "
                       f"as a learner within {OPEN_TIMEOUT_S:g} s")
            return None
        leader, window = seen
        return self._strike(leader, window, lambda: self._still_learner(node, window))

    def _config_strike(self, node: str) -> tuple[ActiveFault | None, threading.Event]:
        """Promote `node` from a thread and strike the leader once it reports the CONFIG
        entry appended and not committed (`config_index` above `commit_index`)."""
        # Wait for the catch-up first: a promotion is refused (and retried) until then, and
        # the CONFIG entry is appended only once it is accepted.
        self._wait(lambda: self._caught_up(node), PROMOTE_WAIT_S, LAG_POLL_S)
        leader = self._leader_fast()
        st = self.platform.status(leader, timeout_s=0.5) if leader else None
        before = st.config_index if st is not None else 0
        done = threading.Event()

        def promote() -> None:
            try:
                self.platform.change_membership("promote", node, timeout_s=PROMOTE_WAIT_S)
            except Exception:  # noqa: BLE001 - `_rejoin` after the strike finishes the job
                pass
            finally:
                done.set()

        threading.Thread(target=promote, name="window-promote", daemon=True).start()

        def pending() -> tuple[str, dict[str, Any]] | bool | None:
            if done.is_set():
                return True  # committed (or given up) before a poll saw it pending
            leader = self._leader_fast()
            st = self.platform.status(leader, timeout_s=0.3) if leader else None
            if st is None or st.role != "leader":
                self._known_leader = None
                return None
            if st.config_index > max(before, st.commit_index):
                return leader, {"kind": "config-pending", "leader": leader, "learner": node,
                                "config_index": st.config_index,
                                "commit_index": st.commit_index}
            return None

        seen = self._wait(pending, OPEN_TIMEOUT_S, CONFIG_POLL_S)
        if not isinstance(seen, tuple):
            self._skip("member", "config-pending", f"{node}'s promotion committed before a "
                       f"poll of the leader saw it pending" if seen else
                       f"no leader reported {node}'s promotion pending within "
                       f"{OPEN_TIMEOUT_S:g} s")
            return None, done
        leader, window = seen
        return self._strike(leader, window, lambda: self._uncommitted(leader, window, done)), done

    def _caught_up(self, node: str) -> bool:
        leader = self._leader_fast()
        st = self.platform.status(leader, timeout_s=0.3) if leader else None
        if st is None or st.role != "leader":
            self._known_leader = None
            return False
        return st.match_index.get(node, 0) >= st.commit_index - CAUGHT_UP_MARGIN

    def _uncommitted(self, leader: str, window: dict[str, Any], done: threading.Event
                     ) -> tuple[bool, str]:
        """Inside when, once the fault took effect, the promotion had not been answered and
        no other node knew the CONFIG entry committed (commit indexes only grow, so a later
        answer never says "inside" wrongly). The struck leader itself may have counted it
        committed a moment before; nobody else could know."""
        if done.is_set():
            return False, "the promotion had been answered (committed) before the fault took effect"
        index = window["config_index"]
        commits = {}
        for node in self.nemesis.nodes:
            if node == leader:
                continue
            st = self.platform.status(node, timeout_s=0.3)
            if st is not None:
                commits[node] = st.commit_index
        knew = sorted(n for n, c in commits.items() if c >= index)
        window["commit_indexes_after"] = commits
        if knew:
            return False, (f"{', '.join(knew)} knew the CONFIG entry {index} committed by the "
                           f"time we asked, just after the fault")
        if not commits:
            return False, "no other node answered Status after the strike"
        return True, (f"the CONFIG entry {index} was pending: the promotion unanswered and no "
                      f"other node knew it committed once the fault took effect "
                      f"({', '.join(f'{n} {c}' for n, c in sorted(commits.items()))})")

    def _still_learner(self, node: str, window: dict[str, Any]) -> tuple[bool, str]:
        """Still catching up once the fault took effect: its applied index below the commit
        index the leader reported with the window (or, during a snapshot transfer, that
        snapshot not installed). Both only grow, so a later answer still tells. It was a
        learner in any case: the promotion is asked for after the strike. (Its own view of
        the membership is no evidence: a snapshot taken before its removal names it a
        voter until the later entries reach it.)"""
        st = self._status(node)
        if st is None:
            return False, f"{node} did not answer Status after the strike"
        snapshot = window.get("snapshot")
        if snapshot is not None:
            inside = st.last_snapshot_index < snapshot["index"]
            snapshot["landed"] = inside
            if inside:
                return True, (f"learner {node} had not installed the snapshot at index "
                              f"{snapshot['index']} once the fault took effect")
        if st.applied_index < window["commit_index"]:
            return True, (f"learner {node} had applied up to {st.applied_index}, below the "
                          f"leader's commit index {window['commit_index']}, once the fault "
                          f"took effect")
        return False, (f"learner {node} had caught up (applied {st.applied_index} >= "
                       f"{window['commit_index']}) by the time the fault took effect")

    # ----- the strike -----------------------------------------------------------------------

    def _strike(self, leader: str, window: dict[str, Any], still_open) -> ActiveFault:  # noqa: ANN001
        """Fault `leader` (a strike dealt from the deck), then judge from the follower whether
        the window was still open; the start record carries both."""
        nemesis = self.nemesis
        strike = nemesis._deal("window-strike", self.strikes)
        if strike == "kill":
            nemesis.expected_down.add(leader)
            self.platform.kill(leader)
        elif strike == "pause":
            self.platform.pause(leader)
        else:
            graph = partitions.isolate(nemesis.nodes, leader)
            links, heal_links = nemesis.cut(graph)
        landed, why = still_open()
        self._tally(window["kind"], landed)
        aim = {"window": window, "landed": landed, "landed_evidence": why, "target": "leader"}
        where = f"aimed at {window['kind']} ({'landed inside' if landed else 'missed'}): {why}"
        if strike == "kill":
            def heal() -> dict[str, Any]:
                if not self.platform.is_running(leader):
                    self.platform.start_node(leader)
                nemesis.expected_down.discard(leader)
                return {}

            return nemesis._register("kill", [leader], f"leader: {leader}; {where}", heal,
                                     aim, "kill")
        if strike == "pause":
            def heal_pause() -> dict[str, Any]:
                self.platform.resume(leader)
                return {}

            return nemesis._register("pause", [leader], f"leader: {leader}; {where}",
                                     heal_pause, aim, "pause")

        return nemesis._register("partition", [leader],
                                 f"isolate-leader: {partitions.describe(graph)}; {where}",
                                 heal_links, {**aim, "shape": "isolate-leader", "leader": leader,
                                              "graph": partitions.to_json(graph),
                                              "cut": [list(link) for link in links]},
                                 "start-partition")

    def _skip(self, fault: str, window: str, why: str, counted: bool = True) -> None:
        """No strike: a `nemesis-skip` record saying why, and (`counted`) a window not seen.
        A wait the run's end cut short says so, and is not counted."""
        if self.nemesis._stop.is_set():
            why, counted = "the run ended before the window opened", False
        self.nemesis.record("nemesis-skip", {"fault": fault, "window": window,
                                             "description": f"{window}: {why}"})
        if counted:
            self._tally(window, False, aimed=False)

    def _tally(self, kind: str, landed: bool, aimed: bool = True) -> None:
        tally = self.counts.setdefault(kind, {"aimed": 0, "landed": 0, "not_seen": 0})
        if aimed:
            tally["aimed"] += 1
            tally["landed"] += int(landed)
        else:
            tally["not_seen"] += 1

    # ----- polling ------------------------------------------------------------------------

    _known_leader: str | None = None

    def _leader_fast(self) -> str | None:
        """The leader, asked of every node only when the one last seen stops leading (the
        poll then reads one Status per round)."""
        if self._known_leader is None:
            self._known_leader = self.platform.leader()
        return self._known_leader

    def _status(self, node: str, timeout_s: float = 10.0) -> Any:
        """`node`'s Status, asked again until it answers: a channel to a node that was just
        restarted fails at once until it reconnects. A later answer still tells whether the
        window was open when the strike took effect: a follower's installed snapshot index
        only grows, and a learner is promoted only after we ask."""
        deadline = time.monotonic() + timeout_s
        while True:
            st = self.platform.status(node, timeout_s=0.5)
            if st is not None or time.monotonic() >= deadline:
                return st
            time.sleep(POLL_S)

    def _wait(self, probe, timeout_s: float, poll_s: float = POLL_S):  # noqa: ANN001, ANN202
        """The first truthy value of `probe()` within `timeout_s`, else None (also when the
        run is stopping)."""
        self._known_leader = None
        return wait_or_stop(probe, timeout_s, self.nemesis._stop, poll_s)


def wait_or_stop(probe, timeout_s: float, stop: threading.Event,  # noqa: ANN001, ANN201
                 poll_s: float = POLL_S):
    """The first truthy value of `probe()` within `timeout_s`; None when the time runs out
    or `stop` is set (the run is ending: an aimed fault gives up its wait)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        if stop.wait(poll_s):
            return None
    return None
