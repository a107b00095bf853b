"""Test-only UNSAFE node behaviours: the canaries that prove the harness can find real bugs.

Every line of deliberately wrong code in the store lives in this one module. A node runs
one of these only when started with `--unsafe NAME` AND its environment has
`MAO_ALLOW_UNSAFE=1`; otherwise `python -m system.kv serve` refuses to start. The node
calls the hooks below only when an unsafe mode is on (`Node.unsafe is not None`); the safe
code path never goes through here.

Canaries (see docs/kv-node.md):
- `ack-before-commit`: answers a write as soon as the leader has appended it to its own
  log, before a majority has it. A leader crash can then lose an acknowledged write.
- `stale-read`: every node answers linearizable reads from its local state without the
  ReadIndex barrier. A deposed leader or a cut-off follower returns old values.
- `no-dedup`: drops request ids before proposing, so a retried write applies twice.
- `skips-fsync`: writes each Ready to the WAL but never fsyncs it before acknowledging,
  sending or voting. A process crash keeps the page cache and loses nothing; a power loss
  (the `lose-unsynced` fault) drops what was acknowledged.
- `counts-unsynced-self`: the leader counts its own copy of an entry towards the commit
  quorum as soon as the entry is in its log, before its own fsync of it has returned
  (docs/raft.md, "The leader writes its log in parallel with replicating it"). The node
  sends its APPENDs before that fsync, so a follower's answer can make the entry
  "committed" while one node of three holds it durably.
- `cas-skips-check-when-absent`: a compare-and-swap on an absent key (never written, or
  deleted) applies whatever version it expected, as if unconditional.
- `delete-keeps-version`: a delete leaves the key's version behind (a tombstone reads do
  not see); a re-created key continues from it instead of restarting at 1, and a
  compare-and-swap against the deleted key's last version succeeds over the delete.
- `snapshot-drops-request-ids`: snapshots carry the keys but not the remembered request
  ids (docs/kv.md: "the table is part of the snapshot"). A node that restores one (at a
  restart, or from InstallSnapshot) applies a retry of a write older than it again, while
  the nodes that applied the log keep their answer: the replicas diverge, and a retry the
  restored node answers as leader is applied twice.
- every broken Raft core of system/raft/unsafe.py (`votes-twice`, `commits-old-term-entries`,
  ...): the node builds its core from that class (`UnsafeMode.core_class`) and runs the
  real shell around it.

A client-library canary, run by the workload's clients rather than by the nodes
(`client_canary`, KVClient(unsafe=...)):
- `client-new-request-id`: retries a write whose outcome is unknown under a fresh request
  id, so the store cannot tell the retry from a new write and may apply it twice.

What it must never do: be reachable without both the flag and the environment variable.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from system.kv.state_machine import (
    DeleteCommand,
    DeleteResult,
    FrozenState,
    KVStateMachine,
    PutCommand,
    PutResult,
    decode_command,
)
from system.raft.core import RaftCore
from system.raft.types import Entry, EntryKind
from system.raft.unsafe import VARIANTS as CORE_VARIANTS

if TYPE_CHECKING:
    from system.kv.node import Node

ALLOW_ENV_VAR = "MAO_ALLOW_UNSAFE"
STORE_CANARIES = ("ack-before-commit", "stale-read", "no-dedup", "skips-fsync",
                  "counts-unsynced-self", "cas-skips-check-when-absent", "delete-keeps-version",
                  "snapshot-drops-request-ids")
# Every name `--unsafe` takes for a node and for `python -m nemesis run`: one list.
CANARIES = (*STORE_CANARIES, *CORE_VARIANTS)
CLIENT_CANARIES = ("client-new-request-id",)


class UnsafeRefused(RuntimeError):
    """An unsafe mode was requested without the environment's explicit permission."""


class UnsafeMode:
    """Hooks a node calls when an unsafe mode is on; each canary overrides one."""

    name = ""
    core_class: type[RaftCore] = RaftCore  # the Raft core the node builds
    # The state machine the node applies committed entries with (a canary that breaks one
    # of its rules names a subclass; the store's own pure machine is not touched).
    state_machine_class: type[KVStateMachine] = KVStateMachine

    def request_id_for_proposal(self, request_id: str) -> str:
        return request_id

    def skips_read_barrier(self, node: Node) -> bool:
        return False

    def after_persist(self, node: Node, entries: Sequence[Entry]) -> None:
        return None

    def skips_fsync(self) -> bool:
        return False


class AckBeforeCommit(UnsafeMode):
    """WRONG: acknowledges a write once the leader's own log has it (not a majority).

    The answer is what the write WILL return if the leader's log commits as it stands: the
    leader replays its unapplied entries, in log order, on the versions of the keys they
    touch. So without faults every answer is right and the history is linearizable; the
    bug shows only when a leader loses entries it acknowledged (deposed, partitioned,
    killed) — the bug this canary exists to let the harness find. (Request-id dedup of a
    retry that is still unapplied is not replayed: retries are rare without faults.)"""

    name = "ack-before-commit"

    def after_persist(self, node: Node, entries: Sequence[Entry]) -> None:
        waiting = [e for e in entries if e.kind == EntryKind.NORMAL
                   and (w := node._write_waiters.get(e.index)) is not None  # noqa: SLF001
                   and not w.future.done() and w.term == e.term]
        if not waiting:
            return
        sm = node.state_machine
        versions: dict[str, int] = {}
        results: dict[int, PutResult | DeleteResult] = {}
        last = max(e.index for e in waiting)
        for entry in node.core.log.slice(sm.applied_index + 1, last + 1):
            if entry.kind != EntryKind.NORMAL:
                continue
            command = decode_command(entry.data)
            if command.key not in versions:
                current = sm.get(command.key)
                versions[command.key] = current[1] if current is not None else 0
            version = versions[command.key]
            matches = command.expected_version is None or command.expected_version == version
            if isinstance(command, DeleteCommand):
                results[entry.index] = DeleteResult(applied=matches, existed=version > 0,
                                                    version=version)
                if matches:
                    versions[command.key] = 0
            else:
                results[entry.index] = PutResult(applied=matches,
                                                 version=version + 1 if matches else version)
                if matches:
                    versions[command.key] = version + 1
        for entry in waiting:
            if entry.index in results:
                node._write_waiters[entry.index].future.set_result(results[entry.index])  # noqa: SLF001


class StaleRead(UnsafeMode):
    """WRONG: any node serves linearizable reads from its local state."""

    name = "stale-read"

    def skips_read_barrier(self, node: Node) -> bool:
        return True


class NoDedup(UnsafeMode):
    """WRONG: forgets request ids, so retries are applied again."""

    name = "no-dedup"

    def request_id_for_proposal(self, request_id: str) -> str:
        return ""


class SkipsFsync(UnsafeMode):
    """WRONG: a Ready's entries, term and vote are written but not fsynced before the
    node acts on them (acknowledges, answers an APPEND, grants a vote). Invisible to
    kills, which keep the OS's page cache; a power loss of the nodes that held a write
    loses it after it was acknowledged."""

    name = "skips-fsync"

    def skips_fsync(self) -> bool:
        return True


class _CountsUnsyncedSelfCore(RaftCore):
    """WRONG: the leader's own log counts towards the commit quorum up to its last entry,
    not up to `durable_index` (what the shell has reported fsynced with `advance`)."""

    def quorum_match_index(self) -> int:
        voters = self.membership.voters
        matches = [p.match for peer, p in self.progress.items() if peer in voters]
        if self.id in voters:
            matches.append(self.log.last_index())
        matches.sort(reverse=True)
        return matches[self.quorum - 1] if len(matches) >= self.quorum else 0


class CountsUnsyncedSelf(UnsafeMode):
    """WRONG: a leader counts its own copy of an entry towards a commit before its fsync
    of it returned. Its APPENDs leave before that fsync (thesis §10.2.1), so one
    follower's answer "commits" an entry only that follower holds durably; a power loss
    of the leader then loses an entry the leader already counted as committed."""

    name = "counts-unsynced-self"

    core_class = _CountsUnsyncedSelfCore


class CasSkipsCheckWhenAbsentMachine(KVStateMachine):
    """WRONG: a put with an expected version on an absent key applies whatever it expected."""

    def _put(self, command: PutCommand) -> PutResult:
        if command.expected_version is not None and self.get(command.key) is None:
            command = PutCommand(command.key, command.value, None, command.request_id)
        return super()._put(command)


class CasSkipsCheckWhenAbsent(UnsafeMode):
    """WRONG: the version check of a compare-and-swap is skipped when the key is absent."""

    name = "cas-skips-check-when-absent"
    state_machine_class = CasSkipsCheckWhenAbsentMachine


class DeleteKeepsVersionMachine(KVStateMachine):
    """WRONG: a delete remembers the version it removed (a tombstone, in memory only: not in
    snapshots), and the next put of the key continues from it. Reads still see the key
    absent, so the bug shows only to a write after a delete."""

    def __init__(self, **kwargs: int) -> None:
        super().__init__(**kwargs)
        self._tombstones: dict[str, int] = {}

    def _delete(self, command: DeleteCommand) -> DeleteResult:
        result = super()._delete(command)
        if result.applied and result.existed:
            self._tombstones[command.key] = result.version
        return result

    def _put(self, command: PutCommand) -> PutResult:
        kept = self._tombstones.get(command.key) if self.get(command.key) is None else None
        if kept is None:
            return super()._put(command)
        if command.expected_version is not None and command.expected_version != kept:
            return PutResult(applied=False, version=kept)
        del self._tombstones[command.key]
        self._data[command.key] = (command.value, kept + 1)
        return PutResult(applied=True, version=kept + 1)


class DeleteKeepsVersion(UnsafeMode):
    """WRONG: a re-created key continues from its deleted version instead of 1."""

    name = "delete-keeps-version"
    state_machine_class = DeleteKeepsVersionMachine


class SnapshotDropsRequestIdsMachine(KVStateMachine):
    """WRONG: its snapshots (`frozen_copy`, which `snapshot` and the node's background
    snapshot both take) leave the remembered request ids out."""

    def frozen_copy(self) -> FrozenState:
        return dataclasses.replace(super().frozen_copy(), records=[])


class SnapshotDropsRequestIds(UnsafeMode):
    """WRONG: a restored snapshot forgets which requests were applied."""

    name = "snapshot-drops-request-ids"
    state_machine_class = SnapshotDropsRequestIdsMachine


class BrokenCore(UnsafeMode):
    """WRONG: the node's Raft core is a broken variant (system/raft/unsafe.py); the rest of
    the node is the real one."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.core_class = CORE_VARIANTS[name]


_MODES: dict[str, type[UnsafeMode]] = {
    AckBeforeCommit.name: AckBeforeCommit,
    StaleRead.name: StaleRead,
    NoDedup.name: NoDedup,
    SkipsFsync.name: SkipsFsync,
    CountsUnsyncedSelf.name: CountsUnsyncedSelf,
    CasSkipsCheckWhenAbsent.name: CasSkipsCheckWhenAbsent,
    DeleteKeepsVersion.name: DeleteKeepsVersion,
    SnapshotDropsRequestIds.name: SnapshotDropsRequestIds,
}
assert tuple(_MODES) == STORE_CANARIES, "every store canary has a mode"


def unsafe_mode(name: str | None, environ: dict[str, str] | None = None) -> UnsafeMode | None:
    """The unsafe mode called `name`, or None for a safe node.

    Raises UnsafeRefused unless the environment sets MAO_ALLOW_UNSAFE=1, and ValueError
    for an unknown name.
    """
    if not name:
        return None
    env = os.environ if environ is None else environ
    if name not in CANARIES:
        raise ValueError(f"unknown unsafe mode {name!r}; known canaries: {', '.join(CANARIES)}")
    if env.get(ALLOW_ENV_VAR) != "1":
        raise UnsafeRefused(
            f"refusing to start with --unsafe {name}: this mode deliberately breaks safety "
            f"and exists only to test the test harness. Set {ALLOW_ENV_VAR}=1 in the "
            f"environment if that is really what you want.")
    return _MODES[name]() if name in _MODES else BrokenCore(name)



class ClientNewRequestId:
    """WRONG (client library): a write retried after an attempt that may have applied goes
    out under a fresh request id, so the store applies it again if the first one did."""

    name = "client-new-request-id"

    def retry_request_id(self, fresh: Callable[[], str], request_id: str) -> str:
        return fresh()


def client_canary(name: str | None, environ: dict[str, str] | None = None
                  ) -> ClientNewRequestId | None:
    """The client-library canary called `name` (None: the safe client). Raises
    UnsafeRefused unless MAO_ALLOW_UNSAFE=1, and ValueError for a name that is not one."""
    if not name:
        return None
    if name not in CLIENT_CANARIES:
        raise ValueError(f"unknown client canary {name!r}; known: {', '.join(CLIENT_CANARIES)}")
    env = os.environ if environ is None else environ
    if env.get(ALLOW_ENV_VAR) != "1":
        raise UnsafeRefused(
            f"refusing to run clients with --unsafe {name}: this mode deliberately breaks "
            f"safety and exists only to test the test harness. Set {ALLOW_ENV_VAR}=1 in the "
            f"environment if that is really what you want.")
    return ClientNewRequestId()
