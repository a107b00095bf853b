"""The shell around one Raft core: the only code that gives the pure core time, disk and network.

One asyncio event loop owns the RaftCore, the KVStateMachine and the DurableStorage; nothing
else touches them, so there are no locks. Inputs reach the core from that loop only: ticks
from a real timer, messages from peers, proposals and reads from the client service. After
any input the loop drains `core.ready()` and carries out each Ready in the order the
contract fixes (docs/raft.md):

1. send the leader's replication messages (`messages_before_persist`: APPEND, HEARTBEAT,
   SNAPSHOT), then persist entries, hard state and received snapshots, and fsync BEFORE
   anything else is sent (a vote or an append response promises what is on disk; Raft
   §5.2, Figure 2). The leader writes its log in parallel with its followers (thesis
   §10.2.1); the core counts its own copy towards a commit only once durable;
2. send the other messages (`messages_after_persist`);
3. restore the state machine from a received snapshot, then apply committed entries;
4. serve read barriers once applied >= their index; refuse dropped reads.

A client write is answered only when an entry with exactly the (index, term) that
`propose` returned comes out committed and has been applied: "acknowledged" means
committed and applied, never just appended. Another term at that index means the entry
was overwritten, so the write certainly did not apply.

Storage calls block the loop on purpose: while the loop waits for fsync, requests pile up
in gRPC and are proposed together in the next round, which is how proposals are batched.

What it must never do: acknowledge anything before it is committed and applied, send a
message before what it depends on is durable, or keep running after a storage failure
(it stops the process: continuing after a failed fsync could lose acknowledged data).
Test-only unsafe behaviour lives in `system/kv/unsafe.py`; this module only calls its
hooks when an unsafe mode was explicitly enabled.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import itertools
import logging
import os
import random
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from system.kv.forward import Forwarder
from system.kv.identity import STATE_MEMBER, Identity, KnownMembers, save_identity
from system.kv.peer_tcp import PeerListener, serve_peers
from system.kv.stage_trace import StageTrace, now_ns
from system.kv.state_machine import (
    CommandRejected,
    DeleteResult,
    FrozenState,
    KVStateMachine,
    PutResult,
    encode_delete,
    encode_put,
)
from system.kv.storage import DurableStorage
from system.kv.tls import NodeTls, TlsFiles, open_channel
from system.kv.transfers import SnapshotSends
from system.kv.transport import Transport
from system.raft.core import (
    MembershipChangeKind,
    NotLeader,
    ProposalDropped,
    RaftConfig,
    RaftCore,
    Ready,
)
from system.raft.messages import Message
from system.raft.types import EntryKind, HardState, Membership, NodeId, SnapshotMeta
from system.raft.watch import RuleWatch

if TYPE_CHECKING:
    from system.kv.unsafe import UnsafeMode

log = logging.getLogger("kv.node")

# When a Ready is persisted on the loop instead of the storage thread (`_persist_on_loop`).
INLINE_PERSIST_MAX_ENTRIES = 1
INLINE_PERSIST_MAX_BYTES = 64 * 1024
INLINE_PERSIST_MAX_FSYNC_MS = 1.0
# A follower's limit: its next APPEND waits for this Ready to be durable whichever thread
# fsyncs it, so at low load the loop has nothing to overlap with the fsync, and the two
# thread wake-ups of a hand-off lie on the write's path (under load, each waits for a core:
# the leader's limit sent every follower Ready to the thread once fsyncs passed 1 ms).
# Bounded, so that a sick disk still leaves the loop free for heartbeats and clients.
INLINE_PERSIST_FOLLOWER_MAX_FSYNC_MS = 10.0


@dataclass(frozen=True)
class NodeConfig:
    """Everything a node needs to start. Units are in the names."""

    node_id: NodeId
    listen_address: str  # host:port this node serves clients and peers on
    peers: Mapping[NodeId, str]  # the OTHER members: id -> host:port
    data_dir: Path
    tick_ms: int = 20  # real time per core tick
    election_timeout_ticks: int = 25  # randomized by the core in [T, 2T): 0.5-1 s at 20 ms
    heartbeat_interval_ticks: int = 1
    snapshot_entries: int = 10_000  # take a snapshot once this many entries follow the last one
    snapshot_bytes: int = 64 * 1024 * 1024  # ... or once the log after it holds this many bytes
    snapshot_chunk_bytes: int = 1024 * 1024  # InstallSnapshot chunk size
    max_append_entries: int = 512
    max_append_bytes: int = 4 * 1024 * 1024
    max_inflight_appends: int = 64
    max_key_bytes: int = 1024
    # 16 MiB: ten puts of it cause no election with the default timing on a loaded 2-core
    # machine; ten 64 MiB puts caused 22 and 55 (docs/kv-node.md, "Large values").
    max_value_bytes: int = 16 * 1024 * 1024
    max_requests_per_s: float = 0.0  # client requests per second; 0 = unlimited
    unsafe_mode: str | None = None  # test-only canary name, see system/kv/unsafe.py
    # This node joins an existing cluster as a learner (`serve --join`): `peers` are
    # members to reach, not a bootstrap membership that includes this node.
    join: bool = False
    # A follower sends writes and linearizable reads on to the leader (one hop, the
    # client's deadline) instead of answering "not the leader" (`serve --no-forward`).
    forward_to_leader: bool = True
    # The leader sends a new commit index at once in an empty APPEND (etcd) instead of
    # with the next APPEND or heartbeat, one tick later at most (`serve --eager-commit`;
    # RaftConfig.eager_commit). Off by default: at one client that second round of
    # messages cost 10-25% of the throughput (344 and 409 puts/s eager, 454 and 428 lazy,
    # alternating runs; docs/benchmarks.md).
    eager_commit: bool = False
    # Raft traffic over plain TCP (system/kv/peer_tcp.py): where this node listens for it
    # ("" = only gRPC on listen_address), and the peers reached that way, at their
    # peer_listen_address or a proxy in front of it; the others are reached over gRPC.
    peer_listen_address: str = ""
    peer_links: Mapping[NodeId, str] = field(default_factory=dict)
    # Mutual TLS (`serve --cert-file ... --peer-cert-file ...`; system/kv/tls.py): None =
    # plaintext everywhere. `tls.client` secures the client port and this node's calls to
    # other nodes' client ports (forwarding, Introduce); `tls.peer` the Raft traffic.
    tls: NodeTls | None = None

    @property
    def voters(self) -> tuple[NodeId, ...]:
        return tuple(sorted([self.node_id, *self.peers]))

    def address_of(self, node_id: NodeId | None) -> str:
        if node_id is None:
            return ""
        if node_id == self.node_id:
            return self.listen_address
        return self.peers.get(node_id, "")


class NodeError(Exception):
    """A request the node could not carry out; `outcome_known` says whether it certainly
    did not apply (True) or might still apply (False)."""

    outcome_known = True


class NotLeaderError(NodeError):
    def __init__(self, leader_id: NodeId | None, leader_address: str) -> None:
        hint = f"leader is {leader_id} at {leader_address}" if leader_id else "no leader known yet"
        super().__init__(f"this node is not the leader; {hint}; retry there")
        self.leader_id = leader_id
        self.leader_address = leader_address


class WriteLost(NodeError):
    """The entry proposed for this write was overwritten by another leader's entry:
    it certainly never applied (Log Matching, Raft §5.3)."""


class OutcomeUnknown(NodeError):
    """The write may or may not have applied (leadership changed hands, a snapshot
    replaced the log, or the node is shutting down); retry with the same request id."""

    outcome_known = False


@dataclass
class _WriteWaiter:
    term: int
    future: asyncio.Future[PutResult | DeleteResult | CommandRejected]


@dataclass(order=True)
class _ReadWaiter:
    index: int
    seq: int
    future: asyncio.Future[None] = field(compare=False)


class Node:
    """One KV node: the Raft core, the state machine, storage and peer links, driven by one loop."""

    def __init__(self, config: NodeConfig, storage: DurableStorage,
                 unsafe: UnsafeMode | None = None, identity: Identity | None = None) -> None:
        self.config = config
        self.storage = storage
        self.unsafe = unsafe
        # Who this data directory is (docs/kv.md, "Identity and rejoining"); None: a test
        # that does not care, treated as a verified member.
        self.identity = identity
        self.known_members = KnownMembers(config.data_dir)
        self.identity_problem = ""  # why the vote is withheld, for the operator
        # A canary that breaks a rule of the state machine runs a subclass of it (the
        # store's own class otherwise; system/kv/unsafe.py).
        self._machine_class: type[KVStateMachine] = (
            KVStateMachine if unsafe is None else unsafe.state_machine_class)
        restored = storage.load()
        if restored.snapshot is not None:
            self.state_machine = self._machine_class.restore(restored.snapshot_data)
            self._last_snapshot_index = restored.snapshot.index
            self._applied_term = restored.snapshot.term
        else:
            self.state_machine = self._machine_class()
            self._last_snapshot_index = 0
            self._applied_term = 0
        self._hard_state = restored.hard_state
        self._applied_bytes_since_snapshot = 0  # entry bytes applied after the last snapshot
        raft_config = RaftConfig(
            node_id=config.node_id,
            voters=tuple(sorted(config.peers)) if config.join else config.voters,
            learners=(config.node_id,) if config.join else (),
            election_timeout_ticks=config.election_timeout_ticks,
            heartbeat_interval_ticks=config.heartbeat_interval_ticks,
            max_append_entries=config.max_append_entries,
            max_append_bytes=config.max_append_bytes,
            max_inflight_appends=config.max_inflight_appends,
            snapshot_chunk_bytes=config.snapshot_chunk_bytes,
            eager_commit=config.eager_commit,
        )
        # The core's only randomness (election timeouts) comes from this seeded instance.
        seed = int.from_bytes(os.urandom(8), "big")
        # A canary may name a broken core (system/raft/unsafe.py); else the real one.
        core_class = unsafe.core_class if unsafe is not None else RaftCore
        self.core = core_class(raft_config, random.Random(seed), restored)
        # Every input reaches the core through the watch, which logs any transition Raft's
        # Figure 2 forbids (system/raft/watch.py) for the harness to find.
        self.watch = RuleWatch()
        if identity is not None and identity.state != STATE_MEMBER:
            # A new data directory: until the peers confirm that this node id is not a
            # voter they know under another incarnation, it must not vote (it may have
            # lost what it acknowledged).
            self.core.withhold_vote("new data directory: introducing itself to its peers")
        self._identity_task: asyncio.Task[None] | None = None
        self._snapshot_task: asyncio.Task[None] | None = None
        self.trace = StageTrace.from_environment(config.node_id)  # None unless KV_STAGE_TRACE
        self.transport = Transport(config.node_id, config.peers, trace=self.trace,
                                   tcp_links=config.peer_links,
                                   tls=config.tls.peer if config.tls else None)
        self._peer_server: PeerListener | None = None  # the TCP peer listener
        self._synced_membership: Membership | None = None  # what _sync_peers last applied
        # requests sent on to the leader
        self.forwarder = Forwarder(config.node_id, config.tls.client if config.tls else None)
        self.snapshots_installed = 0
        self.last_installed_snapshot_index = 0
        self.snapshot_sends = SnapshotSends(config.node_id)  # as leader, for Status and logs
        self._write_waiters: dict[int, _WriteWaiter] = {}
        self._read_waiters: list[_ReadWaiter] = []  # heap by index
        # Linearizable reads that arrived since the drive task last ran: they share ONE
        # ReadIndex round (one heartbeat per follower), started after all of them arrived
        # (thesis §6.4 allows batching: each read's round begins after the read did).
        self._read_batch: list[asyncio.Future[int]] = []
        self._pending_reads: dict[bytes, list[asyncio.Future[int]]] = {}  # context -> batch
        # At most one ReadIndex round in flight (as etcd's read loop): reads arriving
        # meanwhile wait for it to end and then share the next one, so under load a round
        # carries many reads and the leader exchanges one heartbeat per follower per
        # round trip instead of one per drive round.
        self._read_round_in_flight: bytes | None = None
        self._read_ids = itertools.count(1)
        self._wake: asyncio.Event | None = None
        # True unless the drive task is parked waiting for `_wake` (`drive_now`).
        self._drive_busy = True
        # A Ready `drive_now` took but left to the task, and whether it applied early.
        self._handover: tuple[Ready, bool] | None = None
        self._drive_task: asyncio.Task[None] | None = None
        # Storage calls run on this one thread, one at a time, in Ready order.
        self._storage_thread = ThreadPoolExecutor(1, thread_name_prefix="storage")
        self._snapshot_thread = ThreadPoolExecutor(1, thread_name_prefix="snapshot")
        # Calls handed to the storage thread and not finished: while any is, the loop
        # must not touch the storage itself (DurableStorage has no lock).
        self._storage_jobs = 0
        # Recent fsync time (moving average): a small Ready is persisted on the loop
        # itself while fsyncs are this fast (see `_persist_on_loop`).
        self._fsync_ms = 1.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tick_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._last_role = None
        self._last_leader: NodeId | None = None
        self._last_term = -1
        log.info(
            "node restored from disk",
            extra={"node": config.node_id, "term": restored.hard_state.term,
                   "commit": restored.hard_state.commit,
                   "snapshot_index": self._last_snapshot_index,
                   "log_entries": len(restored.entries)},
        )

    # ----- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        if self.config.peer_listen_address:
            self._peer_server = await serve_peers(
                self.config.peer_listen_address, self.config.node_id, self.is_known_peer,
                self.deliver, tls=self.config.tls.peer if self.config.tls else None)
        self.transport.start()
        self._drive_task = self._loop.create_task(self._drive_forever(), name="raft-drive")
        self._tick_task = self._loop.create_task(self._tick_forever(), name="raft-tick")
        if self.core.vote_withheld:
            self._identity_task = self._loop.create_task(self._introduce_until_known(),
                                                         name="introduce")
        self._kick()

    async def stop(self) -> None:
        """Stop ticking and sending, answer waiters "outcome unknown", close storage.

        The Ready being carried out is finished first (persisted, sent, applied), so
        stopping never leaves a half-written Ready; no further Ready is taken.
        """
        self._stopping = True
        if self._identity_task is not None:
            self._identity_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._identity_task
        if self._tick_task is not None:
            self._tick_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._tick_task
        if self._drive_task is not None:
            self._kick()
            await self._drive_task
        for waiter in self._write_waiters.values():
            if not waiter.future.done():
                waiter.future.set_exception(OutcomeUnknown("node is shutting down"))
        self._write_waiters.clear()
        for fut in [f for batch in self._pending_reads.values() for f in batch] + self._read_batch:
            if not fut.done():
                fut.set_exception(NotLeaderError(None, ""))
        self._pending_reads.clear()
        self._read_batch = []
        if self._snapshot_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._snapshot_task
        await self.transport.close()
        if self._peer_server is not None:
            self._peer_server.close()
        await self.forwarder.close()
        self._snapshot_thread.shutdown(wait=True)
        self._storage_thread.shutdown(wait=True)
        self.storage.close()
        log.info("node stopped", extra={"node": self.config.node_id})

    async def _tick_forever(self) -> None:
        period_s = self.config.tick_ms / 1000
        while True:
            await asyncio.sleep(period_s)
            try:
                self.watch.tick(self.core)
            except Exception:
                # A task that raised would end silently: the node would go on serving
                # clients with no clock, never campaigning, never sending heartbeats.
                # Stop as a failed drive loop does.
                log.critical("fatal error in the Raft tick; stopping the process",
                             exc_info=True, extra={"node": self.config.node_id})
                logging.shutdown()
                os._exit(70)
            self._kick()

    # ----- inputs ----------------------------------------------------------------------

    def deliver(self, messages: list[Message]) -> None:
        """Messages from peers (called on the loop by the peer service)."""
        if self._stopping:
            return
        if self.trace is not None:
            self.trace.hops_received(messages)
        for message in messages:
            self.watch.step(self.core, message)
        self.drive_now()

    async def put(self, key: str, value: bytes, expected_version: int | None,
                  request_id: str) -> PutResult | CommandRejected:
        if self.unsafe is not None:
            request_id = self.unsafe.request_id_for_proposal(request_id)
        data = encode_put(key, value, expected_version=expected_version, request_id=request_id)
        return await self._propose(data)  # type: ignore[return-value]

    async def delete(self, key: str, expected_version: int | None,
                     request_id: str) -> DeleteResult | CommandRejected:
        if self.unsafe is not None:
            request_id = self.unsafe.request_id_for_proposal(request_id)
        data = encode_delete(key, expected_version=expected_version, request_id=request_id)
        return await self._propose(data)  # type: ignore[return-value]

    async def _propose(self, data: bytes) -> PutResult | DeleteResult | CommandRejected:
        if self._stopping:
            raise NotLeaderError(None, "")
        try:
            index, term = self.core.propose(data)
        except NotLeader as exc:
            raise NotLeaderError(exc.leader_id, self.address_of(exc.leader_id)) from None
        except ProposalDropped as exc:
            raise NotLeaderError(self.core.leader_id,
                                 self.address_of(self.core.leader_id)) from exc
        future: asyncio.Future[PutResult | DeleteResult | CommandRejected] = (
            asyncio.get_running_loop().create_future()
        )
        waiter = _WriteWaiter(term=term, future=future)
        self._write_waiters[index] = waiter
        if self.trace is not None:
            self.trace.proposed(index)
        self._kick()
        try:
            result = await future
            if self.trace is not None:
                self.trace.replied(index)
            return result
        finally:
            # The caller went away (deadline, cancellation): forget the waiter so an entry
            # that never commits here does not pin it in memory. The entry itself stays.
            if self._write_waiters.get(index) is waiter:
                del self._write_waiters[index]

    def start_put(self, key: str, value: bytes, expected_version: int | None,
                  request_id: str) -> asyncio.Future | None:
        """`put` for a caller that cannot await (the Session stream's writes); see
        `_start_write`."""
        if self.unsafe is not None or self._stopping or not self.is_leader:
            return None
        return self._start_write(encode_put(key, value, expected_version=expected_version,
                                            request_id=request_id))

    def start_delete(self, key: str, expected_version: int | None,
                     request_id: str) -> asyncio.Future | None:
        """`delete` for a caller that cannot await; see `_start_write`."""
        if self.unsafe is not None or self._stopping or not self.is_leader:
            return None
        return self._start_write(encode_delete(key, expected_version=expected_version,
                                               request_id=request_id))

    def _start_write(self, data: bytes) -> asyncio.Future | None:
        """Propose `data` and return the future of its result, set once the entry is
        committed and applied here, exactly as `_propose` awaits it; or None, having
        proposed nothing, whenever `_propose` would do anything but wait (not the leader,
        stopping, an unsafe mode): the caller then takes the general path."""
        try:
            index, term = self.core.propose(data)
        except (NotLeader, ProposalDropped):
            return None
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        waiter = _WriteWaiter(term=term, future=future)
        self._write_waiters[index] = waiter
        if self.trace is not None:
            self.trace.proposed(index)
        future.add_done_callback(functools.partial(self._write_done, index, waiter))
        self._kick()
        return future

    def _write_done(self, index: int, waiter: _WriteWaiter, future: asyncio.Future) -> None:
        if self.trace is not None and not future.cancelled() and future.exception() is None:
            self.trace.replied(index)
        # Cancelled (the stream ended): forget the waiter, as `_propose` does.
        if self._write_waiters.get(index) is waiter:
            del self._write_waiters[index]

    def start_read_barrier(self) -> asyncio.Future[int] | None:
        """For a caller that cannot await (the Session stream's reads): the future of the
        ReadIndex round this read joins, resolved with the index to serve it at; or None
        whenever `read_barrier` would do anything but wait for a round (not the leader,
        stopping, an unsafe mode). The caller reads the state machine in the future's
        callback, and only once `applied_index` has reached that index."""
        if self.unsafe is not None or self._stopping or not self.is_leader:
            return None
        return self._join_read_round()

    def _join_read_round(self) -> asyncio.Future[int]:
        confirmed: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._read_batch.append(confirmed)
        self._kick()
        return confirmed

    async def read_barrier(self) -> int:
        """Wait until a linearizable read may be served here (ReadIndex, Raft §6.4).

        Returns the index the read is served at; the caller reads the state machine
        right after, with no await in between. Raises NotLeaderError.
        """
        if self.unsafe is not None and self.unsafe.skips_read_barrier(self):
            return self.state_machine.applied_index
        if self._stopping:
            raise NotLeaderError(None, "")
        if not self.is_leader:
            leader = self.core.leader_id
            raise NotLeaderError(leader, self.address_of(leader))
        loop = asyncio.get_running_loop()
        index = await self._join_read_round()
        if self.state_machine.applied_index < index:
            ready: asyncio.Future[None] = loop.create_future()
            heapq.heappush(self._read_waiters, _ReadWaiter(index, next(self._read_ids), ready))
            await ready
        return index

    # ----- the drive loop --------------------------------------------------------------

    def _kick(self) -> None:
        """Wake the drive task; inputs arriving while it is busy share its next round."""
        if self._wake is not None:
            self._wake.set()

    async def _drive_forever(self) -> None:
        """The only place Readies are taken and carried out, one at a time, in order.

        Persisting runs on the storage thread so that the loop keeps accepting requests and
        peer messages during an fsync; the core takes those inputs meanwhile (as etcd's
        RawNode does) and they leave in the NEXT Ready, after this one is durable: this is
        what batches proposals (group commit). `drive_now` carries out Readies on its
        caller's stack instead while this task is parked, handing it the first Ready that
        needs the loop to wait (`_handover`).
        """
        assert self._wake is not None and self._loop is not None
        while True:
            self._drive_busy = False
            await self._wake.wait()
            self._drive_busy = True
            self._wake.clear()
            try:
                while True:
                    if self._handover is not None:
                        ready, applied_early = self._handover
                        self._handover = None
                    else:
                        self._start_read_batch()
                        if not self.core.has_ready():
                            break
                        ready = self.core.ready()
                        applied_early = self._send_and_apply_early(ready)
                    inline = self._persist_on_loop(ready)
                    if (inline and ready.messages_before_persist and ready.entries
                            and self.transport.has_queued()):
                        # Appends still queued for a writer task (a gRPC lane, or a TCP
                        # lane not connected): let it hand the bytes to the socket before
                        # the loop blocks on our fsync, or the follower's fsync would wait
                        # for ours instead of overlapping it. Then ask again: a snapshot's
                        # save may have reached the storage thread during the yield. (A
                        # connected TCP lane wrote them already, in transport.send.)
                        await asyncio.sleep(0)
                        inline = self._persist_on_loop(ready)
                    if inline:
                        self._persist(ready)
                    else:
                        await self._storage_call(self._persist, ready)
                    self._finish_ready(ready, applied_early)
            except Exception:
                self._drive_failed()
            self._log_role_change()
            if self._stopping:
                return

    def drive_now(self) -> None:
        """Carry out the Readies an input just made, here on the caller's stack, while the
        drive task is parked: each wake-up of that task is a turn of the event loop (about
        a tenth of a millisecond on a busy machine), and a write at one client waits for
        three of them, in series (the leader's proposal, the follower's APPEND, the answer
        that commits it); peer messages come here, proposals still wake the task (that
        turn lets the requests read in one turn share a Ready). The same steps in the same order as the task, which only runs
        when no `drive_now` is under way (one thread; nothing here awaits); the first Ready
        that needs the loop to wait (the storage thread, a yield to a writer task) is
        handed to the task with everything after it. Otherwise a kick."""
        if self._drive_busy or self._wake is None or self._stopping:
            self._kick()
            return
        self._drive_busy = True
        try:
            while True:
                self._start_read_batch()
                if not self.core.has_ready():
                    break
                ready = self.core.ready()
                applied_early = self._send_and_apply_early(ready)
                if not self._persist_on_loop(ready) or (
                        ready.messages_before_persist and ready.entries
                        and self.transport.has_queued()):
                    self._handover = (ready, applied_early)
                    self._wake.set()  # the task carries it out; it stays busy until then
                    return
                self._persist(ready)
                self._finish_ready(ready, applied_early)
        except Exception:
            self._drive_failed()
        self._log_role_change()
        self._drive_busy = False

    def _send_and_apply_early(self, ready: Ready) -> bool:
        """The steps of a Ready before its persist; whether it was applied already."""
        if self.trace is not None and ready.entries:
            self.trace.mark([e.index for e in ready.entries], "taken")
            self.trace.hop("taken", ready.entries[-1].index)
        applied_early = self._may_apply_before_persist(ready)
        if applied_early:
            # Entries committed AND already durable here: acknowledging them need not
            # wait for this Ready's fsync of newer entries, nor for its messages (the
            # answers then leave before the appends that announce the new commit index:
            # measured 0.2 ms sooner).
            self._apply_and_serve_reads(ready)
        if ready.messages_before_persist:
            # A leader's APPENDs leave while it fsyncs its own copy (thesis §10.2.1; the
            # core counts that copy only once `advance` says it is durable), so the two
            # fsyncs of a write overlap.
            self.transport.send(ready.messages_before_persist)
        return applied_early

    def _finish_ready(self, ready: Ready, applied_early: bool) -> None:
        """The steps of a Ready after its persist."""
        self._after_persist(ready, applied_early)
        self.watch.advance(self.core, ready)
        self.snapshot_sends.observe(self.core.snapshot_transfers())
        self._sync_peers()
        self._maybe_snapshot()

    def _drive_failed(self) -> None:
        # A storage failure (or a broken invariant) leaves us unable to promise
        # durability: stop at once rather than answer anything more.
        log.critical("fatal error in the Raft drive loop; stopping the process",
                     exc_info=True, extra={"node": self.config.node_id})
        logging.shutdown()
        os._exit(70)

    def _start_read_batch(self) -> None:
        """One ReadIndex round for every linearizable read that arrived since the last
        one: one heartbeat per follower instead of one per read."""
        if self._read_round_in_flight is not None and not self.is_leader:
            # Leadership ended: the core answers that round in dropped_reads; do not let
            # it hold back reads meanwhile (they will be refused as not-leader).
            self._read_round_in_flight = None
        if not self._read_batch or self._read_round_in_flight is not None:
            return
        batch, self._read_batch = self._read_batch, []
        context = f"{self.config.node_id}:{next(self._read_ids)}".encode()
        try:
            self.core.read_index(context)
        except NotLeader as exc:
            address = self.address_of(exc.leader_id)
            for fut in batch:
                if not fut.done():
                    fut.set_exception(NotLeaderError(exc.leader_id, address))
            return
        self._pending_reads[context] = batch
        self._read_round_in_flight = context

    def _read_round_done(self, context: bytes) -> None:
        if context == self._read_round_in_flight:
            self._read_round_in_flight = None
            if self._read_batch:
                self._kick()  # the drive loop starts the next round

    def _storage_call(self, function, *args) -> asyncio.Future:
        """Run `function` on the storage thread, counted in `_storage_jobs` until done."""
        assert self._loop is not None
        self._storage_jobs += 1
        future = self._loop.run_in_executor(self._storage_thread, function, *args)

        def finished(_: asyncio.Future) -> None:
            self._storage_jobs -= 1
        future.add_done_callback(finished)
        return future

    def _persist_on_loop(self, ready: Ready) -> bool:
        """Whether this Ready is persisted on the loop rather than the storage thread.

        Handing a write to the storage thread and its completion back costs two thread
        wake-ups and a tug of war over the GIL with the loop (0.3-0.5 ms in all, measured),
        on the path of every write at low load, on the leader and again on the follower
        whose answer commits it. A Ready of one small entry on a disk whose fsyncs take
        well under a millisecond costs less done here. Under load the Readies are larger
        and go to the thread, where the fsync overlaps the loop's work on the next
        requests (group commit). Never while the thread holds a call (a snapshot being
        saved): the storage has no lock."""
        if self._storage_jobs or ready.snapshot is not None:
            return False
        if not (ready.entries or ready.must_sync or (
                ready.hard_state is not None
                and _vote_or_term_changed(self._hard_state, ready.hard_state))):
            # Only the commit index moved, or nothing: a small write with no fsync (the
            # commit index is a hint, safe to lose), not worth a thread hop.
            return True
        fsync_limit_ms = (INLINE_PERSIST_MAX_FSYNC_MS if self.is_leader
                          else INLINE_PERSIST_FOLLOWER_MAX_FSYNC_MS)
        return (len(ready.entries) <= INLINE_PERSIST_MAX_ENTRIES
                and self._fsync_ms < fsync_limit_ms
                and sum(len(e.data) for e in ready.entries) <= INLINE_PERSIST_MAX_BYTES)

    def _persist(self, ready: Ready) -> None:
        """Step 1 of a Ready, on the storage thread or the loop (`_persist_on_loop`): write,
        then fsync, before anything that depends on it leaves this node (Raft Figure 2)."""
        need_sync = ready.must_sync
        if ready.snapshot is not None:
            self.storage.install_snapshot(ready.snapshot, ready.snapshot_data)
            need_sync = True
        if ready.entries:
            self.storage.append(ready.entries)
            need_sync = True
        if ready.hard_state is not None:
            self.storage.set_hard_state(ready.hard_state)
            if _vote_or_term_changed(self._hard_state, ready.hard_state):
                need_sync = True
            self._hard_state = ready.hard_state
        if need_sync and self.unsafe is not None and self.unsafe.skips_fsync():
            need_sync = False  # the skips-fsync canary (system/kv/unsafe.py)
        if need_sync:
            started = now_ns()
            self.storage.sync()
            took = now_ns() - started
            self._fsync_ms += (took / 1e6 - self._fsync_ms) / 8
            if self.trace is not None:
                self.trace.ready_persisted(len(ready.entries), took)
                self.trace.mark([e.index for e in ready.entries], "persisted")
                if ready.entries:
                    self.trace.hop("persisted", ready.entries[-1].index)

    def _may_apply_before_persist(self, ready: Ready) -> bool:
        """Whether steps 3-4 (apply, serve reads) may run while this Ready is persisted.

        Yes when no snapshot is being installed and every committed entry is at or below
        the core's durable index: each is then committed (stored durably on a majority)
        and durable on this node too, so nothing this Ready writes is needed to apply or
        acknowledge it (what is acknowledged is committed, and nothing acknowledged is
        lost). A read's ReadIndex round does not depend on this node's disk at all."""
        if ready.snapshot is not None or self.unsafe is not None:
            return False
        committed = ready.committed_entries
        return not committed or committed[-1].index <= self.core.durable_index

    def _after_persist(self, ready: Ready, applied_early: bool) -> None:
        for warning in ready.warnings:
            log.warning(warning, extra={"node": self.config.node_id})
        for error in ready.errors:
            # `safety` marks a line that reports a broken safety property (the Raft core's
            # errors are all committed logs that diverged): the harness collects such
            # lines into the history (nemesis/safety_reports.py).
            log.error(error, extra={"node": self.config.node_id,
                                    "safety": "committed-log-diverged"})
        if self.unsafe is not None and ready.entries:
            self.unsafe.after_persist(self, ready.entries)

        # 2. Send what promises durable state (votes, responses); the leader's own
        # replication traffic has already left (`messages_before_persist`).
        if ready.messages_after_persist:
            self.transport.send(ready.messages_after_persist)

        if not applied_early:
            self._apply_and_serve_reads(ready)

    def _apply_and_serve_reads(self, ready: Ready) -> None:
        # 3. Apply: a received snapshot replaces the state machine first.
        if ready.snapshot is not None:
            self._restore_snapshot(ready.snapshot, ready.snapshot_data)
        if self.trace is not None and ready.committed_entries:
            self.trace.mark([e.index for e in ready.committed_entries], "committed")
            self.trace.hop("committed", ready.committed_entries[-1].index)
        for entry in ready.committed_entries:
            self._apply(entry)
        if self.trace is not None and ready.committed_entries:
            self.trace.mark([e.index for e in ready.committed_entries], "applied")

        # 4. Reads.
        for read_state in ready.read_states:
            self._read_round_done(read_state.context)
            for fut in self._pending_reads.pop(read_state.context, ()):
                if not fut.done():  # (a caller that gave up has cancelled its future)
                    fut.set_result(read_state.index)
        if ready.dropped_reads:
            leader = self.core.leader_id
            address = self.address_of(leader)
            for context in ready.dropped_reads:
                self._read_round_done(context)
                for fut in self._pending_reads.pop(context, ()):
                    if not fut.done():
                        fut.set_exception(NotLeaderError(leader, address))
        self._release_reads()

    def _apply(self, entry) -> None:  # noqa: ANN001 - an Entry
        sm = self.state_machine
        if entry.index <= sm.applied_index:
            return  # re-emitted after a restart: already inside the restored snapshot
        if entry.kind == EntryKind.NOOP:
            sm.apply_noop(entry.index)
            result = None
        elif entry.kind == EntryKind.CONFIG:
            sm.apply_noop(entry.index)  # the membership itself lives in the Raft core
            result = _MEMBERSHIP_APPLIED
        else:
            result = sm.apply(entry.index, entry.data)
        self._applied_term = entry.term
        self._applied_bytes_since_snapshot += len(entry.data)
        waiter = self._write_waiters.pop(entry.index, None)
        if waiter is None or waiter.future.done():
            return
        if entry.term == waiter.term and result is not None:
            waiter.future.set_result(result)
        else:
            waiter.future.set_exception(WriteLost(
                f"the write proposed at index {entry.index} in term {waiter.term} was "
                f"replaced by a term-{entry.term} entry after a leader change; it did not "
                f"apply; retry"))

    def _restore_snapshot(self, meta: SnapshotMeta, data: bytes) -> None:
        self.state_machine = self._machine_class.restore(data)
        self._applied_term = meta.term
        self._last_snapshot_index = meta.index
        self._applied_bytes_since_snapshot = 0
        self.snapshots_installed += 1
        self.last_installed_snapshot_index = meta.index
        # Writes proposed here at indexes the snapshot covers: we cannot tell whether
        # our entry or another leader's is inside it.
        for index in [i for i in self._write_waiters if i <= meta.index]:
            waiter = self._write_waiters.pop(index)
            if not waiter.future.done():
                waiter.future.set_exception(OutcomeUnknown(
                    "the log was replaced by a snapshot from the leader before this write's "
                    "outcome was known; retry with the same request id"))
        log.info("installed snapshot from leader",
                 extra={"node": self.config.node_id, "snapshot_index": meta.index,
                        "snapshot_term": meta.term, "snapshot_bytes": len(data)})

    def _release_reads(self) -> None:
        applied = self.state_machine.applied_index
        while self._read_waiters and self._read_waiters[0].index <= applied:
            waiter = heapq.heappop(self._read_waiters)
            if not waiter.future.done():
                waiter.future.set_result(None)

    def _maybe_snapshot(self) -> None:
        """Snapshot by log size (entries or bytes), then let the core compact (Raft §7)."""
        applied = self.state_machine.applied_index
        if applied <= self._last_snapshot_index:
            return
        # A leader repairing a follower whose committed log diverged needs a snapshot
        # beyond that follower's commit index, now rather than at the usual threshold.
        wanted = self.core.repair_snapshot_wanted()
        repair = bool(wanted) and applied > wanted >= self._last_snapshot_index
        # Count only the APPLIED part of the log: a snapshot cannot cover the rest, so
        # counting a large uncommitted entry would take a useless snapshot per apply.
        if (not repair and applied - self._last_snapshot_index < self.config.snapshot_entries
                and self._applied_bytes_since_snapshot < self.config.snapshot_bytes):
            return
        if self._snapshot_task is not None and not self._snapshot_task.done():
            return  # one at a time
        assert self._loop is not None
        # Taken in the background from a frozen copy: serializing values and writing the
        # file must not hold up the drive loop, which carries the heartbeats (a snapshot
        # of large values took long enough to cost elections: 64 MiB puts).
        frozen = self.state_machine.frozen_copy()
        membership = self.core.membership_at(applied)
        meta = SnapshotMeta(index=applied, term=self._applied_term, voters=membership.voters,
                            learners=membership.learners, member_info=membership.member_info)
        self._last_snapshot_index = applied
        self._applied_bytes_since_snapshot = 0
        self._snapshot_task = self._loop.create_task(self._take_snapshot(frozen, meta),
                                                     name="snapshot")

    async def _take_snapshot(self, frozen: FrozenState, meta: SnapshotMeta) -> None:
        assert self._loop is not None
        try:
            # Serialised off the storage thread, so the Readies' fsyncs do not queue
            # behind it (the file write below must be on it, in order with them).
            data = await self._loop.run_in_executor(self._snapshot_thread, frozen.snapshot)
            try:
                # On the storage thread, in order with the Readies' writes: entries up to
                # meta.index are applied, hence committed, hence never truncated.
                await self._storage_call(self.storage.save_snapshot, meta, data)
            except ValueError as exc:
                # A leader's newer snapshot was installed meanwhile: ours is not needed.
                log.info("snapshot skipped", extra={"node": self.config.node_id,
                                                    "snapshot_index": meta.index,
                                                    "reason": str(exc)})
                return
            self.core.compact(meta.index, data)
            self._kick()
            log.info("took snapshot", extra={"node": self.config.node_id,
                                              "snapshot_index": meta.index,
                                              "snapshot_bytes": len(data)})
        except Exception:
            log.critical("fatal error while taking a snapshot; stopping the process",
                         exc_info=True, extra={"node": self.config.node_id})
            logging.shutdown()
            os._exit(70)

    def _log_role_change(self) -> None:
        for rule, text in self.watch.take():
            # `safety` makes the harness gather the line into the history, as for the
            # core's own errors (nemesis/safety_reports.py).
            log.error(text, extra={"node": self.config.node_id, "safety": rule})
        role, term, leader = self.core.role, self.core.term, self.core.leader_id
        if role != self._last_role or term != self._last_term or leader != self._last_leader:
            log.info("raft state", extra={"node": self.config.node_id, "role": role.value,
                                          "term": term, "leader": leader or ""})
            self._last_role, self._last_term, self._last_leader = role, term, leader

    def log_debug_state(self) -> None:
        """Log the core's view of each follower (on SIGUSR1): what an operator needs to
        see why a follower does not catch up."""
        progress = getattr(self.core, "progress", {}) if self.is_leader else {}
        log.warning("debug state", extra={
            "node": self.config.node_id, "status": repr(self.core.status()),
            "progress": repr(progress),
            "dropped_messages": repr(self.transport.dropped_messages()),
            "write_waiters": len(self._write_waiters), "read_waiters": len(self._read_waiters)})

    # ----- views -----------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.core.role.value == "leader"

    def leader_hint(self) -> tuple[NodeId | None, str]:
        leader = self.core.leader_id
        return leader, self.address_of(leader)

    def address_of(self, node_id: NodeId | None) -> str:
        """Where this node reaches `node_id`: the command line's --peers, else what the
        membership says (a member added at run time). --peers wins because it is this
        host's own route to that node (a proxy, a NAT), while a member's address is one
        log entry shared by every node: a node removed and added back under its old id
        is reached the way it always was."""
        if node_id is None:
            return ""
        if node_id == self.config.node_id:
            return self.config.listen_address
        return self.config.peers.get(node_id) or split_member_info(
            self.core.membership.info(node_id))[0]

    def peer_link_of(self, node_id: NodeId) -> str:
        """Where this node reaches `node_id`'s peer port: --peer-links, else what the
        membership says (a member added with a peer address); "" = over gRPC."""
        return self.config.peer_links.get(node_id) or split_member_info(
            self.core.membership.info(node_id))[1]

    def member_addresses(self) -> dict[NodeId, str]:
        members = set(self.core.membership.members()) | set(self.config.peers)
        return {m: self.address_of(m) for m in sorted(members)}

    def is_known_peer(self, node_id: str) -> bool:
        """Whether peer messages from `node_id` are accepted: a member of our membership,
        a --peers entry, or a node that introduced itself (thesis §4.1: a server accepts
        a leader that is not yet in its log's membership)."""
        return (node_id in self.config.peers or node_id in self.core.membership.members()
                or node_id in self.known_members)

    def _sync_peers(self) -> None:
        """Reach every member of the membership in effect (members added at run time).
        Called after every Ready; what it does depends only on the membership (and the
        fixed command line), so it does nothing until the core holds a new one."""
        membership = self.core.membership
        if membership is self._synced_membership:
            return
        self._synced_membership = membership
        for member in membership.members():
            if member == self.config.node_id:
                continue
            address = self.address_of(member)
            if address:
                self.transport.set_peer(member, address, self.peer_link_of(member))

    # ----- membership ------------------------------------------------------------------

    async def change_membership(self, change: str, node_id: NodeId, address: str,
                                peer_address: str = "") -> int:
        """Carry out one membership change on the leader and wait until it is committed
        and applied here; returns its log index. Raises NotLeaderError,
        MembershipChangeRefused, ValueError (bad arguments), OutcomeUnknown."""
        try:
            kind = MembershipChangeKind(change)
        except ValueError:
            raise ValueError(f"change {change!r} is not one of "
                             f"{[k.value for k in MembershipChangeKind]}") from None
        if kind is MembershipChangeKind.ADD_LEARNER:
            if ":" not in address or " " in address:
                raise ValueError(f"add-learner needs the new member's address as HOST:PORT, "
                                 f"got {address!r}")
            if peer_address and (":" not in peer_address or " " in peer_address):
                raise ValueError(f"the new member's peer address must be HOST:PORT (its "
                                 f"--peer-listen), got {peer_address!r}")
            if peer_address == address:
                raise ValueError(f"the peer address {peer_address} is the member's client "
                                 f"address; give its --peer-listen address")
        elif address or peer_address:
            raise ValueError(f"{change} takes no address")
        if self._stopping:
            raise NotLeaderError(None, "")
        if (kind is MembershipChangeKind.REMOVE and node_id == self.config.node_id
                and self.is_leader):
            # Thesis §3.10: hand leadership to the most caught-up voter first; the client
            # retries the removal there.
            others = [(p.match, peer) for peer, p in self.core.progress.items()
                      if peer in self.core.membership.voters]
            if others:
                _, target = max(others)
                self.core.transfer_leadership(target)
                self._kick()
                raise NotLeaderError(target, self.address_of(target))
        try:
            index, term = self.watch.change_membership(
                self.core, kind, node_id, info=member_info(address, peer_address))
        except NotLeader as exc:
            raise NotLeaderError(exc.leader_id, self.address_of(exc.leader_id)) from None
        except ProposalDropped as exc:
            raise NotLeaderError(self.core.leader_id,
                                 self.address_of(self.core.leader_id)) from exc
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        waiter = _WriteWaiter(term=term, future=future)
        self._write_waiters[index] = waiter
        self._kick()
        try:
            await future
        finally:
            if self._write_waiters.get(index) is waiter:
                del self._write_waiters[index]
        log.info("membership changed", extra={
            "node": self.config.node_id, "change": change, "member": node_id, "index": index,
            "voters": ",".join(self.core.membership.voters),
            "learners": ",".join(self.core.membership.learners)})
        return index

    def handle_introduce(self, cluster_id: str, node_id: str, member_id: str
                         ) -> tuple[str, str, bool, bool]:
        """A node tells us which incarnation of `node_id` it is (Introduce RPC). Returns
        (verdict, message, is_voter, is_learner); see kv.proto IntroduceResponse."""
        membership = self.core.membership
        is_voter, is_learner = node_id in membership.voters, node_id in membership.learners
        ours = self.identity.cluster_id if self.identity is not None else ""
        if cluster_id and ours and cluster_id != ours:
            return ("other-cluster",
                    f"node {self.config.node_id} belongs to cluster {ours}, not {cluster_id}",
                    is_voter, is_learner)
        known = self.known_members.get(node_id)
        if known is not None and known != member_id and is_voter:
            return ("conflict",
                    f"{self.config.node_id} knows {node_id} as a voter with member id {known}, "
                    f"not {member_id}: {node_id}'s data directory is new, so it may have lost "
                    f"entries it acknowledged",
                    is_voter, is_learner)
        self.known_members.record(node_id, member_id)
        return "welcome", "", is_voter, is_learner

    async def _introduce_until_known(self) -> None:
        """Introduce this (new) data directory to the peers until a majority of the
        voters (not counting itself) know it under its member id, or one of them lists
        it as a learner; only then may it vote. A peer knowing it as a VOTER under another member id means it lost its
        data: the vote stays withheld and the operator is told how to rejoin."""
        from system.kv.proto import kv_pb2

        assert self.identity is not None
        node_id = self.config.node_id
        told = ""
        warned: set[str] = set()
        while True:
            voters = set(self.core.membership.voters)
            addresses = {m: a for m, a in self.member_addresses().items()
                         if m != node_id and a}
            welcomes: set[str] = set()
            as_learner = False
            conflict = ""
            cluster_id = self.identity.cluster_id
            for peer, address in addresses.items():
                try:
                    answer = await _call_introduce(address, kv_pb2.IntroduceRequest(
                        cluster_id=cluster_id, node_id=node_id,
                        member_id=self.identity.member_id), peer,
                        self.config.tls.client if self.config.tls else None)
                except Exception as exc:  # noqa: BLE001 - a peer down or unreachable: ask later
                    refused = await _refusal(exc, address, peer, self.config.tls)
                    if refused and refused not in warned:
                        # A peer that refuses our certificate: say so once, not every 0.5 s.
                        warned.add(refused)
                        log.error("Introduce to %s failed: %s", peer, refused,
                                  extra={"node": node_id, "peer": peer})
                    continue
                if answer.node_id != peer and answer.verdict != "conflict":
                    # A wrong address: another node (or this one) answered for `peer`.
                    # Crediting `peer` would count that node's welcome twice, or our own;
                    # in CI a proxy that took a starting node's port did exactly that. (A
                    # conflict still counts: whoever answered remembers our old incarnation.)
                    misrouted = (f"{address}, the address of {peer}, is answered by "
                                 f"{answer.node_id or 'a node that does not say its id'}; "
                                 f"{peer}'s welcome does not count until it answers there "
                                 f"(check --peers or the address given to member add)")
                    if misrouted not in warned:
                        warned.add(misrouted)
                        log.warning(misrouted, extra={"node": node_id, "peer": peer})
                    continue
                if answer.verdict == "welcome":
                    if not cluster_id and answer.cluster_id:
                        cluster_id = answer.cluster_id  # joining: the cluster names itself
                    if answer.is_learner:
                        as_learner = True
                    if answer.is_voter or answer.is_learner:
                        welcomes.add(peer)
                else:
                    conflict = answer.message
            # Not counting ourselves: the peers that recorded our FIRST incarnation were a
            # majority of the voters other than us, so any later majority of them includes
            # one that knows it, and a new incarnation of a voter is always caught.
            majority = len(voters) // 2 + 1
            alone = voters == {node_id}
            if not conflict and (as_learner or alone
                                 or len(welcomes & (voters - {node_id})) >= majority):
                self.identity = Identity(cluster_id, node_id, self.identity.member_id,
                                         STATE_MEMBER)
                save_identity(self.config.data_dir, self.identity)
                self.core.allow_vote()
                self.identity_problem = ""
                log.info("identity confirmed by the peers; this node may vote",
                         extra={"node": node_id, "member_id": self.identity.member_id})
                self._kick()
                return
            if conflict:
                problem = (
                    f"node {node_id} will not vote: {conflict}. To rejoin, from any host: "
                    f"python -m system.kv member remove --cluster {_some(addresses)} --id "
                    f"{node_id}; then python -m system.kv member add --cluster "
                    f"{_some(addresses)} --id {node_id} --address "
                    f"{self.config.listen_address}; this node then catches up as a learner; "
                    f"then python -m system.kv member promote --cluster {_some(addresses)} "
                    f"--id {node_id}")
                self.identity_problem = problem
                self.core.withhold_vote(problem)
                if problem != told:
                    told = problem
                    log.error(problem, extra={"node": node_id})
                    print(f"error: {problem}", file=sys.stderr, flush=True)
            await asyncio.sleep(0.5)


_MEMBERSHIP_APPLIED = object()  # the apply result of a CONFIG entry (its waiter's answer)


def _some(addresses: Mapping[str, str]) -> str:
    return ",".join(sorted(addresses.values())) or "HOST:PORT"


async def _call_introduce(address: str, request, peer: NodeId = "",  # noqa: ANN001, ANN202
                          tls: TlsFiles | None = None):
    """Introduce to `peer` at `address`; with `tls`, as this node's certificate, and only
    to a node whose certificate names `peer`."""
    from system.kv.proto import kv_pb2, kv_pb2_grpc

    async with open_channel(address, tls, peer_name=peer, aio=True) as channel:
        stub = kv_pb2_grpc.KVStub(channel)
        answer: kv_pb2.IntroduceResponse = await stub.Introduce(request, timeout=1.0)
        return answer


async def _refusal(exc: Exception, address: str, peer: NodeId, tls: NodeTls | None) -> str:
    """Why `peer` will not take our Introduce for good: its PERMISSION_DENIED reason, or
    a TLS handshake that failed for a reason of certificates; "" for a peer that is down
    or unreachable (asked again later)."""
    import grpc

    from system.kv.tls_failure import explain

    if not isinstance(exc, grpc.RpcError):
        return ""
    if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
        return exc.details() or "permission denied"
    if tls is not None and exc.code() == grpc.StatusCode.UNAVAILABLE:
        # In a thread: it may probe the peer's port (at most a second).
        reason = await asyncio.to_thread(explain, address, exc.details() or "", tls.client,
                                         peer)
        return f"TLS handshake failed: {reason}" if reason else ""
    return ""


def member_info(address: str, peer_address: str = "") -> str:
    """What a membership entry records of a member added at run time: its client address,
    then " peer=HOST:PORT" when it has a peer port (entries written before peer ports
    hold the address alone, and still read that way)."""
    return f"{address} peer={peer_address}" if peer_address else address


def split_member_info(info: str) -> tuple[str, str]:
    """(client address, peer address or "") of a membership entry's info."""
    address, _, rest = info.partition(" ")
    return address, rest.removeprefix("peer=") if rest.startswith("peer=") else ""


def _vote_or_term_changed(old: HardState, new: HardState) -> bool:
    """Whether `new` changes what a vote depends on (term, vote, the catch-up index that
    forbids voting after lost entries): such a change must be fsynced before sending."""
    return old.term != new.term or old.vote != new.vote or old.catch_up_to != new.catch_up_to
