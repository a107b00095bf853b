"""A deterministic simulator of a Raft cluster: N cores over a fake network and fake disks.

What it is for: to test the Raft core by controlling the interleaving, not the clock
(the design essay's lesson). Everything comes from one seed: each node's core gets its own
`random.Random` derived from (seed, node, incarnation), and the randomized schedule of
`system.sim.swarm` gets another. A test drives the cluster one event at a time:

    sim = Simulation(node_count=3, seed=7)
    sim.campaign("n1")                                   # n1 wins an election
    write = sim.put("n1", "x", "a")                      # a client write, request id kept
    sim.deliver(type=MessageType.APPEND, src="n1", dst="n2")
    sim.crash("n1", lose_unsynced=True)                  # volatile state gone
    sim.partition({"n1"}, {"n2", "n3"}); sim.heal()      # links, one-way with cut()
    sim.run_until(lambda: write.done, max_steps=500)     # FIFO delivery, ticks when idle

Each node runs a shell like the real one: it takes the core's `Ready`, writes it to its
`FakeDisk` (a synced part that survives power loss and an unsynced part that a crash
with `lose_unsynced=True` loses), fsyncs when told, sends the messages into the
`FakeNetwork`, applies committed entries to its `Replica` (the store's own state
machine, system/kv/state_machine.py), serves ReadIndex reads once applied, answers
waiting clients, then calls `advance`. With `pipeline=True` a leader's Ready goes as the
real node's does: its APPENDs leave before its own fsync, which completes only when the
caller (or `step`) says `finish_persist(node)`; a crash before that loses it. Every event is one line of `trace`; `trace_hash()` fingerprints a run, and
the same seed always gives the same hash. A `SafetyMonitor` sees every persisted and
applied entry and the core's role/term/commit after every input, and records violations
of Raft's safety properties; the clients' operations form a Jepsen-style history that
`check_linearizable(check)` hands to the linearizability checker its caller passes in (the
project's: `checker.check_versioned_kv`; the system never imports the harness that tests it).

Run `python -m system.sim --seeds 200` for the randomized simulation (see swarm.py).

What it must never do: read a clock, touch real sockets or files (but for the CLI's
`--history-out`, through `histories.write`), use global randomness,
or iterate over anything whose order is not deterministic (string hashing is randomized
per process, so no set or dict keyed by strings is iterated unsorted). Broken variants of
the core or shell are passed in (`SimVariant`), never switched on by flags in here.
The one non-deterministic part is the end-of-run check: the checker's budget is wall-clock
time, so on a slow machine a verdict can become "unknown" (never valid, never invalid).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from histories.ops import Op
from system.raft.core import RaftConfig, RaftCore, Role
from system.raft.messages import Message, MessageType
from system.raft.types import HardState, NodeId
from system.sim.clients import Attempt, AttemptState, ClientOp, OpStatus
from system.sim.history import (
    EventType,
    Function,
    HistoryEvent,
    to_records,
)
from system.sim.invariants import Rule, SafetyMonitor, Violation
from system.sim.network import FakeNetwork, InFlight, describe
from system.sim.schedule import Step, message_key
from system.sim.shell import NodeShell
from system.sim.state_machine import Replica
from system.sim.variant import SimVariant


class SimulationStuck(AssertionError):
    """run_until ran out of steps before its condition held."""


# Per key. The sim's keys hold a few hundred operations and decide in milliseconds; the
# budget only bounds a pathological history, which then reads "unknown".
DEFAULT_CHECK_BUDGET_S = 60.0


class CheckResult(Protocol):
    """What a linearizability checker answers (`checker.Result` is one)."""

    @property
    def valid(self) -> bool | str: ...  # True, False or "unknown"

    @property
    def note(self) -> str: ...  # why unknown

    @property
    def counterexamples(self) -> Sequence[Any]: ...  # each with .text()


class LinearizabilityCheck(Protocol):
    """Decides whether a history (`histories.Op` records) is linearizable, every key
    checked, within `budget_s` per key: `checker.check_versioned_kv`. The harness owns the
    checker and hands it in; the simulator never imports it."""

    def __call__(self, history: Sequence[Op], *, budget_s: float) -> CheckResult: ...


@dataclass(frozen=True)
class Verdict:
    """The linearizability verdict of a run: `valid` is True, False or "unknown"."""

    valid: bool | str
    explanation: str  # the counterexample of each invalid key, or why unknown; "" if valid
    result: CheckResult  # the checker's whole answer (per-key table, JSON, timeline)


MessageFilter = Callable[[Message], bool]


class Simulation:
    """N nodes, one network, clients, a trace and a safety monitor; see the module doc."""

    def __init__(
        self,
        node_count: int = 3,
        seed: int = 0,
        variant: SimVariant | None = None,
        compact_every_entries: int = 0,
        record_trace: bool = True,
        spare_nodes: int = 0,
        pipeline: bool = False,
        **config: object,
    ) -> None:
        if node_count < 1:
            raise ValueError(f"node_count must be at least 1, got {node_count}")
        self.seed = seed
        self.variant = variant or SimVariant()
        # What it takes to build this simulation again (system/sim/schedule.py replays it).
        self.settings: dict[str, object] = {
            "node_count": node_count, "seed": seed,
            "compact_every_entries": compact_every_entries, "spare_nodes": spare_nodes,
            **({"pipeline": True} if pipeline else {}), **config,
        }
        # The real node's ordering for a leader (docs/raft.md, thesis §10.2.1): its APPENDs
        # leave before its own fsync, which completes at `finish_persist` (system/sim/shell.py).
        # Off: every Ready is fsynced before its messages leave.
        self.pipeline = pipeline
        # When a list: every action taken on the simulation from outside is appended as a
        # `Step`, so a run can be replayed and shrunk (system/sim/schedule.py, shrink.py).
        self.schedule: list[Step] | None = None
        self.compact_every_entries = compact_every_entries  # 0: never snapshot
        self.record_trace = record_trace
        # n1..n{node_count} are the bootstrap voters; the spare nodes after them run from
        # the start but are not members until a membership change adds them (each knows
        # the bootstrap voters and itself as a learner, as a node started to join does).
        members = tuple(f"n{i}" for i in range(1, node_count + 1))
        spares = tuple(f"n{i}" for i in range(node_count + 1, node_count + spare_nodes + 1))
        self.node_ids: tuple[NodeId, ...] = members + spares
        self.rng = random.Random(f"raft-sim:{seed}:simulation")
        self.step_count = 0
        self.trace: list[str] = []
        # (node, rule, text) of every report of a broken safety property, as the real node
        # logs it: the core's Ready.errors (a committed log that diverged) and the
        # shell's RuleWatch findings (system/raft/watch.py).
        self.safety_reports: list[tuple[NodeId, str, str]] = []
        self.history: list[HistoryEvent] = []
        self.ops: list[ClientOp] = []
        self._last_op_of: dict[int, ClientOp] = {}  # process -> its latest op (one open at most)
        # Requests sent to a paused node: they wait in its socket until it resumes
        # (`deliver_held`) or crashes, as a real SIGSTOPped process's requests do.
        self.held: list[tuple[ClientOp, Attempt]] = []
        self.network = FakeNetwork()
        self.entries_applied = 0
        self.faults: dict[str, int] = {}
        base = RaftConfig(node_id=self.node_ids[0], voters=members, **config)  # type: ignore[arg-type]
        self.monitor = SafetyMonitor(self.node_ids, pre_vote=base.pre_vote)
        self.monitor.voters = members
        self.monitor.quorum = len(members) // 2 + 1
        self.monitor.voters_of = self._voters_of
        shell_class = self.variant.shell_class or NodeShell
        self.nodes: dict[NodeId, NodeShell] = {}
        for node_id in self.node_ids:
            learners = (node_id,) if node_id in spares else ()
            node_config = RaftConfig(
                node_id=node_id, voters=members, learners=learners, **config  # type: ignore[arg-type]
            )
            self.nodes[node_id] = shell_class(self, node_id, node_config)
        self._next_process = 0
        self.acknowledged_writes: list[ClientOp] = []
        for node_id in self.node_ids:
            self.nodes[node_id].start()

    # -- trace ------------------------------------------------------------------------------

    def record(self, line: str) -> None:
        if self.record_trace:
            self.trace.append(f"{self.step_count} {line}")

    def trace_hash(self) -> str:
        """sha256 of the trace: equal for two runs iff they did the same things in order."""
        hasher = hashlib.sha256()
        for line in self.trace:
            hasher.update(line.encode())
            hasher.update(b"\n")
        return hasher.hexdigest()

    def _note(self, kind: str, *args: object) -> None:
        if self.schedule is not None:
            self.schedule.append(Step(kind, args))

    def _begin_step(self) -> None:
        self.step_count += 1
        self.monitor.step = self.step_count

    def count_fault(self, kind: str, amount: int = 1) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + amount

    # -- views ------------------------------------------------------------------------------

    def core(self, node: NodeId) -> RaftCore:
        core = self.nodes[node].core
        if core is None:
            raise LookupError(f"{node} is crashed; restart it first")
        return core

    def _voters_of(self, node: NodeId) -> tuple[NodeId, ...]:
        shell = self.nodes[node]
        return shell.core.membership.voters if shell.core is not None else self.monitor.voters

    def members(self) -> tuple[NodeId, ...]:
        """The members (voters and learners) in the latest membership any live node holds
        at the highest index: the nodes a healthy cluster must keep up to date."""
        best = None
        for node in self.alive():
            core = self.core(node)
            key = (core.log.last_index(), core.term)
            if core.role is Role.LEADER:
                key = (1 << 62, core.term)
            if best is None or key > best[0]:
                best = (key, core.membership.members())
        return best[1] if best else self.node_ids

    def change_membership(self, node: NodeId, kind: object, target: NodeId,
                          wait: bool = True, max_steps: int = 2_000) -> tuple[int, int]:
        """Ask leader `node` for a membership change of `target` (MembershipChangeKind);
        with `wait`, run until the change is committed (and applied) on the leader."""
        self._begin_step()
        self.record(f"membership {getattr(kind, 'value', kind)} {target} via {node}")
        self.count_fault(f"membership {getattr(kind, 'value', kind)}")
        core = self.core(node)
        index, term = self.nodes[node].watch.change_membership(core, kind, target)
        self._note("membership", node, getattr(kind, "value", kind), target)  # not if refused
        self.nodes[node].after_input()
        if wait:
            self.run_until(
                lambda: node in self.alive() and self.nodes[node].applied_index >= index,
                max_steps, f"membership change at {index} applied on {node}",
            )
        return index, term

    def replica(self, node: NodeId) -> Replica:
        """`node`'s copy of the store's state machine."""
        return self.nodes[node].replica

    def alive(self) -> list[NodeId]:
        return [n for n in self.node_ids if self.nodes[n].alive]

    def leader(self) -> NodeId | None:
        """The live leader of the highest term, if any."""
        best: tuple[int, NodeId] | None = None
        for node in self.alive():
            core = self.core(node)
            if core.role is Role.LEADER and (best is None or core.term > best[0]):
                best = (core.term, node)
        return best[1] if best else None

    def leaders(self) -> list[NodeId]:
        return [n for n in self.alive() if self.core(n).role is Role.LEADER]

    @property
    def violations(self) -> list[Violation]:
        return self.monitor.violations

    def describe_cluster(self) -> str:
        lines = []
        for node in self.node_ids:
            shell = self.nodes[node]
            if shell.core is None:
                lines.append(f"{node}: crashed")
            else:
                lines.append(f"{node}: {shell.core!r} applied={shell.applied_index}")
        lines.append(f"in flight: {len(self.network.in_flight)}")
        return "\n".join(lines)

    # -- network ----------------------------------------------------------------------------

    def send(self, message: Message) -> None:
        """A node hands a message to the network (during its Ready)."""
        if self.network.is_cut(message.src, message.dst):
            self.record(f"lost (link cut) {describe(message)}")
            return
        flight = self.network.add(message, self.step_count)
        self.record(f"send #{flight.id} {describe(message)}")

    def pending(
        self,
        type: MessageType | tuple[MessageType, ...] | None = None,  # noqa: A002 -- reads as the message field
        src: NodeId | None = None,
        dst: NodeId | None = None,
        where: MessageFilter | None = None,
        id: int | None = None,  # noqa: A002
    ) -> list[InFlight]:
        """Messages in flight matching every given criterion, oldest first."""
        types = (type,) if isinstance(type, MessageType) else type
        result = []
        for flight in self.network.in_flight.values():
            m = flight.message
            if id is not None and flight.id != id:
                continue
            if types is not None and m.type not in types:
                continue
            if (src is not None and m.src != src) or (dst is not None and m.dst != dst):
                continue
            if where is not None and not where(m):
                continue
            result.append(flight)
        return result

    def _one(self, criteria: dict) -> InFlight:
        matches = self.pending(**criteria)
        if not matches:
            in_flight = "\n  ".join(
                f"#{f.id} {describe(f.message)}" for f in self.network.in_flight.values()
            )
            raise LookupError(
                f"no message in flight matches {criteria}; in flight:\n  {in_flight or '(none)'}"
            )
        return matches[0]

    def deliver(self, **criteria: object) -> Message:
        """Deliver the oldest in-flight message matching `criteria` (see `pending`)."""
        flight = self._one(criteria)
        self._begin_step()
        self._deliver(flight)
        return flight.message

    def hold(self, **criteria: object) -> list[InFlight]:
        """Keep matching messages in flight but out of the default schedule (run_until,
        step) until `release` or an explicit `deliver`: "this message is slow"."""
        matches = self.pending(**criteria)
        self._begin_step()
        for flight in matches:
            self.network.held.add(flight.id)
            self.record(f"hold #{flight.id} {describe(flight.message)}")
        return matches

    def release(self, **criteria: object) -> None:
        self._begin_step()
        for flight in self.pending(**criteria):
            self.network.held.discard(flight.id)
            self.record(f"release #{flight.id}")

    def _deliver(self, flight: InFlight) -> None:
        if self.schedule is not None:
            self._note("deliver", message_key(flight, self.network.in_flight.values()))
        del self.network.in_flight[flight.id]
        self.network.held.discard(flight.id)
        message = flight.message
        shell = self.nodes.get(message.dst)
        if shell is None or shell.core is None:
            self.record(f"lost (destination down) #{flight.id} {describe(message)}")
            return
        self.record(f"deliver #{flight.id} {describe(message)}")
        self.monitor.delivered(message)
        shell.watch.step(shell.core, message)
        shell.after_input()

    def deliver_flight(self, flight: InFlight) -> None:
        """Deliver this in-flight message now (the randomized schedule's fast path)."""
        self._begin_step()
        self._deliver(flight)

    def drop_flight(self, flight: InFlight, reason: str = "drop") -> None:
        if self.schedule is not None:
            self._note("drop", message_key(flight, self.network.in_flight.values()))
        self._begin_step()
        del self.network.in_flight[flight.id]
        self.record(f"{reason} #{flight.id} {describe(flight.message)}")
        self.count_fault(reason)

    def duplicate_flight(self, flight: InFlight) -> None:
        if self.schedule is not None:
            self._note("duplicate", message_key(flight, self.network.in_flight.values()))
        self._begin_step()
        copy = self.network.add(flight.message, self.step_count)
        self.record(f"duplicate #{flight.id} as #{copy.id}")
        self.count_fault("duplicate")

    def deliver_all(self, max_messages: int = 10_000, **criteria: object) -> int:
        """Deliver matching messages (including ones sent meanwhile) until none is left."""
        delivered = 0
        while delivered < max_messages:
            matches = self.pending(**criteria)
            if not matches:
                return delivered
            self._begin_step()
            self._deliver(matches[0])
            delivered += 1
        raise SimulationStuck(f"still delivering {criteria} after {max_messages} messages")

    def drop(self, **criteria: object) -> int:
        """Lose every in-flight message matching `criteria`; returns how many."""
        matches = self.pending(**criteria)
        self._begin_step()
        for flight in matches:
            del self.network.in_flight[flight.id]
            self.record(f"drop #{flight.id} {describe(flight.message)}")
        self.count_fault("drop", len(matches))
        return len(matches)

    def duplicate(self, **criteria: object) -> int:
        """Put a second copy of each matching message on the wire (delivered later)."""
        matches = self.pending(**criteria)
        self._begin_step()
        for flight in matches:
            copy = self.network.add(flight.message, self.step_count)
            self.record(f"duplicate #{flight.id} as #{copy.id}")
        self.count_fault("duplicate", len(matches))
        return len(matches)

    def delay(self, **criteria: object) -> int:
        """Move matching messages to the back of the queue (behind everything sent)."""
        matches = self.pending(**criteria)
        self._begin_step()
        for flight in matches:
            del self.network.in_flight[flight.id]
            self.network.in_flight[flight.id] = flight
            self.record(f"delay #{flight.id}")
        self.count_fault("delay", len(matches))
        return len(matches)

    def reorder(self) -> None:
        """Shuffle the whole queue (with the simulation's seeded rng)."""
        self._begin_step()
        flights = list(self.network.in_flight.values())
        self.rng.shuffle(flights)
        self.network.in_flight = {f.id: f for f in flights}
        self.record("reorder " + ",".join(str(f.id) for f in flights))
        self.count_fault("reorder")

    def cut(self, src: NodeId, dst: NodeId, both_ways: bool = True) -> None:
        """Cut the link src -> dst (and dst -> src unless both_ways=False). Messages in
        flight on a cut link are lost, and so is everything sent on it until healed."""
        self._check_nodes([src, dst])
        self._note("cut", src, dst, both_ways)
        self._begin_step()
        links = [(src, dst), (dst, src)] if both_ways else [(src, dst)]
        for link in links:
            self.network.cut_links.add(link)
        self.record(f"cut {src}{'<' if both_ways else ''}->{dst}")
        self.count_fault("partition" if both_ways else "one-way cut")
        self._drop_on_cut_links()

    def partition(self, *groups: Iterable[NodeId]) -> None:
        """Cut every link between nodes of different groups; nodes in no group stay
        connected to everyone. partition({"n1"}, {"n2", "n3"}) isolates n1."""
        sets = [sorted(set(g)) for g in groups]
        for group in sets:
            self._check_nodes(group)
        self._note("partition", tuple(tuple(g) for g in sets))
        self._begin_step()
        for i, group in enumerate(sets):
            for other in sets[i + 1 :]:
                for a in group:
                    for b in other:
                        self.network.cut_links.update({(a, b), (b, a)})
        self.record("partition " + " | ".join(",".join(g) for g in sets))
        self.count_fault("partition")
        self._drop_on_cut_links()

    def isolate(self, node: NodeId) -> None:
        self.partition([node], [n for n in self.node_ids if n != node])

    def heal(self) -> None:
        """Reconnect every link."""
        self._note("heal")
        self._begin_step()
        self.network.cut_links.clear()
        self.record("heal")

    def heal_link(self, src: NodeId, dst: NodeId) -> None:
        """Reconnect the one link src -> dst (the other direction is left as it is)."""
        self._check_nodes([src, dst])
        self._note("heal_link", src, dst)
        self._begin_step()
        self.network.cut_links.discard((src, dst))
        self.record(f"heal {src}->{dst}")

    def _drop_on_cut_links(self) -> None:
        for flight in list(self.network.in_flight.values()):
            if self.network.is_cut(flight.message.src, flight.message.dst):
                del self.network.in_flight[flight.id]
                self.record(f"lost (link cut) #{flight.id}")

    def _check_nodes(self, nodes: Iterable[NodeId]) -> None:
        for node in nodes:
            if node not in self.nodes:
                raise ValueError(f"unknown node {node!r}; nodes are {list(self.node_ids)}")

    # -- nodes ------------------------------------------------------------------------------

    def crash(self, node: NodeId, lose_unsynced: bool = False) -> None:
        """Kill `node`: its core, state machine and waiting clients are gone; its disk
        keeps what was written (or, with lose_unsynced, only what was fsynced)."""
        self._check_nodes([node])
        shell = self.nodes[node]
        if not shell.alive:
            raise ValueError(f"{node} is already crashed")
        self._note("crash", node, lose_unsynced)
        self._begin_step()
        self.record(f"crash {node}{' losing unsynced writes' if lose_unsynced else ''}")
        self.count_fault("crash losing unsynced writes" if lose_unsynced else "crash")
        shell.crash(lose_unsynced)
        for op, attempt in [h for h in self.held if h[1].node == node]:
            self.held.remove((op, attempt))
            self.attempt_unknown(op, attempt, f"{node} crashed with the request unread")

    def stop_fatally(self, node: NodeId, reason: str) -> None:
        """`node` stopped itself (its shell found a broken rule): crashed as a process exit,
        not a step of the schedule — it follows from the steps before it."""
        self.record(f"{node} stopped itself: {reason}")
        self.nodes[node].crash(lose_unsynced=False)
        for op, attempt in [h for h in self.held if h[1].node == node]:
            self.held.remove((op, attempt))
            self.attempt_unknown(op, attempt, f"{node} stopped with the request unread")

    def shorten_log(self, node: NodeId, keep_through: int) -> None:
        """The crashed `node`'s disk comes back holding only its entries up to
        `keep_through` (restored from an older copy, or wiped with keep_through=0, the
        hard state's term and vote kept): a fault outside Raft's model, which assumes
        stable storage never loses what it acknowledged."""
        self._check_nodes([node])
        shell = self.nodes[node]
        if shell.alive:
            raise ValueError(f"{node} is running; crash it first")
        self._begin_step()
        self.record(f"shorten log {node} to {keep_through}")
        self.count_fault("log shortened")
        for image in (shell.disk.current, shell.disk.durable):
            base = image.snapshot.index if image.snapshot else 0
            if keep_through < base:
                image.snapshot, image.snapshot_data, base = None, b"", 0
            image.entries = [e for e in image.entries if e.index <= keep_through]
            hard = image.hard_state
            image.hard_state = HardState(
                hard.term, hard.vote, min(hard.commit, image.last_index()), hard.catch_up_to
            )

    def restore_disk(self, node: NodeId, image) -> None:  # noqa: ANN001 - a disk image
        """The crashed `node`'s disk comes back as `image`, an older copy of its own
        (`FakeDisk.current.copy()` taken earlier: a backup restored): a fault outside
        Raft's model, which assumes stable storage never loses what it acknowledged."""
        self._check_nodes([node])
        shell = self.nodes[node]
        if shell.alive:
            raise ValueError(f"{node} is running; crash it first")
        self._begin_step()
        self.record(f"restore {node}'s disk from a copy (log to {image.last_index()})")
        self.count_fault("disk restored from a copy")
        shell.disk.current, shell.disk.durable = image.copy(), image.copy()

    def restart(self, node: NodeId) -> None:
        """Boot a crashed node from its disk (snapshot + log + hard state)."""
        self._check_nodes([node])
        shell = self.nodes[node]
        if shell.alive:
            raise ValueError(f"{node} is running; crash it first")
        self._note("restart", node)
        self._begin_step()
        self.record(f"restart {node}")
        self.count_fault("restart")
        shell.start()

    def persisting(self) -> list[NodeId]:
        """Nodes whose pipelined Ready's fsync has not completed yet, in node order."""
        return [n for n in self.node_ids if self.nodes[n].persisting is not None]

    def finish_persist(self, node: NodeId) -> None:
        """`node`'s pending fsync completes (the pipelined ordering, system/sim/shell.py):
        it sends the rest of that Ready, applies, `advance`s, and takes its next Ready."""
        self._check_nodes([node])
        shell = self.nodes[node]
        if shell.persisting is None:
            raise ValueError(f"{node} has no fsync pending")
        self._note("fsync", node)
        self._begin_step()
        self.record(f"fsync done {node}")
        shell.finish_persist()

    def tick(self, node: NodeId | None = None, times: int = 1) -> None:
        """Advance logical time by `times` ticks on `node`, or on every live node."""
        for _ in range(times):
            self.tick_nodes([node] if node is not None else self.alive())

    def tick_nodes(self, nodes: Iterable[NodeId]) -> None:
        """One step in which exactly `nodes` (live ones) advance their clocks by a tick."""
        targets = list(nodes)
        self._check_nodes(targets)
        for target in targets:
            if self.nodes[target].core is None:
                raise ValueError(f"cannot tick {target}: it is crashed")
        self._note("tick", tuple(targets))
        self._begin_step()
        self.record(f"tick {','.join(targets)}")
        for target in targets:
            shell = self.nodes[target]
            if shell.core is None:
                raise ValueError(f"cannot tick {target}: it is crashed")
            shell.watch.tick(shell.core)
            shell.after_input()

    def step(self) -> None:
        """One step of the default fair schedule: deliver the oldest message in flight,
        or tick every live node when the network is idle."""
        held = self.network.held
        for flight in self.network.in_flight.values():
            if flight.id not in held:
                self._begin_step()
                self._deliver(flight)
                return
        persisting = self.persisting()
        if persisting:
            self.finish_persist(persisting[0])
            return
        self.tick()

    def run_until(
        self,
        condition: Callable[[], bool],
        max_steps: int = 2_000,
        what: str = "",
        required: bool = True,
    ) -> int:
        """Run the default schedule until `condition()` holds; returns the steps taken.
        After max_steps: raises SimulationStuck (with the cluster's state), or returns -1
        if not `required`."""
        for taken in range(max_steps + 1):
            if condition():
                return taken
            if taken < max_steps:
                self.step()
        if not required:
            return -1
        raise SimulationStuck(
            f"{what or 'condition'} still false after {max_steps} steps\n"
            + self.describe_cluster()
        )

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()

    def settle(self, max_messages: int = 10_000) -> int:
        """Deliver messages in send order (skipping held ones), without ticking, until
        none is left; returns how many were delivered."""
        return self._drain(lambda: False, max_messages)

    def _drain(self, stop: Callable[[], bool], max_messages: int = 10_000) -> int:
        held = self.network.held
        for delivered in range(max_messages):
            if stop():
                return delivered
            flight = next((f for f in self.network.in_flight.values() if f.id not in held), None)
            if flight is None:
                persisting = self.persisting()
                if not persisting:
                    return delivered
                self.finish_persist(persisting[0])  # an fsync is not time passing
                continue
            self._begin_step()
            self._deliver(flight)
        raise SimulationStuck(f"messages still flowing after {max_messages} deliveries")

    def campaign(self, node: NodeId, wait_for_commit: bool = True, max_rounds: int = 20) -> None:
        """Make `node` the leader, as a test scenario wants: time passes on `node` until it
        campaigns, while the other live nodes are ticked only as long as that cannot make
        them campaign (so their leader lease runs out but they do not compete); then the
        messages are delivered. Stops the moment `node` leads, unless wait_for_commit:
        then runs on until it has committed an entry of its term (ReadIndex-ready)."""
        target = self.core(node)
        limit = 4 * target.config.election_timeout_ticks
        for round_number in range(max_rounds):
            campaign_types = (MessageType.PRE_VOTE, MessageType.VOTE)
            for _ in range(limit):
                if target.role is Role.LEADER or self.pending(type=campaign_types, src=node):
                    break
                self._begin_step()
                ticked = [node]
                for other in self.alive():
                    core = self.core(other)
                    # After a few failed rounds, let time pass for everyone (a node whose
                    # timeout equals the lease length can otherwise block the vote).
                    # Leaders are not ticked: their clock standing still keeps a deposed
                    # leader believing it leads, which is what scenarios want to show.
                    if other != node and core.role is not Role.LEADER and (
                        round_number >= 3
                        or core.election_elapsed + 1 < core.randomized_election_timeout
                    ):
                        ticked.append(other)
                self.record(f"tick {','.join(ticked)}")
                for other in ticked:
                    self.core(other).tick()
                    self.nodes[other].after_input()
            self._drain(lambda: self.core(node).role is Role.LEADER)
            if target.role is Role.LEADER:
                break
        else:
            raise SimulationStuck(
                f"{node} did not win an election in {max_rounds} rounds\n"
                + self.describe_cluster()
            )
        if wait_for_commit:
            self.run_until(
                lambda: self.core(node).role is Role.LEADER and self.core(node).read_barrier_open(),
                2_000,
                f"{node} committing an entry of its term",
            )

    # -- clients ----------------------------------------------------------------------------

    def new_process(self) -> int:
        self._next_process += 1
        return self._next_process

    def invoke(
        self, f: Function, key: str, value: str | None = None,
        expected_version: int | None = None, process: int | None = None,
        request_id: str | None = None, stale: bool = False, retry_on_refusal: bool = False,
    ) -> ClientOp:
        """Record a client's invoke without sending it anywhere yet (see `submit`).
        `retry_on_refusal`: a driven client retries refused attempts itself, so a refusal
        does not complete the op as `fail`."""
        process = self.new_process() if process is None else process
        # Only a process's latest op can be open; scanning every op made a run quadratic.
        last = self._last_op_of.get(process)
        if last is not None and not last.done:
            raise ValueError(f"process {process} already has an open operation")
        op_id = len(self.ops) + 1
        op = ClientOp(
            id=op_id, process=process, f=f, key=key, value=value,
            expected_version=expected_version,
            request_id=request_id or (f"w{op_id}" if f is not Function.GET else ""),
            stale=stale, retry_on_refusal=retry_on_refusal, invoked_step=self.step_count,
        )
        self.ops.append(op)
        self._last_op_of[process] = op
        self._note("invoke", op.id, f.value, key, value, expected_version, process,
                   op.request_id, stale, retry_on_refusal)
        self._history(op, EventType.INVOKE)
        return op

    def _history(self, op: ClientOp, type: EventType) -> None:  # noqa: A002
        invoke = type is EventType.INVOKE
        if invoke:
            value, version = op.value, None
        elif op.f is Function.GET:
            value, version = op.result_value, op.result_version
        else:
            value, version = op.value, op.result_version
        event = HistoryEvent(
            index=len(self.history), type=type, process=op.process, f=op.f, key=op.key,
            value=value, version=version, expected_version=op.expected_version,
            request_id=op.request_id, node="" if invoke else op.answered_by,
            stale=op.stale, step=self.step_count,
            error="" if invoke else op.error, applied=None if invoke else op.applied,
        )
        self.history.append(event)
        self.record(f"history {event.line()}")

    def submit(self, op: ClientOp, node: NodeId, *, held: bool = False) -> Attempt:
        """Send (or resend, with the same request id) `op` to `node`. `held`: the node is
        paused, so the request waits unread in its socket until `deliver_held`."""
        if op.done:
            raise ValueError(f"operation {op.id} already completed ({op.status.value})")
        self._check_nodes([node])
        self._note("submit_held" if held else "submit", op.id, node)
        self._begin_step()
        attempt = Attempt(node=node, step=self.step_count)
        op.attempts.append(attempt)
        self.record(f"client p{op.process} op{op.id} -> {node} (attempt {len(op.attempts)})"
                    + (" waits: the node is paused" if held else ""))
        shell = self.nodes[node]
        if not shell.alive:
            self.attempt_refused(op, attempt, f"{node} is down (connection refused)")
        elif held:
            self.held.append((op, attempt))
        elif op.f is Function.GET:
            shell.submit_read(op, attempt)
        else:
            shell.submit_write(op, attempt)
        return attempt

    def deliver_held(self, node: NodeId) -> int:
        """`node` resumed: the requests that waited in its socket reach it, oldest first,
        whether or not their clients still wait (a write then still applies, as a real
        node's would; a read nobody waits for any more is dropped). Returns how many."""
        self._check_nodes([node])
        waiting = [h for h in self.held if h[1].node == node]
        if not waiting:
            return 0
        self._note("deliver_held", node)
        self.held = [h for h in self.held if h[1].node != node]
        shell = self.nodes[node]
        for op, attempt in waiting:
            self._begin_step()
            self.record(f"{node} reads op{op.id}'s request, held while it was paused")
            if op.f is Function.GET:
                if not op.done and attempt.state is AttemptState.WAITING:
                    shell.submit_read(op, attempt)
            else:
                shell.submit_write(op, attempt)
        return len(waiting)

    def put(self, node: NodeId, key: str, value: str, process: int | None = None,
            request_id: str | None = None) -> ClientOp:
        """A client writes key=value through `node`."""
        op = self.invoke(Function.PUT, key, value, process=process, request_id=request_id)
        self.submit(op, node)
        return op

    def cas(self, node: NodeId, key: str, expected_version: int, value: str,
            process: int | None = None, request_id: str | None = None) -> ClientOp:
        """A client writes key=value through `node` if the key's version is expected_version."""
        op = self.invoke(Function.CAS, key, value, expected_version, process, request_id)
        self.submit(op, node)
        return op

    def get(self, node: NodeId, key: str, stale: bool = False,
            process: int | None = None) -> ClientOp:
        """A client reads `key` through `node`: linearizable (ReadIndex) unless stale."""
        op = self.invoke(Function.GET, key, process=process, stale=stale)
        self.submit(op, node)
        return op

    def retry(self, op: ClientOp, node: NodeId) -> Attempt:
        """The client resends `op` (same request id) to `node`."""
        return self.submit(op, node)

    def give_up(self, op: ClientOp, reason: str = "client gave up") -> None:
        """The client stops waiting: info if any attempt may still apply, else fail."""
        if op.done:
            return
        self._note("give_up", op.id, reason)
        for attempt in op.attempts:
            if attempt.state is AttemptState.WAITING:
                attempt.state, attempt.reason = AttemptState.UNKNOWN, reason
        op.error = reason
        self._complete(op, OpStatus.INFO if op.maybe_applied() else OpStatus.FAIL)

    def time_out(self, op: ClientOp, reason: str = "client timed out") -> None:
        """The client stops waiting for its latest attempt (it may still apply) and is
        free to retry elsewhere with the same request id."""
        if op.done or not op.attempts or op.attempts[-1].state is not AttemptState.WAITING:
            raise ValueError(f"operation {op.id} has no attempt waiting to time out")
        self._note("time_out", op.id, reason)
        self.attempt_unknown(op, op.attempts[-1], reason)

    def finish(self) -> None:
        """End of the run: every open operation completes as info (or fail if certain)."""
        for op in self.ops:
            self.give_up(op, "run ended")

    def _complete(self, op: ClientOp, status: OpStatus) -> None:
        op.status = status
        self._history(op, EventType(status.value))
        if status is OpStatus.OK and op.f is not Function.GET:
            self.acknowledged_writes.append(op)

    # Callbacks from the shells. An answer completes the op; a refusal completes it only
    # when nothing else may still apply (and the client does not retry by itself).

    def attempt_answered(
        self, op: ClientOp, attempt: Attempt, node: NodeId, ok: bool, value: str | None,
        version: int | None, error: str = "", mismatch: bool = False,
        applied_index: int | None = None,
    ) -> None:
        """`node` answered: `ok`, or not applied. `mismatch`: a CAS whose expected version
        was not `version`, the key's version when it was applied (an answer that carries
        information, unlike other failures)."""
        attempt.state = AttemptState.ANSWERED
        if op.done:
            return
        op.result_value, op.result_version, op.answered_by, op.error = value, version, node, error
        op.result_applied_index = applied_index
        if op.f is not Function.GET:
            op.applied = True if ok else (False if mismatch else None)
        self._complete(op, OpStatus.OK if ok else OpStatus.FAIL)

    def attempt_refused(self, op: ClientOp, attempt: Attempt, reason: str) -> None:
        attempt.state, attempt.reason = AttemptState.REFUSED, reason
        self.record(f"client op{op.id} attempt refused: {reason}")
        if op.done or op.retry_on_refusal or op.maybe_applied():
            return
        op.error = reason
        self._complete(op, OpStatus.FAIL)

    def attempt_unknown(self, op: ClientOp, attempt: Attempt, reason: str) -> None:
        if attempt.state is AttemptState.WAITING:
            attempt.state, attempt.reason = AttemptState.UNKNOWN, reason
            self.record(f"client op{op.id} attempt unknown: {reason}")

    # -- end-of-run checks --------------------------------------------------------------------

    def check_linearizable(self, check: LinearizabilityCheck,
                           budget_s: float = DEFAULT_CHECK_BUDGET_S) -> Verdict:
        """Is the clients' history linearizable for the register? `check` decides: the
        project's checker, `checker.check_versioned_kv` (model `versioned-kv`, every key).

        `budget_s` is CPU time per key, the only thing here that is not a function
        of the seed: when it runs out the verdict is "unknown" (reported as such, never as
        valid), so a slow machine can turn a verdict into "unknown" but never flip it."""
        # (versioned-kv forgets the values no read returned: docs/raft-testing.md)
        result = check(to_records(self.history), budget_s=budget_s)
        if result.valid is False:
            explanation = "\n".join(c.text() for c in result.counterexamples)
        elif result.valid is True:
            explanation = ""
        else:
            explanation = f"the checker could not decide: {result.note}"
        return Verdict(result.valid, explanation, result)

    def check_final_state(self) -> None:
        """After the cluster converged: every acknowledged write is in every caught-up
        node's request table, and caught-up nodes hold identical state machines."""
        alive = self.alive()
        if not alive:
            return
        top = max(self.nodes[n].applied_index for n in alive)
        caught_up = [n for n in alive if self.nodes[n].applied_index == top]
        for op in self.acknowledged_writes:
            if not self.nodes[op.answered_by].proposal_request_id(op):
                continue  # proposed without its id (a canary): no table entry to look for
            for node in caught_up:
                if self.replica(node).result_of(op.request_id) is None:
                    self.monitor.violate(
                        Rule.ACKNOWLEDGED_WRITE_LOST,
                        f"write {op.request_id!r} ({op.f.value} {op.key}={op.value!r}) was "
                        f"acknowledged by {op.answered_by} but {node} (applied {top}) has "
                        "no record of it",
                    )
        digests = {n: self.replica(n).digest() for n in caught_up}
        if len(set(digests.values())) > 1:
            self.monitor.violate(
                Rule.STATE_MACHINE_SAFETY,
                f"nodes applied to index {top} hold different states: {digests}",
            )
        for node in alive:
            core, disk = self.core(node), self.nodes[node].disk.current
            if tuple(disk.entries) != core.log_entries():
                self.monitor.violate(
                    Rule.STORAGE,
                    f"{node}'s durable log ({len(disk.entries)} entries after "
                    f"{disk.snapshot.index if disk.snapshot else 0}) differs from its core's "
                    f"log ({len(core.log_entries())} entries after {core.log.snapshot_index})",
                )


