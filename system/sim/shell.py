"""The simulator's node shell: what the real node process does around a core, minus the I/O.

What it is for: it carries out each Ready in order (persist to its `FakeDisk`, send into
the network, restore snapshots, apply committed entries to the replicated state machine),
serves ReadIndex reads once applied, answers waiting clients, compacts, then calls
`advance`, and reports everything to the simulation's `SafetyMonitor`.

Two orderings, as the real node (system/kv/node.py `_drive_forever`) has them:
- persist, then send (always for followers and candidates, and for every Ready when the
  simulation's `pipeline` is off): the Ready is written and fsynced before anything leaves;
- pipelined (`pipeline` on, a leader's Ready with `messages_before_persist` that must be
  fsynced): the leader's APPENDs leave at once, the Ready is written to the disk's page
  cache, and its fsync completes later, when the schedule says so (`finish_persist`,
  `Simulation.finish_persist`). Meanwhile the core takes messages, ticks and proposals,
  but no further Ready is taken, exactly as the node awaits its storage thread; a crash
  in between loses the pending Ready (a power loss also loses what it wrote). Committed
  entries already durable here may be applied while the fsync runs, as the node does.

What it must never do: acknowledge a write before its entry is committed and applied, or
send a vote or an answer before what it promises is fsynced.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from system.raft.core import NotLeader, ProposalDropped, RaftConfig, RaftCore, Ready
from system.raft.types import Entry, NodeId, SnapshotMeta
from system.raft.watch import RuleWatch
from system.sim.clients import Attempt, ClientOp
from system.sim.disk import FakeDisk
from system.sim.history import Function
from system.sim.invariants import Rule
from system.sim.state_machine import CorruptSnapshot, Replica, encode_write

if TYPE_CHECKING:
    from system.sim.simulation import Simulation


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
        self.replica = Replica(sim.variant.state_machine_class())
        self.applied_index = 0  # highest index applied to `replica`
        self.applied_term = 0  # term of the entry at applied_index
        self.snapshot_index = 0  # highest index our own or an installed snapshot covers
        # Writes waiting for their entry to come out committed: index -> [(term, op, attempt)].
        self.write_waiters: dict[int, list[tuple[int, ClientOp, Attempt]]] = {}
        self.read_waiters: dict[bytes, tuple[ClientOp, Attempt]] = {}  # ReadIndex pending
        self.reads_to_serve: list[tuple[int, ClientOp, Attempt]] = []  # confirmed, by index
        # A leader's Ready whose APPENDs left before its fsync, which has not completed yet
        # (pipelined ordering), and whether its committed entries were applied already.
        self.persisting: tuple[Ready, bool] | None = None
        # Why the node stopped itself, as the real node exits 70 when its state machine
        # refuses an entry (node.py `_drive_failed`); it is crashed once the input that
        # found it is carried out (`after_input`), and cleared by the next start.
        self.fatal: str | None = None

    @property
    def alive(self) -> bool:
        return self.core is not None

    # -- life cycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Boot (or reboot) from whatever the disk holds."""
        restored = self.disk.load()
        self.fatal = None
        self.replica = Replica(self.sim.variant.state_machine_class())
        self.applied_index = self.applied_term = self.snapshot_index = 0
        if restored.snapshot is not None:
            self.replica = self.restored_replica(restored.snapshot.index,
                                                 restored.snapshot_data, "restart")
            self.applied_index = self.snapshot_index = restored.snapshot.index
            self.applied_term = restored.snapshot.term
            self.sim.monitor.restored_state(
                self.node_id, self.applied_index, self.replica.digest()
            )
        self.sim.monitor.node_started(self.node_id, restored.snapshot, restored.entries)
        self.incarnation += 1
        rng = random.Random(f"raft-sim:{self.sim.seed}:{self.node_id}:{self.incarnation}")
        self.core = self.sim.variant.core_class(self.config, rng, restored)
        self.watch = RuleWatch()
        self.after_input()

    def crash(self, lose_unsynced: bool) -> None:
        self.core = None
        self.persisting = None  # its fsync never completes; the write stays in the page cache
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
        """Called after every input to the core: drain its Readies (none while a pipelined
        Ready's fsync is pending: the node takes Readies one at a time), then report to
        the monitor."""
        core = self.core
        assert core is not None
        while self.persisting is None and self.fatal is None and core.has_ready():
            ready = core.ready()
            if self.sim.pipeline and ready.messages_before_persist and ready.must_sync:
                self.start_pipelined(ready)
                break
            self.handle_ready(ready)
            self.finish_ready(ready)
        for rule, text in self.watch.take():
            self.sim.record(f"error {self.node_id}: {rule}: {text}")
            self.sim.safety_reports.append((self.node_id, rule, text))
        self.sim.monitor.observe(
            self.node_id, core.role.value, core.term, core.commit_index, core.status().last_index,
            core.log.term,
        )
        if self.fatal is not None:
            self.sim.stop_fatally(self.node_id, self.fatal)

    def finish_ready(self, ready: Ready) -> None:
        core = self.core
        assert core is not None
        self.watch.advance(core, ready)
        self.serve_reads()
        self.maybe_compact()

    def handle_ready(self, ready: Ready) -> None:
        """Persist, then send: the whole Ready, in the contract's order."""
        self.persist(ready)
        self.after_persist(ready)
        self.report(ready)
        for message in ready.messages:
            self.sim.send(message)
        self.apply_ready(ready)

    def start_pipelined(self, ready: Ready) -> None:
        """The node's order for a leader's Ready: apply what is already durable and
        committed, send the APPENDs, write the Ready; its fsync completes later."""
        applied_early = self.may_apply_before_persist(ready)
        if applied_early:
            self.apply_ready(ready)
            self.serve_reads()
        for message in ready.messages_before_persist:
            self.sim.send(message)
        self.write(ready)
        self.persisting = (ready, applied_early)
        self.sim.record(f"{self.node_id} fsync of {len(ready.entries)} entries pending")

    def finish_persist(self) -> None:
        """The pending fsync returned: the rest of the Ready, `advance`, then the next."""
        assert self.persisting is not None
        ready, applied_early = self.persisting
        self.persisting = None
        self.sync(ready)
        self.after_persist(ready)
        self.report(ready)
        for message in ready.messages_after_persist:
            self.sim.send(message)
        if not applied_early:
            self.apply_ready(ready)
        self.finish_ready(ready)
        self.after_input()

    def may_apply_before_persist(self, ready: Ready) -> bool:
        """The node's `_may_apply_before_persist`: no snapshot, and every committed entry
        at or below the core's durable index (committed on a majority and durable here)."""
        core = self.core
        assert core is not None
        committed = ready.committed_entries
        return ready.snapshot is None and (
            not committed or committed[-1].index <= core.durable_index)

    def report(self, ready: Ready) -> None:
        for warning in ready.warnings:
            self.sim.record(f"warning {self.node_id}: {warning}")
        for error in ready.errors:
            self.sim.record(f"error {self.node_id}: {error}")
            self.sim.safety_reports.append((self.node_id, "committed-log-diverged", error))

    def apply_ready(self, ready: Ready) -> None:
        """Steps 3-4 of a Ready: restore a received snapshot, apply, hand out reads."""
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
        self.write(ready)
        self.sync(ready)

    def after_persist(self, ready: Ready) -> None:
        """Once the Ready is persisted, before anything else of it (a canary's seam, where
        the node calls its unsafe `after_persist` hook)."""

    def write(self, ready: Ready) -> None:
        """Step 1 without its fsync: what the OS's page cache holds once written."""
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

    def sync(self, ready: Ready) -> None:
        if ready.must_sync and not self.skips_fsync():
            self.disk.sync()

    def skips_fsync(self) -> bool:
        """Whether this node's persist leaves the Ready unsynced (the skips-fsync canary)."""
        return False

    def restore_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        self.sim.record(f"{self.node_id} restores snapshot ({meta.index},{meta.term})")
        self.replica = self.restored_replica(meta.index, data, "install")
        self.applied_index = self.snapshot_index = meta.index
        self.applied_term = meta.term
        self.sim.monitor.restored_state(self.node_id, meta.index, self.replica.digest())
        # Writes waiting at covered indexes: the request-id table says whether they happened.
        for index in sorted(i for i in self.write_waiters if i <= meta.index):
            for _, op, attempt in self.write_waiters.pop(index):
                first = self.replica.result_of(op.request_id)
                if first is None:
                    self.sim.attempt_refused(op, attempt, "not in the installed snapshot")
                else:
                    self.sim.attempt_answered(
                        op, attempt, self.node_id, first.ok, op.value, first.version,
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
            # The store's state machine refuses to apply out of order, and the node stops.
            self.fatal = (f"fatal error in the Raft drive loop: asked to apply index "
                          f"{entry.index} after {self.applied_index}")
            return
        result = self.replica.apply(entry)
        self.applied_index, self.applied_term = entry.index, entry.term
        self.sim.entries_applied += 1
        monitor = self.sim.monitor
        digest = self.replica.digest() if monitor.needs_state_digest(entry.index) else None
        monitor.applied_entry(self.node_id, entry, digest)
        for term, op, attempt in self.write_waiters.pop(entry.index, ()):
            if term != entry.term:
                self.sim.attempt_refused(
                    op, attempt, f"entry {entry.index} was overwritten by term {entry.term}"
                )
            elif result is None:
                self.sim.attempt_refused(op, attempt, f"entry {entry.index} is a no-op")
            else:
                self.acknowledge(op, attempt, entry, result.ok, op.value, result.version,
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
            read = self.replica.read(op.key)
            self.sim.attempt_answered(op, attempt, self.node_id, True, read.value, read.version,
                                     applied_index=self.applied_index)

    def maybe_compact(self, now: bool = False) -> None:
        """Snapshot and compact once `compact_every_entries` were applied since the last
        snapshot, or (`now`) at once, at whatever index is applied — as the store's byte
        threshold can (the harness aims a snapshot at a follower's stale tail with it)."""
        threshold = self.sim.compact_every_entries
        core = self.core
        assert core is not None
        due = threshold > 0 and self.applied_index - self.snapshot_index >= threshold
        due = due or (now and self.applied_index > self.snapshot_index)
        # A leader repairing a follower whose committed log diverged needs a snapshot
        # beyond that follower's commit index (RaftCore.repair_snapshot_wanted).
        wanted = core.repair_snapshot_wanted()
        if not due and not (wanted and self.applied_index > wanted >= self.snapshot_index):
            return
        if core.applied_index < self.applied_index:
            return  # the core has not been told yet (advance comes first)
        membership = core.membership_at(self.applied_index)
        meta = SnapshotMeta(
            self.applied_index, self.applied_term, membership.voters, membership.learners,
            membership.member_info,
        )
        data = self.replica.snapshot()
        self.disk.save_snapshot(meta, data)
        core.compact(self.applied_index, data)
        self.snapshot_index = self.applied_index
        self.sim.record(f"{self.node_id} compacts to ({meta.index},{meta.term})")
        self.sim.monitor.compacted(self.node_id, meta.index, self.replica.digest())

    def restored_replica(self, index: int, data: bytes, what: str) -> Replica:
        """The state machine rebuilt from snapshot bytes; a snapshot that does not verify is
        a violation, and the node goes on from an empty machine at that index."""
        machine_class = self.sim.variant.state_machine_class
        try:
            return Replica.restore(machine_class, data)
        except CorruptSnapshot as error:
            self.sim.monitor.violate(Rule.SNAPSHOT, f"{self.node_id} {what}: {error}")
            return Replica(machine_class(applied_index=index))

    # -- client requests ---------------------------------------------------------------------

    # Two seams the store's canaries override (system/sim/unsafe.py), as the real node
    # calls system/kv/unsafe.py's hooks: the request id a write is proposed with, and
    # whether a linearizable read may skip the ReadIndex barrier.

    def proposal_request_id(self, op: ClientOp) -> str:
        return op.request_id

    def serves_reads_locally(self) -> bool:
        return False

    def submit_write(self, op: ClientOp, attempt: Attempt) -> None:
        core = self.core
        assert core is not None
        deleting = op.f is Function.DELETE
        assert deleting or op.value is not None, "a put carries a value"
        command = encode_write(self.proposal_request_id(op), op.key,
                               None if deleting else op.value, op.expected_version)
        try:
            index, term = core.propose(command)
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
        if op.stale or self.serves_reads_locally():
            read = self.replica.read(op.key)
            self.sim.attempt_answered(op, attempt, self.node_id, True, read.value, read.version,
                                     applied_index=self.applied_index)
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


