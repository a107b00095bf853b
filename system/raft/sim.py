"""A deterministic simulator of a Raft cluster: N cores over a fake network and fake disks.

What it is for: to test the Raft core by controlling the interleaving, not the clock
(the design essay's lesson). Everything comes from one seed: each node's core gets its own
`random.Random` derived from (seed, node, incarnation), and the randomized schedule of
`system.raft.swarm` gets another. A test drives the cluster one event at a time:

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
`FakeNetwork`, applies committed entries to its `Register` (the replicated state
machine), serves ReadIndex reads once applied, answers waiting clients, then calls
`advance`. Every event is one line of `trace`; `trace_hash()` fingerprints a run, and
the same seed always gives the same hash. A `SafetyMonitor` sees every persisted and
applied entry and the core's role/term/commit after every input, and records violations
of Raft's safety properties; the clients' operations form a Jepsen-style history that
`check_linearizable()` hands to the project's checker (`checker`, model `versioned-kv`).

Run `python -m system.raft.sim --seeds 200` for the randomized simulation (see swarm.py).

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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum

import checker
from system.raft.core import NotLeader, ProposalDropped, RaftConfig, RaftCore, Ready, Role
from system.raft.history import (
    EventType,
    Function,
    HistoryEvent,
    forget_unread_values,
    to_records,
)
from system.raft.invariants import Rule, SafetyMonitor, Violation
from system.raft.messages import Message, MessageType
from system.raft.register import Command, CorruptSnapshot, Operation, Register, encode_command
from system.raft.types import Entry, HardState, NodeId, PersistentState, SnapshotMeta

# ---------------------------------------------------------------------------------------
# Variants: which core, shell and state machine a simulation runs
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SimVariant:
    """The classes a simulation is built from. The default is the real thing; tests pass
    deliberately broken subclasses to show that a safety test can fail."""

    name: str = "correct"
    core_class: type[RaftCore] = RaftCore
    shell_class: type[NodeShell] | None = None  # None: NodeShell
    register_class: type[Register] = Register
    description: str = "the real core, shell and register"


# ---------------------------------------------------------------------------------------
# Fake durable storage
# ---------------------------------------------------------------------------------------


@dataclass
class _DiskImage:
    hard_state: HardState = field(default_factory=HardState)
    snapshot: SnapshotMeta | None = None
    snapshot_data: bytes = b""
    entries: list[Entry] = field(default_factory=list)  # contiguous, after the snapshot

    def copy(self) -> _DiskImage:
        return _DiskImage(self.hard_state, self.snapshot, self.snapshot_data, list(self.entries))

    def last_index(self) -> int:
        if self.entries:
            return self.entries[-1].index
        return self.snapshot.index if self.snapshot else 0


class FakeDisk:
    """One node's disk: what the OS holds (`current`) and what survived the last fsync
    (`durable`). A process crash keeps the OS's page cache; a power loss
    (`lose_unsynced=True`) rolls back to the last fsync."""

    def __init__(self) -> None:
        self.durable = _DiskImage()
        self.current = _DiskImage()
        self.sync_count = 0

    def write_hard_state(self, hard_state: HardState) -> None:
        self.current.hard_state = hard_state

    def append(self, entries: tuple[Entry, ...]) -> None:
        """Append, first dropping the stored suffix from entries[0].index on (Ready rule)."""
        image = self.current
        first = entries[0].index
        base = image.snapshot.index if image.snapshot else 0
        if first <= base:
            raise ValueError(
                f"asked to persist entry {first} at or below the snapshot index {base}"
            )
        if first > image.last_index() + 1:
            raise ValueError(
                f"asked to persist entries from {first} after last index {image.last_index()}"
            )
        del image.entries[first - base - 1 :]
        image.entries.extend(entries)

    def install_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        """A snapshot from the leader: store it and drop ALL stored entries (the Ready
        contract: it is only emitted when the log lacks the snapshot's last entry, so every
        stored entry is covered by it or from a divergent history)."""
        self.current.entries = []
        self.current.snapshot, self.current.snapshot_data = meta, data

    def save_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        """The shell's own snapshot (before `compact`): written and fsynced at once."""
        for image in (self.current, self.durable):
            image.entries = [e for e in image.entries if e.index > meta.index]
            image.snapshot, image.snapshot_data = meta, data

    def sync(self) -> None:
        self.durable = self.current.copy()
        self.sync_count += 1

    def crash(self, lose_unsynced: bool) -> None:
        if lose_unsynced:
            self.current = self.durable.copy()
        else:
            self.durable = self.current.copy()

    def load(self) -> PersistentState:
        image = self.current
        return PersistentState(
            hard_state=image.hard_state,
            snapshot=image.snapshot,
            snapshot_data=image.snapshot_data,
            entries=tuple(image.entries),
        )


# ---------------------------------------------------------------------------------------
# Fake network
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InFlight:
    """A message on the wire. `id` is unique in a run and names it in tests and traces."""

    id: int
    message: Message
    sent_step: int


def describe(message: Message) -> str:
    """A short, deterministic, human-readable rendering of a message."""
    m = message
    parts = [f"{m.type.value} {m.src}->{m.dst} t{m.term}"]
    if m.index or m.log_term:
        parts.append(f"i{m.index} lt{m.log_term}")
    if m.entries:
        parts.append(f"entries[{m.entries[0].index}..{m.entries[-1].index}]")
    if m.commit:
        parts.append(f"c{m.commit}")
    if m.reject:
        parts.append(f"REJECT hint{m.reject_hint}/{m.reject_term}")
    if m.context:
        parts.append(f"ctx={m.context.hex()}")
    if m.snapshot is not None:
        parts.append(f"snap({m.snapshot.index},{m.snapshot.term}) off{m.offset}+{len(m.data)}")
    if m.done:
        parts.append("done")
    return " ".join(parts)


class FakeNetwork:
    """Messages in flight, in send order, plus the set of cut (src, dst) links."""

    def __init__(self) -> None:
        self.in_flight: dict[int, InFlight] = {}  # insertion-ordered: oldest first
        self.cut_links: set[tuple[NodeId, NodeId]] = set()  # membership only, never iterated
        self.held: set[int] = set()  # ids the default schedule skips until released
        self.next_id = 1

    def add(self, message: Message, step: int) -> InFlight:
        flight = InFlight(self.next_id, message, step)
        self.next_id += 1
        self.in_flight[flight.id] = flight
        return flight

    def is_cut(self, src: NodeId, dst: NodeId) -> bool:
        return (src, dst) in self.cut_links


# ---------------------------------------------------------------------------------------
# Clients and their history
# ---------------------------------------------------------------------------------------


class AttemptState(Enum):
    WAITING = "waiting"  # the node holds it; no answer yet
    REFUSED = "refused"  # certainly never takes effect (not leader, overwritten, ...)
    ANSWERED = "answered"
    UNKNOWN = "unknown"  # the node crashed or the client stopped waiting: it may still apply


@dataclass
class Attempt:
    """One submission of a client operation to one node (retries make more)."""

    node: NodeId
    step: int
    state: AttemptState = AttemptState.WAITING
    index: int = 0  # writes: the proposed entry's index
    term: int = 0  # writes: the proposed entry's term
    context: bytes = b""  # linearizable reads: the ReadIndex id
    reason: str = ""
    leader_hint: NodeId | None = None  # NotLeader: the leader the node knows of


class OpStatus(Enum):
    OPEN = "open"
    OK = "ok"
    FAIL = "fail"
    INFO = "info"


@dataclass
class ClientOp:
    """One logical client operation: one invoke, at most one completion, any number of
    attempts, all carrying the same request id."""

    id: int
    process: int
    f: Function
    key: str
    value: str | None  # put/cas: the value to write
    expected_version: int | None  # cas only
    request_id: str
    stale: bool  # get only: serve from local state, no ReadIndex barrier
    retry_on_refusal: bool  # driven clients retry; hand-driven ops fail at once
    invoked_step: int
    attempts: list[Attempt] = field(default_factory=list)
    status: OpStatus = OpStatus.OPEN
    result_value: str | None = None
    result_version: int | None = None
    answered_by: NodeId = ""
    error: str = ""
    # Writes answered by a state machine: True applied, False a CAS whose expected version
    # did not match (result_version is the key's version then); None otherwise.
    applied: bool | None = None

    @property
    def done(self) -> bool:
        return self.status is not OpStatus.OPEN

    @property
    def ok(self) -> bool:
        return self.status is OpStatus.OK

    def waiting(self) -> bool:
        return any(a.state is AttemptState.WAITING for a in self.attempts)

    def maybe_applied(self) -> bool:
        return any(
            a.state in (AttemptState.WAITING, AttemptState.UNKNOWN) for a in self.attempts
        )


# ---------------------------------------------------------------------------------------
# The node shell
# ---------------------------------------------------------------------------------------


class NodeShell:
    """What the real node process does around a core, minus the I/O: carry out each
    Ready in order, keep the state machine, and answer clients."""

    def __init__(self, sim: Simulation, node_id: NodeId, config: RaftConfig) -> None:
        self.sim = sim
        self.node_id = node_id
        self.config = config
        self.disk = FakeDisk()
        self.incarnation = 0
        self.core: RaftCore | None = None
        self.register: Register = sim.variant.register_class()
        self.applied_index = 0  # highest index applied to `register`
        self.applied_term = 0  # term of the entry at applied_index
        self.snapshot_index = 0  # highest index our own or an installed snapshot covers
        # Writes waiting for their entry to come out committed: index -> [(term, op, attempt)].
        self.write_waiters: dict[int, list[tuple[int, ClientOp, Attempt]]] = {}
        self.read_waiters: dict[bytes, tuple[ClientOp, Attempt]] = {}  # ReadIndex pending
        self.reads_to_serve: list[tuple[int, ClientOp, Attempt]] = []  # confirmed, by index

    @property
    def alive(self) -> bool:
        return self.core is not None

    # -- life cycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Boot (or reboot) from whatever the disk holds."""
        restored = self.disk.load()
        register_class = self.sim.variant.register_class
        self.register = register_class()
        self.applied_index = self.applied_term = self.snapshot_index = 0
        if restored.snapshot is not None:
            try:
                self.register = register_class.restore(restored.snapshot_data)
            except CorruptSnapshot as error:
                self.sim.monitor.violate(Rule.SNAPSHOT, f"{self.node_id} restart: {error}")
            self.applied_index = self.snapshot_index = restored.snapshot.index
            self.applied_term = restored.snapshot.term
            self.sim.monitor.restored_state(
                self.node_id, self.applied_index, self.register.digest()
            )
        self.sim.monitor.node_started(self.node_id, restored.snapshot, restored.entries)
        self.incarnation += 1
        rng = random.Random(f"raft-sim:{self.sim.seed}:{self.node_id}:{self.incarnation}")
        self.core = self.sim.variant.core_class(self.config, rng, restored)
        self.after_input()

    def crash(self, lose_unsynced: bool) -> None:
        self.core = None
        self.disk.crash(lose_unsynced)
        for waiters in self.write_waiters.values():
            for _, op, attempt in waiters:
                self.sim.attempt_unknown(op, attempt, f"{self.node_id} crashed")
        for op, attempt in self.read_waiters.values():
            self.sim.attempt_unknown(op, attempt, f"{self.node_id} crashed")
        for _, op, attempt in self.reads_to_serve:
            self.sim.attempt_unknown(op, attempt, f"{self.node_id} crashed")
        self.write_waiters, self.read_waiters, self.reads_to_serve = {}, {}, []
        self.sim.monitor.node_crashed(self.node_id)

    # -- carrying out Readies ----------------------------------------------------------------

    def after_input(self) -> None:
        """Called after every input to the core: drain its Readies, then report to the
        monitor."""
        core = self.core
        assert core is not None
        while core.has_ready():
            ready = core.ready()
            self.handle_ready(ready)
            core.advance(ready)
            self.serve_reads()
            self.maybe_compact()
        self.sim.monitor.observe(
            self.node_id, core.role.value, core.term, core.commit_index, core.status().last_index
        )

    def handle_ready(self, ready: Ready) -> None:
        self.persist(ready)
        for warning in ready.warnings:
            self.sim.record(f"warning {self.node_id}: {warning}")
        for message in ready.messages:
            self.sim.send(message)
        if ready.snapshot is not None:
            self.restore_snapshot(ready.snapshot, ready.snapshot_data)
        for entry in ready.committed_entries:
            self.apply(entry)
        for read_state in ready.read_states:
            waiter = self.read_waiters.pop(read_state.context, None)
            if waiter is not None:
                self.reads_to_serve.append((read_state.index, *waiter))
        for context in ready.dropped_reads:
            waiter = self.read_waiters.pop(context, None)
            if waiter is not None:
                self.sim.attempt_refused(waiter[0], waiter[1], f"{self.node_id} lost leadership")

    def persist(self, ready: Ready) -> None:
        disk, monitor = self.disk, self.sim.monitor
        if ready.hard_state is not None:
            disk.write_hard_state(ready.hard_state)
        if ready.snapshot is not None:
            disk.install_snapshot(ready.snapshot, ready.snapshot_data)
            monitor.persisted_snapshot(self.node_id, ready.snapshot)
        if ready.entries:
            try:
                disk.append(ready.entries)
            except ValueError as error:
                monitor.violate(Rule.STORAGE, f"{self.node_id}: {error}")
            monitor.persisted_entries(self.node_id, ready.entries)
        if ready.must_sync:
            disk.sync()

    def restore_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        self.sim.record(f"{self.node_id} restores snapshot ({meta.index},{meta.term})")
        try:
            self.register = self.sim.variant.register_class.restore(data)
        except CorruptSnapshot as error:
            self.sim.monitor.violate(Rule.SNAPSHOT, f"{self.node_id} install: {error}")
        self.applied_index = self.snapshot_index = meta.index
        self.applied_term = meta.term
        self.sim.monitor.restored_state(self.node_id, meta.index, self.register.digest())
        # Writes waiting at covered indexes: the request-id table says whether they happened.
        for index in sorted(i for i in self.write_waiters if i <= meta.index):
            for _, op, attempt in self.write_waiters.pop(index):
                first = self.register.result_of(op.request_id)
                if first is None:
                    self.sim.attempt_refused(op, attempt, "not in the installed snapshot")
                else:
                    self.sim.attempt_answered(
                        op, attempt, self.node_id, first.ok, first.value, first.version,
                        first.error, mismatch=first.cas_mismatch,
                    )

    def apply(self, entry: Entry) -> None:
        if entry.index <= self.applied_index:
            return  # re-emitted after a restart; already in the restored snapshot
        if entry.index != self.applied_index + 1:
            self.sim.monitor.violate(
                Rule.STATE_MACHINE_SAFETY,
                f"{self.node_id} was asked to apply index {entry.index} after "
                f"{self.applied_index}: a gap",
            )
        result = self.register.apply(entry)
        self.applied_index, self.applied_term = entry.index, entry.term
        self.sim.entries_applied += 1
        monitor = self.sim.monitor
        digest = self.register.digest() if monitor.needs_state_digest(entry.index) else None
        monitor.applied_entry(self.node_id, entry, digest)
        for term, op, attempt in self.write_waiters.pop(entry.index, ()):
            if term != entry.term:
                self.sim.attempt_refused(
                    op, attempt, f"entry {entry.index} was overwritten by term {entry.term}"
                )
            elif result is None:
                self.sim.attempt_refused(op, attempt, f"entry {entry.index} is a no-op")
            else:
                self.acknowledge(op, attempt, entry, result.ok, result.value, result.version,
                                 result.error, mismatch=result.cas_mismatch)

    def acknowledge(
        self, op: ClientOp, attempt: Attempt, entry: Entry, ok: bool, value: str | None,
        version: int, error: str, mismatch: bool = False,
    ) -> None:
        """Tell the client its write's outcome; only ever after the entry was applied."""
        if ok and not op.done:
            self.sim.monitor.acknowledged_write(entry.index, entry.term, op.request_id)
        self.sim.attempt_answered(op, attempt, self.node_id, ok, value, version, error,
                                  mismatch=mismatch)

    def serve_reads(self) -> None:
        if not self.reads_to_serve:
            return
        ready = [r for r in self.reads_to_serve if r[0] <= self.applied_index]
        self.reads_to_serve = [r for r in self.reads_to_serve if r[0] > self.applied_index]
        for _, op, attempt in ready:
            read = self.register.read(op.key)
            self.sim.attempt_answered(op, attempt, self.node_id, True, read.value, read.version)

    def maybe_compact(self) -> None:
        threshold = self.sim.compact_every_entries
        core = self.core
        assert core is not None
        if threshold <= 0 or self.applied_index - self.snapshot_index < threshold:
            return
        if core.applied_index < self.applied_index:
            return  # the core has not been told yet (advance comes first)
        membership = core.membership_at(self.applied_index)
        meta = SnapshotMeta(
            self.applied_index, self.applied_term, membership.voters, membership.learners,
            membership.member_info,
        )
        data = self.register.snapshot()
        self.disk.save_snapshot(meta, data)
        core.compact(self.applied_index, data)
        self.snapshot_index = self.applied_index
        self.sim.record(f"{self.node_id} compacts to ({meta.index},{meta.term})")
        self.sim.monitor.compacted(self.node_id, meta.index, self.register.digest())

    # -- client requests ---------------------------------------------------------------------

    def submit_write(self, op: ClientOp, attempt: Attempt) -> None:
        core = self.core
        assert core is not None
        operation = Operation.PUT if op.f is Function.PUT else Operation.CAS
        assert op.value is not None
        command = Command(op.request_id, operation, op.key, op.value, op.expected_version)
        try:
            index, term = core.propose(encode_command(command))
        except NotLeader as error:
            attempt.leader_hint = error.leader_id
            self.sim.attempt_refused(op, attempt, f"not leader (leader: {error.leader_id})")
            return
        except ProposalDropped as error:
            self.sim.attempt_refused(op, attempt, f"dropped: {error}")
            return
        attempt.index, attempt.term = index, term
        self.write_waiters.setdefault(index, []).append((term, op, attempt))
        self.after_input()

    def submit_read(self, op: ClientOp, attempt: Attempt) -> None:
        core = self.core
        assert core is not None
        if op.stale:
            read = self.register.read(op.key)
            self.sim.attempt_answered(op, attempt, self.node_id, True, read.value, read.version)
            return
        attempt.context = f"read:{op.id}:{len(op.attempts)}".encode()
        try:
            core.read_index(attempt.context)
        except NotLeader as error:
            attempt.leader_hint = error.leader_id
            self.sim.attempt_refused(op, attempt, f"not leader (leader: {error.leader_id})")
            return
        self.read_waiters[attempt.context] = (op, attempt)
        self.after_input()


# ---------------------------------------------------------------------------------------
# The simulation
# ---------------------------------------------------------------------------------------


class SimulationStuck(AssertionError):
    """run_until ran out of steps before its condition held."""


# Per key. The sim's keys hold a few hundred operations and decide in milliseconds; the
# budget only bounds a pathological history, which then reads "unknown".
DEFAULT_CHECK_BUDGET_S = 60.0


@dataclass(frozen=True)
class Verdict:
    """The linearizability verdict of a run: `valid` is True, False or "unknown"."""

    valid: bool | str
    explanation: str  # the counterexample of each invalid key, or why unknown; "" if valid
    result: checker.Result  # the checker's whole answer (per-key table, JSON, timeline)


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
        **config: object,
    ) -> None:
        if node_count < 1:
            raise ValueError(f"node_count must be at least 1, got {node_count}")
        self.seed = seed
        self.variant = variant or SimVariant()
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
        self.history: list[HistoryEvent] = []
        self.ops: list[ClientOp] = []
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
        index, term = self.core(node).change_membership(kind, target)  # type: ignore[arg-type]
        self.nodes[node].after_input()
        if wait:
            self.run_until(
                lambda: node in self.alive() and self.nodes[node].applied_index >= index,
                max_steps, f"membership change at {index} applied on {node}",
            )
        return index, term

    def register(self, node: NodeId) -> Register:
        return self.nodes[node].register

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
        del self.network.in_flight[flight.id]
        self.network.held.discard(flight.id)
        message = flight.message
        shell = self.nodes.get(message.dst)
        if shell is None or shell.core is None:
            self.record(f"lost (destination down) #{flight.id} {describe(message)}")
            return
        self.record(f"deliver #{flight.id} {describe(message)}")
        self.monitor.delivered(message)
        shell.core.step(message)
        shell.after_input()

    def deliver_flight(self, flight: InFlight) -> None:
        """Deliver this in-flight message now (the randomized schedule's fast path)."""
        self._begin_step()
        self._deliver(flight)

    def drop_flight(self, flight: InFlight, reason: str = "drop") -> None:
        self._begin_step()
        del self.network.in_flight[flight.id]
        self.record(f"{reason} #{flight.id} {describe(flight.message)}")
        self.count_fault(reason)

    def duplicate_flight(self, flight: InFlight) -> None:
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
        self._begin_step()
        self.network.cut_links.clear()
        self.record("heal")

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
        self._begin_step()
        self.record(f"crash {node}{' losing unsynced writes' if lose_unsynced else ''}")
        self.count_fault("crash losing unsynced writes" if lose_unsynced else "crash")
        shell.crash(lose_unsynced)

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

    def restart(self, node: NodeId) -> None:
        """Boot a crashed node from its disk (snapshot + log + hard state)."""
        self._check_nodes([node])
        shell = self.nodes[node]
        if shell.alive:
            raise ValueError(f"{node} is running; crash it first")
        self._begin_step()
        self.record(f"restart {node}")
        self.count_fault("restart")
        shell.start()

    def tick(self, node: NodeId | None = None, times: int = 1) -> None:
        """Advance logical time by `times` ticks on `node`, or on every live node."""
        for _ in range(times):
            self.tick_nodes([node] if node is not None else self.alive())

    def tick_nodes(self, nodes: Iterable[NodeId]) -> None:
        """One step in which exactly `nodes` (live ones) advance their clocks by a tick."""
        targets = list(nodes)
        self._check_nodes(targets)
        self._begin_step()
        self.record(f"tick {','.join(targets)}")
        for target in targets:
            shell = self.nodes[target]
            if shell.core is None:
                raise ValueError(f"cannot tick {target}: it is crashed")
            shell.core.tick()
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
                return delivered
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
        for other in self.ops:
            if other.process == process and not other.done:
                raise ValueError(f"process {process} already has an open operation")
        op_id = len(self.ops) + 1
        op = ClientOp(
            id=op_id, process=process, f=f, key=key, value=value,
            expected_version=expected_version,
            request_id=request_id or (f"w{op_id}" if f is not Function.GET else ""),
            stale=stale, retry_on_refusal=retry_on_refusal, invoked_step=self.step_count,
        )
        self.ops.append(op)
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

    def submit(self, op: ClientOp, node: NodeId) -> Attempt:
        """Send (or resend, with the same request id) `op` to `node`."""
        if op.done:
            raise ValueError(f"operation {op.id} already completed ({op.status.value})")
        self._check_nodes([node])
        self._begin_step()
        attempt = Attempt(node=node, step=self.step_count)
        op.attempts.append(attempt)
        self.record(f"client p{op.process} op{op.id} -> {node} (attempt {len(op.attempts)})")
        shell = self.nodes[node]
        if not shell.alive:
            self.attempt_refused(op, attempt, f"{node} is down (connection refused)")
        elif op.f is Function.GET:
            shell.submit_read(op, attempt)
        else:
            shell.submit_write(op, attempt)
        return attempt

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
        for attempt in op.attempts:
            if attempt.state is AttemptState.WAITING:
                attempt.state, attempt.reason = AttemptState.UNKNOWN, reason
        op.error = reason
        self._complete(op, OpStatus.INFO if op.maybe_applied() else OpStatus.FAIL)

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
    ) -> None:
        """`node` answered: `ok`, or not applied. `mismatch`: a CAS whose expected version
        was not `version`, the key's version when it was applied (an answer that carries
        information, unlike other failures)."""
        attempt.state = AttemptState.ANSWERED
        if op.done:
            return
        op.result_value, op.result_version, op.answered_by, op.error = value, version, node, error
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

    def check_linearizable(self, budget_s: float = DEFAULT_CHECK_BUDGET_S) -> Verdict:
        """Is the clients' history linearizable for the register? The project's checker
        decides (`checker.check_linearizable`, model `versioned-kv`), every key checked.

        `budget_s` is CPU time per key, the only thing here that is not a function
        of the seed: when it runs out the verdict is "unknown" (reported as such, never as
        valid), so a slow machine can turn a verdict into "unknown" but never flip it."""
        result = checker.check_linearizable(
            forget_unread_values(to_records(self.history)), checker.models.versioned_kv(),
            budget_s=budget_s, all_keys=True,
        )
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
            for node in caught_up:
                if self.register(node).result_of(op.request_id) is None:
                    self.monitor.violate(
                        Rule.ACKNOWLEDGED_WRITE_LOST,
                        f"write {op.request_id!r} ({op.f.value} {op.key}={op.value!r}) was "
                        f"acknowledged by {op.answered_by} but {node} (applied {top}) has "
                        "no record of it",
                    )
        digests = {n: self.register(n).digest() for n in caught_up}
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


# ---------------------------------------------------------------------------------------
# Command line: python -m system.raft.sim --seeds 200
# ---------------------------------------------------------------------------------------


def load_variant(path: str) -> SimVariant:
    """Import a SimVariant named "package.module:attribute" (e.g. a broken variant from
    tests/raft/broken.py, so a failing seed of it can be replayed from the shell)."""
    import importlib

    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"--variant must look like package.module:name, got {path!r}")
    variant = getattr(importlib.import_module(module_name), attribute, None)
    if not isinstance(variant, SimVariant):
        raise ValueError(f"{path!r} is not a SimVariant (got {type(variant).__name__})")
    return variant


def write_history(history: list[HistoryEvent], path: str) -> None:
    """Write a run's history as `history.jsonl` (docs/histories.md) for
    `python -m checker check PATH --model versioned-kv --html out.html`. The `time` of a
    record is the simulator step it happened at (the sim has no clock), for display only."""
    from histories.write import HistoryWriter

    records = to_records(history)
    step = 0
    with HistoryWriter(path, clock_ns=lambda: step) as writer:
        invokes: dict[int, int] = {}  # process -> index of its invoke in the file
        for record in records:
            fields = {
                name: value
                for name, value in record.to_json().items()
                if name not in ("index", "time", "process", "type", "f", "key", "value")
            }
            step = dict(record.extra)["step"]
            if record.type.value == "invoke":
                invokes[record.process] = writer.invoke(  # type: ignore[index]
                    record.process, record.f, record.key, record.value, **fields,  # type: ignore[arg-type]
                )
            else:
                writer.complete(
                    invokes.pop(record.process), record.type, record.value, **fields,  # type: ignore[arg-type]
                )


def save_history(history: list[HistoryEvent], directory: str, seed: int):  # noqa: ANN201
    """DIR/seed-N/history.jsonl (replaced if it exists: the same seed gives the same file)."""
    from pathlib import Path

    path = Path(directory) / f"seed-{seed}" / "history.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    write_history(history, str(path))
    return path


def main(argv: list[str] | None = None) -> int:
    """Run the randomized simulation over many seeds; exit 0 if every seed passed."""
    import argparse
    import sys

    from tabulate import tabulate

    from system.raft import swarm

    parser = argparse.ArgumentParser(
        prog="python -m system.raft.sim",
        description="Randomized, deterministic simulation of a Raft cluster under faults. "
        "Each seed draws its own fault rates (swarm testing), injects faults, heals, and "
        "checks Raft's safety properties after every step and linearizability at the end.",
    )
    parser.add_argument("--seeds", type=int, default=200, help="how many seeds to run")
    parser.add_argument("--start-seed", type=int, default=0, help="first seed of the range")
    parser.add_argument("--seed", type=int, help="replay exactly this one seed (verbose)")
    parser.add_argument("--variant", help="package.module:name of a SimVariant to run instead "
                        "of the real core (e.g. tests.raft.broken:VOTES_TWICE)")
    parser.add_argument("--safety-steps", type=int, default=swarm.SAFETY_STEPS)
    parser.add_argument("--liveness-steps", type=int, default=swarm.LIVENESS_STEPS)
    parser.add_argument("--trace", action="store_true", help="with --seed: print the trace")
    parser.add_argument("--history-out", metavar="DIR",
                        help="write the client history of each failing seed (and of --seed "
                        "always) to DIR/seed-N/history.jsonl, for `python -m checker check`")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    try:
        variant = load_variant(args.variant) if args.variant else None
    except (ImportError, ValueError) as error:
        parser.error(str(error))

    seeds = [args.seed] if args.seed is not None else list(
        range(args.start_seed, args.start_seed + args.seeds)
    )
    every = max(1, len(seeds) // 20)
    totals_faults: dict[str, int] = {}
    totals_ops = {"ok": 0, "fail": 0, "info": 0}
    committed = steps = 0
    failed: list[swarm.SeedResult] = []
    verdicts: dict[str, int] = {}
    for position, seed in enumerate(seeds, 1):
        run = swarm.SwarmRun(seed, variant, args.safety_steps, args.liveness_steps)
        result = run.run()
        if args.history_out and (not result.ok or args.seed is not None):
            saved = save_history(run.sim.history, args.history_out, seed)
            print(f"seed {seed}: history written to {saved}; check it with\n"
                  f"  python -m checker check {saved} --model versioned-kv "
                  f"--html {saved.parent / 'timeline.html'}")
        for kind, count in result.faults.items():
            totals_faults[kind] = totals_faults.get(kind, 0) + count
        for kind, count in result.ops.items():
            totals_ops[kind] += count
        committed += result.committed
        steps += result.steps
        verdicts[result.linearizability] = verdicts.get(result.linearizability, 0) + 1
        if args.seed is not None:
            print(f"seed {seed}: {result.swarm.line()}")
            print(f"trace hash {result.trace_hash}")
            if args.trace:
                run = swarm.SwarmRun(seed, variant, args.safety_steps, args.liveness_steps)
                run.run()
                print("\n".join(run.sim.trace))
        if result.linearizability == "unknown":
            print(f"seed {seed}: linearizability unknown ({result.linearizability_note})")
        if not result.ok:
            failed.append(result)
            print(f"seed {seed} FAILED ({len(result.violations)} violations):")
            for violation in result.violations[:5]:
                print("  " + violation.line().replace("\n", "\n    "))
            print("  replay: " + swarm.replay_command(seed, args.variant))
        if position % every == 0 or position == len(seeds):
            print(f"[{position}/{len(seeds)}] seeds run, {len(failed)} failed", flush=True)

    rows = [
        ["seeds run", len(seeds)],
        ["seeds failed", len(failed)],
        ["simulation steps", steps],
        ["entries committed (sum of final commit indexes)", committed],
        ["client ops ok", totals_ops["ok"]],
        ["client ops fail", totals_ops["fail"]],
        ["client ops info", totals_ops["info"]],
    ]
    rows += [[f"linearizability {k}", v] for k, v in sorted(verdicts.items())]
    rows += [[f"faults: {kind}", count] for kind, count in sorted(totals_faults.items())]
    rows.append(["violations", sum(len(r.violations) for r in failed)])
    print(tabulate(rows, headers=["summary", "count"], tablefmt="github"))
    if failed:
        print("failing seeds (each line replays one):")
        for result in failed:
            print("  " + swarm.replay_command(result.seed, args.variant))
        sys.stdout.flush()
        return 1
    return 0


if __name__ == "__main__":
    # Run the copy of this module that everything else imports (not __main__), so the
    # classes a --variant refers to are the ones main() checks against.
    from system.raft.sim import main as _main

    raise SystemExit(_main())
