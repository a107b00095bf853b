"""The `sim` platform: the store's nodes as a deterministic simulation, in simulated time.

What it is for: `python -m nemesis run --platform sim` drives the same workload generator,
fault schedule and checkers as the real platforms, but against `system.sim.Simulation`:
the real Raft core and the store's own state machine over a fake network and fake disks.
Nothing runs concurrently and nothing reads a clock, so one seed gives one history, byte
for byte, and a failing run can be replayed and shrunk.

Time: one Raft tick is `TICK_S` of simulated time (the real node's default tick). Each
`advance()` first delivers what is on the wire — oldest first, replies included, as on a
loopback network that is fast next to a tick — then ticks every running, unpaused node.

A leader's Ready goes as on the real node (`Simulation(pipeline=True)`, system/sim/shell.py):
its APPENDs leave before its own fsync, and when that fsync returns is drawn from the seed
(`FSYNC_CHANCE_PER_DELIVERY` before each delivery, `FSYNC_CHANCE_PER_TICK` at the end of a
tick), so followers may answer first and a fault may land while it is pending.

The fault vocabulary maps onto the simulator:
- `cut(src, dst)` / `heal_link`: one direction of a link stops carrying messages (in
  flight ones are lost), as the proxies and iptables rules do;
- `set_loss`: each message on the link is lost with that probability (seeded);
- `set_reorder` (the `reorder` fault, sim only): each message on the link is, with that
  probability, delivered a few ticks late, after the ones sent behind it, and with half
  of it also twice — what UDP, a reconnecting lane or a retrying transport can do, and
  Raft must survive (a stale APPEND, answer or vote grant arriving after newer ones);
- `kill` / `start_node`: a process crash (the OS keeps what was written) and a restart
  from the fake disk;
- `pause` / `resume`: a frozen process: it neither ticks nor receives (messages wait on the
  wire, as in a socket buffer) until resumed;
- `power_loss` (the `lose-unsynced` fault): a crash whose fake disk rolls back to its last
  fsync; `kill-all` is a crash of every node (written data kept). The file faults
  (truncate, bitflip, wipe-wal) are not offered: the fake disk holds records, not bytes;
- `change_membership_at`: a membership change appended on the leader at once (the member
  fault's two-in-flight shape only: a removed node cannot be wiped and re-admitted here);
- `hold_from` / `hold_in_flight` / `release_held` (the `hold` fault, sim only): messages
  kept on the wire, in order, and delivered late rather than lost — what a real network
  can do and iptables cannot: a deposed leader's APPENDs and answers arriving in a newer
  term, or an older APPEND overtaken by newer ones of the same term;
- `depose` / `trap_late_grant` (the `election` fault's two shapes here, timed by the
  cores' state each tick rather than by Status calls): a leader cut off and paused until
  another leads a newer term, then resumed among that leader's followers; a candidate's
  vote grants of one term kept on the wire until it asks for votes in a later one.

What it must never do: read a clock, use global randomness, or let anything but the seed
and the calls made on it decide what happens.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from nemesis import partitions
from nemesis.platforms.base import ClusterConfig, Platform, PlatformError
from system.raft.core import Role
from system.raft.messages import Message, MessageType
from system.sim.history import Function
from system.sim.simulation import Simulation
from system.sim.variant import SimVariant

TICK_S = 0.02  # simulated seconds per Raft tick (the real node's tick_ms is 20)
TICK_NS = int(TICK_S * 1e9)
REORDER_MAX_TICKS = 15  # a late message waits up to this many ticks (an election timeout)
MAX_DELIVERIES_PER_TICK = 20_000  # a bound: a healthy 9-node cluster needs far fewer
COMPACT_EVERY_ENTRIES = 500  # snapshots happen in a run of any length, chunks included
# The chance that a leader's pending fsync returns before the next delivery, and at the end
# of a tick: most return within a few messages, some outlast a tick (a slow disk).
FSYNC_CHANCE_PER_DELIVERY = 0.3
FSYNC_CHANCE_PER_TICK = 0.5
_CAMPAIGN = frozenset({MessageType.PRE_VOTE, MessageType.VOTE})
AIM_PHASE_TICKS = 750  # 15 simulated seconds per phase of the rollback and restore-majority aims


class SimPlatform(Platform):
    """A `Platform` whose nodes are the cores of one `Simulation` (see the module doc)."""

    name = "sim"

    def __init__(self, config: ClusterConfig, *, seed: int, variant: SimVariant | None = None,
                 compact_every_entries: int = COMPACT_EVERY_ENTRIES,
                 record_trace: bool = True, **raft_config: Any) -> None:
        if not config.system.simulated:
            raise PlatformError(f"the sim platform simulates our store only, not {config.system.name}")
        super().__init__(config)
        self.seed = seed
        # The store's own default (NodeConfig.eager_commit): commit indexes ride on the
        # next APPEND or heartbeat.
        raft_config.setdefault("eager_commit", False)
        self.sim = Simulation(node_count=config.nodes, seed=seed, variant=variant,
                              compact_every_entries=compact_every_entries,
                              record_trace=record_trace, pipeline=True, **raft_config)
        self.paused: set[str] = set()  # membership only; node order comes from node_ids
        self.loss: dict[tuple[str, str], float] = {}
        # The reorder fault: on these links each message is, with the probability, held back
        # for a few ticks (later ones overtake it) and, with half of it, also delivered twice.
        self.reorder: dict[tuple[str, str], float] = {}
        self.late_until: dict[int, int] = {}  # flight id -> the tick it may go
        self.reorder_decided: set[int] = set()
        self.reorder_rng = random.Random(f"sim-platform:{seed}:reorder")
        self.rng = random.Random(f"sim-platform:{seed}:loss")
        self.fsync_rng = random.Random(f"sim-platform:{seed}:fsync")
        # Nodes whose core refused what their disk holds at a restart (after a power loss,
        # a store that skipped fsync): down, as a real node that exits 3, with the reason.
        self.refused: dict[str, str] = {}
        # The hold fault: nodes whose every message stays on the wire, and single messages
        # kept there, until `release_held` (late, never lost).
        self.holding: set[str] = set()
        self.held_flights: set[int] = set()
        # hold_from's aim: the held node's term; the messages go as soon as another node
        # holds an entry of a newer term it has not committed (`_stale_window_open`).
        self.held_term: int | None = None
        self.released_in_window = 0  # messages released that way, for the fault's record
        # hold_in_flight's aim: the leader and its held APPENDs with entries; it crashes
        # on the tick after their release, until the heal.
        self.overtaken: tuple[str, list[Message]] | None = None
        self.crash_after_release: str | None = None
        self.crashed_by_hold: str | None = None  # restarted by the next release_held
        # hold_in_flight found no APPEND with entries on the wire: it holds the node's
        # next ones instead (what it has on the wire when the first is about to go).
        self.overtake_next: str | None = None
        # The election fault's deposed-leader shape: (old leader, its term) while it waits,
        # paused and cut off, for another node to lead a newer term; then the successor.
        self.deposing: tuple[str, int] | None = None
        self.deposed_by: tuple[str, int] | None = None
        # Its late-grant shape: the first candidate granted a vote after `trap_late_grant`,
        # the term, the grants kept, and whether they went out (it asked in a later term).
        self.grant_trap: dict[str, Any] | None = None
        # Its vote-then-restart shape (`trap_vote_restart`).
        self.vote_trap: dict[str, Any] | None = None
        # The member fault's change-at-new-leader shape (`aim_change_at_new_leader`).
        self.change_aim: dict[str, Any] | None = None
        # The restore-majority fault (`aim_restore_majority`): while `clients_held`, the sim
        # runner's clients start no operation; `ops_in_flight` (set by the runner) says
        # whether one is still open.
        self.restore_aim: dict[str, Any] | None = None
        # The rollback fault (`aim_rollback`).
        self.rollback_aim: dict[str, Any] | None = None
        self.clients_held = False
        self.ops_in_flight: Any = lambda: False
        # The partition fault's stale-snapshot shape (`aim_stale_snapshot`).
        self.stale_aim: dict[str, Any] | None = None
        self.ticks = 0  # simulated time, in ticks
        self._events_in_tick = 0  # orders records within one tick (1 ns apart)

    # ----- time --------------------------------------------------------------------------

    def now_s(self) -> float:
        return self.ticks * TICK_S

    def now_ns(self) -> int:
        """The history's clock: the tick's start plus 1 ns per record within it, so
        records keep their order and the same run gives the same times."""
        self._events_in_tick += 1
        return self.ticks * TICK_NS + min(self._events_in_tick, TICK_NS - 1)

    def advance(self) -> None:
        """One tick of simulated time: deliver what is on the wire, then tick the nodes."""
        if self.deposing is not None:
            self._depose_step()
        if self.stale_aim is not None and self.stale_aim["phase"] != "done":
            self._stale_step()
        if self.vote_trap is not None and not self.vote_trap["fired"]:
            self._vote_trap_step()
        if self.change_aim is not None and self.change_aim["new"] is None:
            self._change_aim_step()
        if self.restore_aim is not None and self.restore_aim["phase"] != "done":
            self._restore_step()
        if self.rollback_aim is not None and self.rollback_aim["phase"] != "done":
            self._rollback_step()
        self.deliver_pending()
        if self.crash_after_release is not None:
            node, self.crash_after_release = self.crash_after_release, None
            self.sim.record(f"crash {node} until the heal: its overtaken APPENDs arrived")
            self.kill(node)
            self.crashed_by_hold = node
        self.maybe_finish_fsyncs(FSYNC_CHANCE_PER_TICK)
        running = [n for n in self.sim.alive() if n not in self.paused]
        if running:
            self.sim.tick_nodes(running)
        self.ticks += 1
        self._events_in_tick = 0

    def deliver_pending(self, limit: int = MAX_DELIVERIES_PER_TICK) -> int:
        """Deliver every message whose destination is not paused (at most `limit`),
        replies included, oldest first; each lost with its link's loss probability.
        Returns how many moved."""
        sim, paused = self.sim, self.paused
        moved = 0
        while moved < min(limit, MAX_DELIVERIES_PER_TICK):
            self.maybe_finish_fsyncs(FSYNC_CHANCE_PER_DELIVERY)
            flight = next((f for f in sim.network.in_flight.values()
                           if f.message.dst not in paused and not self._held(f)
                           and not self._late(f)), None)
            if flight is None:
                break
            if self.reorder and self._reordered(flight):
                continue
            if self.grant_trap is not None and self._trapped(flight):
                continue
            if self.vote_trap is not None and self._vote_trapped(flight):
                continue
            if self.overtake_next is not None and flight.message.src == self.overtake_next \
                    and flight.message.type is MessageType.APPEND and flight.message.entries:
                self.hold_in_flight(flight.message.src)  # the write's APPENDs, as aimed
                continue
            moved += 1
            self._forget_reordered(flight)
            loss = self.loss.get((flight.message.src, flight.message.dst), 0.0)
            if loss and self.rng.random() < loss:
                sim.drop_flight(flight, "packet loss")
            else:
                sim.deliver_flight(flight)
                if self.change_aim is not None and self.change_aim["new"] is None:
                    self._change_aim_step()  # a vote just made a leader: ask it now
                if self.rollback_aim is not None and self.rollback_aim["phase"] == "told":
                    self._rollback_step()  # told and caught up can be one tick apart
                if self.held_term is not None and self._stale_window_open():
                    self.released_in_window += self.release_held()
                elif self.overtaken is not None and self._overtaken_window_open():
                    self.crash_after_release = self.overtaken[0]
                    self.released_in_window += self.release_held()
        return moved

    def maybe_finish_fsyncs(self, chance: float) -> None:
        """Each running node's pending fsync returns now with this chance (seeded). A
        paused process cannot act on its fsync's return until resumed."""
        for node in self.sim.persisting():
            if node not in self.paused and self.fsync_rng.random() < chance:
                self.sim.finish_persist(node)

    # ----- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """The simulation boots every node when it is built."""

    def close(self) -> None:
        """Nothing to tear down: no process, socket or file outlives the run."""

    @property
    def client_addresses(self) -> dict[str, str]:
        return {n: f"sim:{n}" for n in self.node_ids}

    # ----- nodes -------------------------------------------------------------------------

    def start_node(self, node_id: str) -> None:
        if not self.sim.nodes[node_id].alive:
            self.refused.pop(node_id, None)
            try:
                self.sim.restart(node_id)
            except ValueError as exc:  # the core refuses durable state that contradicts itself
                self.refused[node_id] = f"{node_id} refuses to start: {exc}"
                self.sim.record(f"{node_id} refused to start: {exc}")

    def stop_node(self, node_id: str) -> None:
        self.kill(node_id)

    def kill(self, node_id: str) -> None:
        self.paused.discard(node_id)
        if self.sim.nodes[node_id].alive:
            self.sim.crash(node_id)

    def supports_power_loss(self) -> bool:
        return True

    def power_loss(self, node_ids: list[str]) -> None:
        """The fake disks roll back to their last fsync (`FakeDisk.crash(lose_unsynced=True)`);
        the nodes stay down until `start_node`."""
        for node_id in node_ids:
            self.paused.discard(node_id)
            if self.sim.nodes[node_id].alive:
                self.sim.crash(node_id, lose_unsynced=True)

    def wait_started(self, node_id: str, timeout_s: float) -> int | None:
        """A simulated node is up at once, or refused its disk (3) at once."""
        return self.exit_code(node_id)

    def pause(self, node_id: str) -> None:
        if self.sim.nodes[node_id].alive:
            self.sim.record(f"pause {node_id}")
            self.paused.add(node_id)

    def resume(self, node_id: str) -> None:
        if node_id in self.paused:
            self.sim.record(f"resume {node_id}")
            self.paused.discard(node_id)
            self.sim.deliver_held(node_id)

    def submit(self, op, node_id: str):  # noqa: ANN001, ANN201 - ClientOp -> Attempt
        """A client's request to `node_id`. A paused node does not read it until it resumes:
        before, the simulator served it at once, so a paused old leader answered reads it
        could never have answered (and a broken read barrier looked caught on sim only)."""
        return self.sim.submit(op, node_id, held=node_id in self.paused)

    # ----- membership: the member fault's two-in-flight and change-at-new-leader shapes --
    # Its nodes have no identity to wipe and re-admit, so nothing here removes a node for
    # good on a safe core (remove-and-rejoin, and the rejoin of a node that refused its
    # data, do not run): two-in-flight's changes are undone by the heal itself (the other
    # side's leader, in a later term, overwrites them), and change-at-new-leader asks once,
    # at a moment the safe core refuses (`aim_change_at_new_leader`). A node a change left
    # removed is a nemesis error that says so.

    def aim_change_at_new_leader(self, old: str) -> None:
        """Once `old` (the leader, cut off by the caller) is replaced — checked
        after every delivery, so before the new leader can have committed anything of its
        term — ask the new leader, once, to remove `old` (what an operator does with a dead
        leader). A safe core refuses: it has not committed an entry of its term yet
        (thesis §4.1). Not retried: a removal that commits here cannot be undone."""
        self.change_aim = {"old": old, "term": self.sim.core(old).term, "new": None,
                           "new_term": None,
                           "outcome": None, "detail": "", "committed_in_term": None}

    def _change_aim_step(self) -> None:
        from system.kv.member_client import MembershipRefused

        aim = self.change_aim
        assert aim is not None
        for node in self.answering():
            core = self.sim.core(node)
            if node == aim["old"] or core.role is not Role.LEADER or core.term <= aim["term"]:
                continue
            log = core.log
            aim.update(new=node, new_term=core.term,
                       committed_in_term=log.term(log.committed) == core.term)
            try:
                self.change_membership_at(node, "remove", aim["old"])
                aim["outcome"], aim["detail"] = "appended", "appended"
            except MembershipRefused as exc:
                aim["outcome"], aim["detail"] = "refused", f"refused: {exc}"
            except Exception as exc:  # noqa: BLE001 - recorded, as member-change outcomes are
                aim["outcome"], aim["detail"] = "unanswered", f"unanswered: {exc}"
            self.sim.record(f"{node} leads term {core.term}: asked to remove {aim['old']}: "
                            f"{aim['detail']}")
            return

    def end_change_aim(self) -> dict[str, Any] | None:
        aim, self.change_aim = self.change_aim, None
        return aim

    def wipe(self, node_id: str) -> None:
        raise PlatformError(f"the sim platform cannot wipe {node_id} and re-admit it (its "
                            f"nodes have no identity); use --platform local or docker")

    def member_address(self, node_id: str) -> str:
        raise PlatformError("the sim platform has no member addresses (no member add)")

    def supports_membership(self) -> bool:
        return False

    changes_wait = False  # change_membership_at returns once appended: time stands still

    def change_membership(self, action: str, node_id: str, *, timeout_s: float = 30.0) -> None:
        raise PlatformError(f"the sim platform cannot {action} {node_id} and wait for it "
                            f"(its time advances only between faults)")

    def change_membership_at(self, node: str, action: str, node_id: str, *,
                             timeout_s: float = 10.0) -> None:
        """The change appended on leader `node` now (it commits as the run advances); the
        core's refusal as MembershipRefused, a node that does not lead as
        MembershipUnavailable, as the store's member_client says them."""
        from system.kv.member_client import MembershipRefused, MembershipUnavailable
        from system.raft.core import (
            MembershipChangeKind,
            MembershipChangeRefused,
            NotLeader,
            ProposalDropped,
        )

        kinds = {"remove": MembershipChangeKind.REMOVE, "promote": MembershipChangeKind.PROMOTE}
        if action not in kinds:
            raise PlatformError(f"the sim platform cannot {action} a member (its nodes have no "
                                f"addresses); only {', '.join(kinds)}")
        if node not in self.answering() or self.sim.core(node).role is not Role.LEADER:
            raise MembershipUnavailable(f"{node} is not the leader")
        try:
            self.sim.change_membership(node, kinds[action], node_id, wait=False)
        except MembershipChangeRefused as exc:
            raise MembershipRefused(str(exc)) from None
        except (NotLeader, ProposalDropped) as exc:
            raise MembershipUnavailable(f"{node}: {exc}") from None

    def membership(self, *, timeout_s: float = 10.0) -> tuple[set[str], set[str]]:
        """(voters, learners) in effect on the leader of the highest term."""
        leader = self.leader()
        if leader is None:
            raise PlatformError("no simulated node leads now; the membership is unknown")
        membership = self.sim.core(leader).membership
        return set(membership.voters), set(membership.learners)

    def is_running(self, node_id: str) -> bool:
        return self.sim.nodes[node_id].alive

    def exit_code(self, node_id: str) -> int | None:
        """3 for a node that refused its disk at a restart, 70 for one that stopped itself
        (its state machine refused an entry, as the real node exits 70); None otherwise."""
        shell = self.sim.nodes[node_id]
        if shell.alive:
            return None
        if node_id in self.refused:
            return 3
        return 70 if shell.fatal is not None else None

    def exit_reason(self, node_id: str) -> str:
        return self.refused.get(node_id) or self.sim.nodes[node_id].fatal or ""

    # ----- network -----------------------------------------------------------------------

    def cut(self, src: str, dst: str) -> None:
        self.sim.cut(src, dst, both_ways=False)

    def heal_link(self, src: str, dst: str) -> None:
        self.loss.pop((src, dst), None)
        self.reorder.pop((src, dst), None)
        if self.sim.network.is_cut(src, dst):
            self.sim.heal_link(src, dst)

    def heal_all(self) -> None:
        self.loss.clear()
        self.reorder.clear()
        self.release_held()
        self.sim.heal()

    def _late(self, flight) -> bool:  # noqa: ANN001 - an InFlight
        return bool(self.late_until) and self.late_until.get(flight.id, 0) > self.ticks

    def _reordered(self, flight) -> bool:  # noqa: ANN001 - an InFlight
        """Decide once per message on a reordering link: held back (True: pick another)
        for 1-REORDER_MAX_TICKS ticks, maybe duplicated too (the copy goes last)."""
        probability = self.reorder.get((flight.message.src, flight.message.dst))
        if probability is None or flight.id in self.reorder_decided:
            return False
        self.reorder_decided.add(flight.id)
        rng = self.reorder_rng
        if rng.random() < probability / 2:
            self.sim.duplicate_flight(flight)
        if rng.random() >= probability:
            return False
        self.late_until[flight.id] = self.ticks + rng.randint(1, REORDER_MAX_TICKS)
        self.sim.record(f"late #{flight.id} until tick {self.late_until[flight.id]}")
        return True

    def _forget_reordered(self, flight) -> None:  # noqa: ANN001 - an InFlight
        """A message leaving the wire needs no reorder bookkeeping any more."""
        if self.reorder_decided:
            self.reorder_decided.discard(flight.id)
            self.late_until.pop(flight.id, None)

    def set_reorder(self, src: str, dst: str, probability: float) -> None:
        if not 0 < probability < 1:
            raise ValueError(f"reorder probability must be in (0, 1), got {probability}")
        self.sim.record(f"reorder {src}->{dst} {probability:g}")
        self.reorder[(src, dst)] = probability

    def _held(self, flight) -> bool:  # noqa: ANN001 - an InFlight
        return flight.message.src in self.holding or flight.id in self.held_flights

    def hold_from(self, node_id: str) -> None:
        """Keep every message `node_id` sends (and has on the wire now) in flight, in
        order: its peers stop hearing it while it runs on. Released by `release_held`, or
        at once when a follower first holds an entry of a newer term than `node_id`'s that it
        has not committed: then its old-term APPENDs arrive where a receiver that took
        them for current would overwrite entries the new leader counts as replicated."""
        self.sim.record(f"hold everything {node_id} sends")
        self.holding.add(node_id)
        self.held_term = self.sim.core(node_id).term

    def _stale_window_open(self) -> bool:
        for node in self.answering():
            core = self.sim.core(node)
            if node in self.holding or core.role is not Role.FOLLOWER:
                continue
            log = core.log
            last = log.last_index()
            if last > log.committed and (log.term(last) or 0) > (self.held_term or 0):
                return True
        return False

    def hold_in_flight(self, node_id: str) -> int:
        """Keep the messages `node_id` has on the wire now in flight until `release_held`;
        what it sends later is delivered as usual, ahead of them. Returns how many.

        Aimed: when none of them is an APPEND with entries, the node's next APPENDs with
        entries are held instead, with whatever it has on the wire then. Those are
        released at once when a majority's worth of followers each holds entries past the
        last of them, with a commit index not past the entry it follows (older APPENDs
        they must not let shorten their log), and the leader crashes on the next tick, as if
        it died before it could notice and repair them; it restarts at the next
        `release_held` (the fault's heal), so the others elect a leader without it."""
        flights = [f for f in self.sim.network.in_flight.values() if f.message.src == node_id]
        ids = [f.id for f in flights]
        appends = [f.message for f in flights
                   if f.message.type is MessageType.APPEND and f.message.entries]
        self.overtake_next = None if appends else node_id
        if appends:
            self.overtaken = (node_id, appends)
        self.held_flights.update(ids)
        self.sim.record(f"hold {node_id}'s messages in flight: " + ",".join(f"#{i}" for i in ids))
        return len(ids)

    def _overtaken_window_open(self) -> bool:
        assert self.overtaken is not None
        leader, appends = self.overtaken
        quorum = len(self.sim.alive()) // 2 + 1
        last_held: dict[str, Message] = {}  # per follower, the one that ends last
        for m in appends:
            if m.dst not in last_held or m.entries[-1].index > last_held[m.dst].entries[-1].index:
                last_held[m.dst] = m
        answering = self.answering()
        ahead = 0
        for node, m in last_held.items():
            if node == leader or node not in answering:
                continue
            log = self.sim.core(node).log
            # Delivered in order, the held APPENDs leave a follower that takes them as
            # current with its log ending where the last of them ends: shorter than it is
            # now, if that one still follows an entry it holds, at or past its commit.
            if log.committed <= m.index and log.term(m.index) == m.log_term \
                    and m.entries[-1].index < log.last_index():
                ahead += 1
        return ahead >= quorum

    def release_held(self) -> int:
        """Deliver what the hold fault kept, from the next delivery on (oldest first, so
        before anything sent since). Returns how many messages were held."""
        held = sum(1 for f in self.sim.network.in_flight.values() if self._held(f))
        if self.holding or self.held_flights:
            self.sim.record(f"release {held} held message(s)")
        if self.crashed_by_hold is not None:
            node, self.crashed_by_hold = self.crashed_by_hold, None
            self.start_node(node)
        self.holding.clear()
        self.held_flights.clear()
        self.held_term = None
        self.overtaken = None
        self.overtake_next = None
        return held

    # ----- the election fault's shapes (nemesis/elections.py, sim_election) ----------------

    def depose(self, leader: str) -> int:
        """Cut `leader` from every peer both ways and pause it; once another node leads a
        newer term (`_depose_step`, each tick), its links are healed except to and from
        that successor, and it is resumed: still leading its own term, it hears of the new
        one only through the answers of the successor's followers. Returns its term."""
        term = self.sim.core(leader).term
        for node in self.node_ids:
            if node != leader:
                self.cut(node, leader)
                self.cut(leader, node)
        self.pause(leader)
        self.deposing, self.deposed_by = (leader, term), None
        return term

    def _depose_step(self) -> None:
        assert self.deposing is not None
        leader, term = self.deposing
        for node in self.answering():
            core = self.sim.core(node)
            if node != leader and core.role is Role.LEADER and core.term > term:
                for other in self.node_ids:
                    if other not in (leader, node):
                        self.heal_link(other, leader)
                        self.heal_link(leader, other)
                self.sim.record(f"{node} leads term {core.term}: {leader} resumed among its "
                                f"followers, still cut from {node}")
                self.resume(leader)
                self.deposing, self.deposed_by = None, (node, core.term)
                return

    def end_depose(self) -> tuple[str, int] | None:
        """Stop waiting; returns the successor and its term, if one was seen."""
        if self.deposing is not None:
            self.resume(self.deposing[0])
        self.deposing = None
        return self.deposed_by

    def trap_late_grant(self) -> None:
        """Keep on the wire every vote granted to the first candidate granted one from
        now on, in the term it asked in, and every other node's (pre-)vote request after
        it; deliver them, ahead of anything sent since, the moment it is a candidate of a
        later term (`_trapped`)."""
        self.grant_trap = {"candidate": None, "term": None, "held": [], "grants": 0,
                           "fired": False}

    def _trapped(self, flight) -> bool:  # noqa: ANN001 - an InFlight
        trap, m = self.grant_trap, flight.message
        assert trap is not None
        if trap["fired"]:
            return False
        candidate = trap["candidate"]
        if candidate is not None and trap["held"] and m.dst == candidate:
            core = self.sim.nodes[candidate].core
            if core is not None and core.role is Role.CANDIDATE and core.term > trap["term"]:
                self.held_flights.difference_update(trap["held"])
                trap["fired"] = True
                self.sim.record(f"deliver the {len(trap['held'])} message(s) kept: "
                                f"{trap['grants']} vote grant(s) of term {trap['term']} to "
                                f"{candidate}, now a candidate of term {core.term}, and the "
                                f"others' requests")
                return True  # the next pass delivers the older grants first
        if candidate is not None and m.src != candidate and m.type in _CAMPAIGN:
            # Another node's campaign waits too: the candidate's own timer is the one to fire
            # (the voters' timers restarted with their grants, as its did).
            return self._keep(trap, flight)
        if m.type is not MessageType.VOTE_RESPONSE or m.reject:
            return False
        if candidate is None:
            trap["candidate"], trap["term"] = m.dst, m.term
            self.sim.record(f"keep the vote grants of term {m.term} to {m.dst}")
        if m.dst == trap["candidate"] and m.term == trap["term"]:
            trap["grants"] += 1
            return self._keep(trap, flight)
        return False

    def _keep(self, trap: dict[str, Any], flight) -> bool:  # noqa: ANN001 - an InFlight
        """Keep `flight` on the wire for `trap` (delivered when the trap lets it go)."""
        trap["held"].append(flight.id)
        self.held_flights.add(flight.id)
        return True

    def end_grant_trap(self) -> dict[str, Any] | None:
        """Disarm; the grants still kept go out with the next delivery. Returns the trap."""
        trap, self.grant_trap = self.grant_trap, None
        if trap is not None:
            self.held_flights.difference_update(trap["held"])  # out with the next delivery
        return trap

    def trap_vote_restart(self) -> None:
        """The vote-then-restart shape, once the leader is down: every vote request waits
        on the wire until two nodes are candidates of one term T and enough others (the
        voters, a majority but for the candidate) are still below it (`_vote_trap_step`).
        Then the first candidate's requests go to the voters, and the second's wait; each
        voter's grant to the first is kept, and the voter crashes and restarts (its grant on
        the wire means its vote is on its disk); once every voter has restarted, what was
        kept goes, oldest first: the second candidate asks the restarted voters for T
        before the first can lead. A voter that kept its vote refuses; one that forgot it
        (`forgets-vote-on-restart`) grants, and T has two leaders."""
        self.vote_trap = {"phase": "pre", "term": None, "first": None, "second": None,
                          "voters": [], "granted": [], "restarted": [], "held": [],
                          "fired": False}

    def _vote_trap_step(self) -> None:
        trap = self.vote_trap
        assert trap is not None
        if trap["phase"] == "pre":
            self._vote_trap_pair()
        elif trap["phase"] == "first":
            for voter in trap["granted"]:
                if voter not in trap["restarted"]:
                    self.sim.record(f"{voter} granted {trap['first']} its vote in term "
                                    f"{trap['term']}: crash and restart it")
                    self.kill(voter)
                    self.start_node(voter)
                    trap["restarted"].append(voter)
            if len(trap["restarted"]) == len(trap["voters"]):
                self.held_flights.difference_update(trap["held"])
                trap["phase"], trap["fired"] = "second", True
                self.sim.record(f"deliver what was kept: {trap['second']}'s vote requests of "
                                f"term {trap['term']} to the restarted voters, then the grants "
                                f"to {trap['first']}")

    def _vote_trap_pair(self) -> None:
        trap = self.vote_trap
        assert trap is not None
        answering = self.answering()
        by_term: dict[int, list[str]] = {}
        for node in answering:
            core = self.sim.core(node)
            if core.role is Role.CANDIDATE:
                by_term.setdefault(core.term, []).append(node)
        needed = len(self.node_ids) // 2  # a majority but for the candidate itself
        for term, candidates in sorted(by_term.items()):
            voters = [n for n in answering if self.sim.core(n).term < term]
            if len(candidates) < 2 or len(voters) < needed:
                continue
            first = min(candidates, key=lambda n: min(
                (f.id for f in self.sim.network.in_flight.values()
                 if f.message.src == n and f.message.type is MessageType.VOTE
                 and f.message.term == term), default=1 << 62))
            second = next(n for n in sorted(candidates) if n != first)
            trap.update(phase="first", term=term, first=first, second=second,
                        voters=sorted(voters)[:needed])
            ids = {f.id for f in self.sim.network.in_flight.values()
                   if f.message.src == first and f.message.type is MessageType.VOTE
                   and f.message.term == term and f.message.dst in trap["voters"]}
            trap["held"] = [i for i in trap["held"] if i not in ids]
            self.held_flights.difference_update(ids)
            self.sim.record(f"{first} and {second} are candidates of term {term}: "
                            f"{first}'s vote requests go to {' '.join(trap['voters'])}, "
                            f"{second}'s wait")
            return

    def _vote_trapped(self, flight) -> bool:  # noqa: ANN001 - an InFlight
        trap, m = self.vote_trap, flight.message
        assert trap is not None
        if trap["fired"]:
            return False
        if m.type is MessageType.VOTE and not (
                trap["phase"] == "first" and m.src == trap["first"] and m.term == trap["term"]
                and m.dst in trap["voters"]):
            return self._keep(trap, flight)
        if trap["phase"] == "first" and m.type is MessageType.VOTE_RESPONSE \
                and not m.reject and m.dst == trap["first"] and m.term == trap["term"] \
                and m.src in trap["voters"]:
            if m.src not in trap["granted"]:
                trap["granted"].append(m.src)
            return self._keep(trap, flight)
        return False

    def end_vote_trap(self) -> dict[str, Any] | None:
        """Disarm; what is still kept goes out with the next delivery. Returns the trap."""
        trap, self.vote_trap = self.vote_trap, None
        if trap is not None:
            self.held_flights.difference_update(trap["held"])  # out with the next delivery
        return trap

    # ----- the restore-majority fault (nemesis/restore_majority.py) ---------------------------

    def aim_restore_majority(self, leader: str, restored: list[str], witnesses: list[str],
                             markers: int, marker_key: str) -> None:
        """The fault's steps in simulated time, one phase per tick at most (`_restore_step`):
        the clients held; once no operation is open and every node has applied `leader`'s
        last entry, copies of the disks of `restored` taken and `markers` writes of the
        nemesis's own (`marker_key`, no client's) sent to `leader`; once every witness has
        committed them in the copies' term, the witnesses cut from the restored nodes,
        which crash, come back on their copies and restart; once one of them leads a newer
        term and has committed past the markers' first index, the clients are let go. A
        phase that takes longer than AIM_PHASE_TICKS gives up (nothing restored unless
        the restore phase was reached) and lets the clients go."""
        self.restore_aim = {"phase": "hold", "since": self.ticks, "leader": leader,
                            "restored": restored, "witnesses": witnesses, "markers": markers,
                            "marker_key": marker_key, "term": None, "backup_index": None,
                            "first_marker": None, "new_leader": None, "new_term": None,
                            "landed": False, "why": "", "cut": [], "copies": {}}
        self.clients_held = True

    def _restore_step(self) -> None:
        aim = self.restore_aim
        assert aim is not None
        if self.ticks - aim["since"] > AIM_PHASE_TICKS:
            self._restore_done(False, f"gave up in its {aim['phase']} phase after "
                                      f"{AIM_PHASE_TICKS * TICK_S:g} s")
            return
        getattr(self, f"_restore_{aim['phase']}")(aim)

    def _restore_hold(self, aim: dict[str, Any]) -> None:
        leader = aim["leader"]
        if self.ops_in_flight() or leader not in self.answering():
            return
        core = self.sim.core(leader)
        last = core.log.last_index()
        if core.role is not Role.LEADER or any(
                self.sim.core(n).log.applied < last or self.sim.core(n).term != core.term
                for n in self.answering()) or len(self.answering()) < len(self.node_ids):
            return
        aim.update(term=core.term, backup_index=last, first_marker=last + 1,
                   copies={n: self.sim.nodes[n].disk.current.copy() for n in aim["restored"]})
        self.sim.record(f"restore-majority: {' '.join(aim['restored'])} backed up at index "
                        f"{last}, term {core.term}; {aim['markers']} writes of the nemesis's own")
        for i in range(aim["markers"]):
            op = self.sim.invoke(Function.PUT, aim["marker_key"], f"after the backups {i + 1}",
                                 request_id=f"nemesis-restore-{self.ticks}-{i}")
            self.submit(op, leader)
        aim.update(phase="markers", since=self.ticks)

    def _restore_markers(self, aim: dict[str, Any]) -> None:
        needed = aim["first_marker"] + aim["markers"] - 1
        for node in aim["witnesses"]:
            if node not in self.answering():
                return
            core = self.sim.core(node)
            if core.term != aim["term"]:
                self._restore_done(False, f"the term moved ({node} at {core.term}) before "
                                          f"the witnesses committed the writes: nothing restored")
                return
            if core.log.committed < needed:
                return
        aim["cut"] = partitions.cuts(partitions.components([aim["witnesses"], aim["restored"]]))
        for src, dst in aim["cut"]:
            self.cut(src, dst)
        for node in aim["restored"]:
            self.kill(node)
            self.sim.restore_disk(node, aim["copies"][node])
            self.start_node(node)
        aim.update(phase="elect", since=self.ticks)

    def _restore_elect(self, aim: dict[str, Any]) -> None:
        for node in aim["restored"]:
            if node not in self.answering():
                continue
            core = self.sim.core(node)
            if core.role is Role.LEADER and core.term > aim["term"] \
                    and core.log.committed >= aim["first_marker"]:
                aim.update(new_leader=node, new_term=core.term)
                self._restore_done(True, (
                    f"{node} leads term {core.term} > {aim['term']} and committed to "
                    f"{core.log.committed} without the writes at {aim['first_marker']}.."
                    f"{aim['first_marker'] + aim['markers'] - 1}, which "
                    f"{' '.join(aim['witnesses'])} committed in term {aim['term']}"))
                return

    def _restore_done(self, landed: bool, why: str) -> None:
        aim = self.restore_aim
        assert aim is not None
        aim.update(phase="done", landed=landed, why=why, copies={})
        self.clients_held = False
        self.sim.record(f"restore-majority: {'landed' if landed else 'missed'}: {why}; "
                        f"the clients go on")

    def end_restore_aim(self) -> dict[str, Any] | None:
        """Heal: the witnesses' links back, the clients let go. Returns the aim."""
        aim, self.restore_aim = self.restore_aim, None
        self.clients_held = False
        if aim is not None:
            self._aim_heal_cut(aim)
            if aim["phase"] != "done":
                aim.update(phase="done", why=f"the fault ended in its {aim['phase']} phase")
        return aim

    # ----- the rollback fault (nemesis/rollback.py) ------------------------------------------

    def aim_rollback(self, leader: str, target: str, keepers: list[str], held: list[str],
                     lost_min: int, answer_loss: float) -> None:
        """nemesis/rollback.py's steps in simulated time, one phase per tick at most: a copy
        of `target`'s disk; `held` cut from everyone, so that every commit needs the
        target; once `leader` has committed `lost_min` entries past the copy, the leader
        paused while the target crashes, comes back on its copy and restarts (its answers
        to the leader then lost with `answer_loss`), the leader resumed; the moment the
        target says it was told it lost entries (`catch_up_to` above its commit index) and
        before it caught up, the strike: the leader crashes, the keepers are cut from
        everyone, the held-away nodes let back in. A phase longer than
        AIM_PHASE_TICKS gives up, undoing what it did."""
        core = self.sim.core(target)
        self.rollback_aim = {
            "phase": "grow", "since": self.ticks, "leader": leader, "target": target,
            "keepers": keepers, "held": held, "lost_min": lost_min,
            "answer_loss": answer_loss, "copy": self.sim.nodes[target].disk.current.copy(),
            "saved_last_index": core.log.last_index(),
            "cut_at_commit": self.sim.core(leader).log.committed, "cut": [],
            "catch_up_to": None, "commit_when_seen": None, "commit_after_strike": None,
            "acknowledged_to": None, "landed": False, "why": "", "killed": None}
        self._aim_cut(self.rollback_aim, partitions.cut_off(self.node_ids, held))

    def _aim_cut(self, aim: dict[str, Any], links: list[tuple[str, str]]) -> None:
        for src, dst in links:
            self.cut(src, dst)
        aim["cut"].extend(links)

    def _aim_heal_cut(self, aim: dict[str, Any]) -> None:
        for src, dst in aim["cut"]:
            self.heal_link(src, dst)
        aim["cut"] = []

    def _rollback_step(self) -> None:
        aim = self.rollback_aim
        assert aim is not None
        if self.ticks - aim["since"] > AIM_PHASE_TICKS:
            self._aim_heal_cut(aim)
            self.loss.pop((aim["target"], aim["leader"]), None)
            self._rollback_done(False, f"gave up in its {aim['phase']} phase after "
                                       f"{AIM_PHASE_TICKS * TICK_S:g} s (no strike)")
            return
        leader, target = aim["leader"], aim["target"]
        if aim["phase"] == "grow":
            if leader not in self.answering():
                return
            base = max(aim["saved_last_index"], aim["cut_at_commit"])
            commit = self.sim.core(leader).log.committed
            if commit < base + aim["lost_min"]:
                return
            aim["acknowledged_to"] = commit
            self.sim.record(f"rollback: {leader} committed to {commit} with {target}'s "
                            f"acknowledgement; {target} back on its copy, {leader} paused meanwhile")
            self.pause(leader)  # only a leader that saw the target acknowledge them can tell
            self.kill(target)
            self.sim.restore_disk(target, aim["copy"])
            self.start_node(target)
            self.set_loss(target, leader, aim["answer_loss"])
            self.resume(leader)
            aim.update(phase="told", since=self.ticks, copy=None)
        elif aim["phase"] == "told":
            if target not in self.answering():
                return
            core = self.sim.core(target)
            if not (0 < core.log.committed < core.catch_up_to):
                return
            aim.update(catch_up_to=core.catch_up_to, commit_when_seen=core.log.committed,
                       killed=leader)
            self.kill(leader)
            self._aim_heal_cut(aim)
            self.loss.pop((target, leader), None)
            self._aim_cut(aim, partitions.cut_off(self.node_ids, aim["keepers"]))
            after = core.log.committed
            aim["commit_after_strike"] = after
            self._rollback_done(after < aim["catch_up_to"], (
                f"{target} had been told it lost entries up to {aim['catch_up_to']} and had "
                f"committed only to {after} when the leader crashed; "
                f"{' '.join(aim['held'])} and {target} then made a majority without them"))

    def _rollback_done(self, landed: bool, why: str) -> None:
        aim = self.rollback_aim
        assert aim is not None
        aim.update(phase="done", landed=landed, why=why, copy=None)
        self.sim.record(f"rollback: {'landed' if landed else 'missed'}: {why}")

    def end_rollback_aim(self) -> dict[str, Any] | None:
        """Heal: the crashed leader restarted, the cut links healed. Returns the aim."""
        aim, self.rollback_aim = self.rollback_aim, None
        if aim is None:
            return None
        self._aim_heal_cut(aim)
        self.loss.pop((aim["target"], aim["leader"]), None)
        if aim["killed"] is not None:
            self.start_node(aim["killed"])
        if aim["phase"] != "done":
            aim.update(phase="done", why=f"the fault ended in its {aim['phase']} phase "
                                         f"(no strike)", copy=None)
        return aim

    # ----- the partition fault's stale-snapshot shape (nemesis/windows.py on real nodes) ---

    def aim_stale_snapshot(self, leader: str, follower: str) -> None:
        """Cut `leader` and `follower` off together: the follower takes what the leader
        still appends, never committed. Once a leader of the others has applied past the
        first of those indexes, and not past the follower's last, it snapshots there (as
        the store's byte threshold may, at any index) and the cut heals: it can repair the
        follower only with that snapshot, over an entry of another term (Raft §7)."""
        rest = [n for n in self.node_ids if n not in (leader, follower)]
        self.stale_aim = {"leader": leader, "follower": follower, "rest": rest,
                          "phase": "cut", "index": None, "follower_last": None,
                          "successor": None,
                          "first_stale": max(self.sim.core(n).log.last_index()
                                             for n in rest if self.sim.nodes[n].alive) + 1}
        for src, dst in self._stale_links():
            self.cut(src, dst)

    def _stale_links(self) -> list[tuple[str, str]]:
        aim = self.stale_aim
        assert aim is not None
        pair = (aim["leader"], aim["follower"])
        return [link for a in pair for b in aim["rest"] for link in ((a, b), (b, a))]

    def _stale_step(self) -> None:
        aim, sim = self.stale_aim, self.sim
        assert aim is not None
        for node in aim["rest"]:
            shell = sim.nodes[node]
            if not (shell.alive and shell.core is not None and shell.core.role is Role.LEADER
                    and shell.applied_index >= aim["first_stale"]):
                continue
            follower = sim.nodes[aim["follower"]]
            last = follower.core.log.last_index() if follower.core is not None else 0
            if node not in self.paused and shell.applied_index <= last:
                shell.maybe_compact(now=True)
            aim.update(follower_last=last, index=shell.snapshot_index, successor=node,
                       phase="done")
            for src, dst in self._stale_links():
                self.heal_link(src, dst)
            sim.record(f"stale-snapshot: {node} snapshot at {shell.snapshot_index}, "
                       f"{aim['follower']}'s log ends at {last}; healed")
            return

    def end_stale_aim(self) -> dict[str, Any] | None:
        """Stop aiming (the fault's heal); the links it cut are healed. Returns the aim."""
        aim = self.stale_aim
        if aim is not None and aim["phase"] == "cut":
            for src, dst in self._stale_links():
                self.heal_link(src, dst)
        self.stale_aim = None
        return aim

    def set_loss(self, src: str, dst: str, probability: float) -> None:
        if not 0 < probability < 1:
            raise ValueError(f"loss probability must be in (0, 1), got {probability}")
        self.sim.record(f"loss {src}->{dst} {probability:g}")
        self.loss[(src, dst)] = probability

    # ----- observing ---------------------------------------------------------------------

    def status(self, node_id: str, timeout_s: float = 0.5) -> None:
        """No RPC here: `leader`, `ready` and `describe` read the cores directly."""
        return None

    def answering(self) -> list[str]:
        """Nodes that would answer a Status call: running and not paused."""
        return [n for n in self.sim.alive() if n not in self.paused]

    def leader(self) -> str | None:
        best: tuple[int, str] | None = None
        for node in self.answering():
            core = self.sim.core(node)
            if core.role is Role.LEADER and (best is None or core.term > best[0]):
                best = (core.term, node)
        return best[1] if best else None

    def ready(self) -> str | None:
        """The leader once every node runs and the leader can serve linearizable reads."""
        if len(self.answering()) != len(self.node_ids):
            return None
        leader = self.leader()
        if leader is None or not self.sim.core(leader).read_barrier_open():
            return None
        return leader

    def describe(self) -> str:
        parts = []
        for node in self.node_ids:
            shell = self.sim.nodes[node]
            if shell.core is None:
                parts.append(f"{node}=down")
                continue
            core = shell.core
            state = f"{core.role.value}/t{core.term}/applied={shell.applied_index}"
            parts.append(f"{node}={state}{'/paused' if node in self.paused else ''}")
        return ", ".join(parts)

    def collect_logs(self) -> dict[str, Path]:
        """The simulation's trace (every event, one line each) as nodes/sim-trace.log."""
        folder = self.config.work_dir / "nodes"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "sim-trace.log"
        path.write_text("\n".join(self.sim.trace) + "\n", encoding="utf-8")
        return {path.name: path}
