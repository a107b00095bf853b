"""The store's canaries and broken Raft cores (`--unsafe NAME`) as simulator variants.

What it is for: `python -m nemesis run --platform sim --unsafe NAME` must break the
simulated store the way `--unsafe NAME` breaks a real node, so the harness's canary matrix
holds on the simulator too. Two canaries are the store's own hooks, called where the real
node calls them: `no-dedup` (`request_id_for_proposal` drops the request id) and
`stale-read` (`skips_read_barrier`: linearizable reads served from local state), and
`skips-fsync` (`skips_fsync`: a Ready persisted without its fsync), and
`counts-unsynced-self` (`core_class`: a leader's core that counts its own unsynced entries
towards a commit; caught only where a Ready is pipelined, `Simulation(pipeline=True)`). The
other,
`ack-before-commit`, needs the node's internals in the store, so it is written again here
for the simulator's shell: a write is answered once the leader's own log holds it, with the
result its entry will have if the log commits as it stands. `cas-skips-check-when-absent`,
`delete-keeps-version` and `snapshot-drops-request-ids` break a rule of the state machine: every simulated node applies
with the store's canary subclass (`UnsafeMode.state_machine_class`), as a real node does.
The client-library canary (`client-new-request-id`) is no variant of the store: the
simulated clients run it (nemesis/sim_runner.py), as the real ones do.

The broken Raft cores (system/raft/unsafe.py, e.g. `votes-twice`) need nothing of their
own here: their variant is the real shell and state machine around the broken core, the
same core class a real node builds with `--unsafe NAME`.

What it must never do: be reachable except by naming a canary (`variant_for`); every line
of deliberately wrong simulator code for the store's canaries is in this module.
"""

from __future__ import annotations

from system.kv.state_machine import DeleteCommand, decode_command
from system.kv.unsafe import (
    CANARIES,
    STORE_CANARIES,
    AckBeforeCommit,
    CasSkipsCheckWhenAbsent,
    CountsUnsyncedSelf,
    DeleteKeepsVersion,
    NoDedup,
    SkipsFsync,
    SnapshotDropsRequestIds,
    StaleRead,
    UnsafeMode,
)
from system.raft.core import Ready
from system.raft.types import EntryKind
from system.raft.unsafe import VARIANTS as CORE_VARIANTS
from system.sim.clients import ClientOp
from system.sim.shell import NodeShell
from system.sim.variant import SimVariant


class _CanaryShell(NodeShell):
    """A shell that consults the store's unsafe hooks where the real node does."""

    mode: UnsafeMode = UnsafeMode()

    def proposal_request_id(self, op: ClientOp) -> str:
        return self.mode.request_id_for_proposal(op.request_id)

    def serves_reads_locally(self) -> bool:
        # The store's hook takes the node; the canaries answer without looking at it.
        return self.mode.skips_read_barrier(None)  # type: ignore[arg-type]

    def skips_fsync(self) -> bool:
        return self.mode.skips_fsync()

    def may_apply_before_persist(self, ready: Ready) -> bool:
        return False  # the node never applies early in an unsafe mode


class NoDedupShell(_CanaryShell):
    """WRONG (no-dedup): proposes writes without their request id; a retry applies twice."""

    mode = NoDedup()


class SkipsFsyncShell(_CanaryShell):
    """WRONG (skips-fsync): persists a Ready without fsyncing it, then acts on it; a
    power loss (the disk's `crash(lose_unsynced=True)`) drops acknowledged writes."""

    mode = SkipsFsync()

    def maybe_compact(self) -> None:
        # The store's storage fsyncs its WAL before it writes a snapshot
        # (DurableStorage._store_snapshot), so the real canary's term and vote reach the
        # disk at each snapshot; the simulator's disk saves only the snapshot. Without this
        # a power loss leaves every node refusing its disk (term below the snapshot's),
        # which no real node of this canary does.
        before = self.snapshot_index
        super().maybe_compact()
        if self.snapshot_index != before:
            self.disk.sync()


class StaleReadShell(_CanaryShell):
    """WRONG (stale-read): every node serves linearizable reads from its local state."""

    mode = StaleRead()


class CountsUnsyncedSelfShell(_CanaryShell):
    """WRONG (counts-unsynced-self): the leader counts its own entry towards a commit
    before its fsync returns (the variant's core); the shell is the node's."""

    mode = CountsUnsyncedSelf()


class AckBeforeCommitShell(NodeShell):
    """WRONG (ack-before-commit): answers a write once the leader persisted it to its own
    log, before a majority holds it. The answer replays the unapplied entries on the keys'
    versions, so without faults it is right; a deposed or crashed leader loses it."""

    def may_apply_before_persist(self, ready: Ready) -> bool:
        return False  # the node never applies early in an unsafe mode

    def after_persist(self, ready: Ready) -> None:
        core = self.core
        if core is None or not ready.entries:
            return
        waiting = [e for e in ready.entries if e.kind is EntryKind.NORMAL
                   and any(term == e.term and not op.done
                           for term, op, _ in self.write_waiters.get(e.index, ()))]
        if not waiting:
            return
        versions: dict[str, int] = {}
        results: dict[int, tuple[bool, int]] = {}
        for entry in core.log.slice(self.applied_index + 1, max(e.index for e in waiting) + 1):
            if entry.kind is not EntryKind.NORMAL:
                continue
            command = decode_command(entry.data)
            if command.key not in versions:
                versions[command.key] = self.replica.read(command.key).version
            version = versions[command.key]
            matches = command.expected_version in (None, version)
            if isinstance(command, DeleteCommand):  # answers the version the key had
                results[entry.index] = (matches, version)
                if matches:
                    versions[command.key] = 0
                continue
            results[entry.index] = (matches, version + 1 if matches else version)
            if matches:
                versions[command.key] = version + 1
        for entry in waiting:
            if entry.index not in results:
                continue  # applied already (its fsync returned after it committed): answered then
            applied, version = results[entry.index]
            for term, op, attempt in self.write_waiters[entry.index]:
                if term == entry.term and not op.done:
                    error = "" if applied else f"version mismatch: the key is at version {version}"
                    self.acknowledge(op, attempt, entry, applied, op.value, version, error,
                                     mismatch=not applied)


_VARIANTS = {
    AckBeforeCommit.name: SimVariant("ack-before-commit", shell_class=AckBeforeCommitShell,
                                     description=AckBeforeCommitShell.__doc__ or ""),
    StaleRead.name: SimVariant("stale-read", shell_class=StaleReadShell,
                               description=StaleReadShell.__doc__ or ""),
    NoDedup.name: SimVariant("no-dedup", shell_class=NoDedupShell,
                             description=NoDedupShell.__doc__ or ""),
    SkipsFsync.name: SimVariant("skips-fsync", shell_class=SkipsFsyncShell,
                                description=SkipsFsyncShell.__doc__ or ""),
    CountsUnsyncedSelf.name: SimVariant(
        "counts-unsynced-self", core_class=CountsUnsyncedSelf.core_class,
        shell_class=CountsUnsyncedSelfShell, description=CountsUnsyncedSelf.__doc__ or ""),
    # The store's own wrong state machines, applied by every simulated node.
    CasSkipsCheckWhenAbsent.name: SimVariant(
        CasSkipsCheckWhenAbsent.name,
        state_machine_class=CasSkipsCheckWhenAbsent.state_machine_class,
        description=CasSkipsCheckWhenAbsent.__doc__ or ""),
    DeleteKeepsVersion.name: SimVariant(
        DeleteKeepsVersion.name, state_machine_class=DeleteKeepsVersion.state_machine_class,
        description=DeleteKeepsVersion.__doc__ or ""),
    SnapshotDropsRequestIds.name: SimVariant(
        SnapshotDropsRequestIds.name,
        state_machine_class=SnapshotDropsRequestIds.state_machine_class,
        description=SnapshotDropsRequestIds.__doc__ or ""),
}
assert tuple(_VARIANTS) == STORE_CANARIES, "every store canary has a simulator variant"
_VARIANTS.update({name: SimVariant(name, core_class=core, description=core.__doc__ or "")
                  for name, core in CORE_VARIANTS.items()})
assert tuple(_VARIANTS) == CANARIES, "every canary has a simulator variant"
# By name, for `python -m system.sim --variant system.sim.unsafe:NO_DEDUP`.
ACK_BEFORE_COMMIT = _VARIANTS[AckBeforeCommit.name]
STALE_READ = _VARIANTS[StaleRead.name]
NO_DEDUP = _VARIANTS[NoDedup.name]
SKIPS_FSYNC = _VARIANTS[SkipsFsync.name]
CAS_SKIPS_CHECK_WHEN_ABSENT = _VARIANTS[CasSkipsCheckWhenAbsent.name]
DELETE_KEEPS_VERSION = _VARIANTS[DeleteKeepsVersion.name]
COUNTS_UNSYNCED_SELF = _VARIANTS[CountsUnsyncedSelf.name]


def __getattr__(attribute: str) -> SimVariant:
    """A broken core's variant by its constant-style name (VOTES_TWICE for votes-twice), as
    `python -m system.sim --variant system.sim.unsafe:VOTES_TWICE` and the tests written by
    `python -m nemesis shrink` import it."""
    variant = _VARIANTS.get(attribute.lower().replace("_", "-"))
    if variant is None or not attribute.isupper():
        raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
    return variant


def variant_for(canary: str) -> SimVariant:
    """The simulator variant of the store canary `canary`; ValueError names the known ones."""
    variant = _VARIANTS.get(canary)
    if variant is None:
        raise ValueError(f"unknown store canary {canary!r}; known canaries: {', '.join(CANARIES)}")
    return variant
