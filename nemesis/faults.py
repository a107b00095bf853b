"""The nemesis: a seeded schedule of faults, applied to a platform and recorded in the history.

Jepsen's rhythm: wait `interval` seconds, start a fault, hold it `interval` seconds, heal it,
and again until the run's deadline. Which fault, which shape and which kind of target come
from a seeded random source, so `--seed` repeats the schedule; the concrete node a target
names ("the leader") is whatever the cluster says at that moment.

Shapes and targets are not drawn independently each time but dealt from a shuffled deck
(every variant once per round), and each round starts with the variant that hurts the
leader (isolate-leader, kill the leader, pause the leader). A uniform draw left one run in
five with no partition that deposed the leader — and so with nothing that could expose an
acknowledged-but-uncommitted write (measured with the ack-before-commit canary: one of the
first two seeds escaped a 60 s run). Kinds of fault are still drawn uniformly.

Faults (`--faults`, a comma list):
- partition: random-halves, isolate-leader, majorities-ring, bridge (see `partitions`);
- kill: the leader, a random node or a minority, SIGKILL; healed by restarting them;
- pause: the leader or a random node, SIGSTOP / cgroup freezer; healed by resuming;
- packet: loss on a random set of directed links; healed by removing it;
- reorder (sim only): on a random set of directed links, messages delivered late, behind
  later ones, and some twice; healed by removing it;
- slow-disk (local, on the lazy disk): every node's fsyncs 0-150 ms slower each, and the
  leader killed at once; healed by restoring the disks and restarting it;
- member: a deck of shapes (nemesis/member_shapes.py), each round led by two changes in
  flight: two-in-flight (the leader, cut with a minority, asked to remove two nodes of the
  other side back to back), change-at-new-leader (the leader isolated, and the first node
  to lead asked at once to remove it), and remove-and-rejoin: the leader or a random node
  leaves the cluster through a membership change (`member remove`), is killed and loses
  its disk; healed as an operator rejoins a node (thesis §4, docs/kv.md "Identity and
  rejoining"): `member add` as a learner, start it on the empty directory with its usual
  command line, `member promote` once it caught up — Jepsen's membership nemesis for etcd;
- truncate, bitflip, wipe-wal (file faults, local and docker only): a random minority is
  killed and, while stopped, loses the tail of a WAL segment (from one byte to most of the
  file; the newest segment mostly), has 1-8 bits flipped in a WAL segment or the snapshot,
  or loses its whole wal/ folder; healed by starting it with its usual command line;
- lose-unsynced: every node at once, a minority or the leader (each round led by every
  node) crashes and loses every write it had not fsynced (`Platform.power_loss`; the run
  puts the nodes on a lazy disk); kill-all: SIGKILL of every node at once; both healed by
  starting the nodes again;
- election (local, docker, sim; 5 nodes or more): faults aimed at an election in progress
  (nemesis/elections.py): the voters a majority needs frozen and the leader killed, so
  that every other node campaigns for the same term, then the voters thawed at once
  (split-vote); or a voter killed and restarted between two candidates' requests of one
  term (vote-then-restart); or the leader cut off and frozen until a successor leads,
  then thawed among the successor's followers (deposed-leader); or a vote grant held
  until its candidate asks in the next term (late-grant, local and sim); healed by
  restarting the killed leader (sim: deposed-leader, late-grant and, from 5 nodes,
  vote-then-restart built from the platform's held messages);
- rollback (local and sim; 3 nodes or more): a follower restarted on an older, consistent copy
  of its own data directory (a VM restored from a backup), the leader killed once the
  follower knows it lost acknowledged entries and before it caught up, with the nodes
  that lack those entries let back in (nemesis/rollback.py); healed by restarting the
  leader;
- restore-majority (local and sim; 3 nodes or more; a workload that can hold its clients,
  the kv workload; on sim the platform holds its simulated clients and copies fake disks): the clients held, a majority of followers backed up one at a time, a few
  writes of the nemesis's own committed, then that majority restarted on the backups
  with the others cut off, so that it elects a leader without those entries while the
  others hold them committed (nemesis/restore_majority.py); the clients are let go once
  it leads; healed by healing the others' links, where the store must notice the
  diverged committed logs;
- hold (sim and local; 3 nodes or more): messages delivered late rather than lost, aimed
  at Figure 2's receiver rules about messages of older terms (iptables cannot delay; the
  local platform's link proxies keep a node's bytes and write them late, in order, and
  build overtaken from connections: LocalPlatform.hold_in_flight). Shapes, dealt from a
  deck: stale-leader (everything the leader
  sends, and has on the wire, held: its peers elect a new leader while it runs on and
  takes writes; the moment a follower holds an entry of the newer term it has not committed,
  or else at the heal, its old-term APPENDs and answers arrive in the newer term) and
  overtaken (only the leader's messages on the wire now held: what it
  sends later overtakes them, and at the end an older APPEND of the same term arrives
  after newer ones, and the leader crashes until the heal); healed by releasing them
  (and restarting that leader);
- none: no faults (a baseline run).

After a disk fault a node may refuse its data (exit 3, one line naming the file and
offset). That is an expected outcome, not a harness error: the heal waits until each
restarted node answers or exits, and a refusing node is taken back as its message says —
member remove, its directory emptied, member add (a learner), started empty, member
promote — each step a `rejoin-step` record after a `node-refused` one. Any other exit is a
nemesis error and the run reports the node as crashed.

A workload may own processes of its own (the trainer's coordinators and workers) and offer
them as targets (`workloads.base.ProcessTargets`). Then kill and pause also deal the
workload's roles (`coordinator` — the one holding the lease — `standby`, `worker`), each
round led by `coordinator`, and partition also deals `coordinator-from-store` (the active
coordinator cut from every store node, by the workload's own proxies) and
`coordinator-reply-lost` (the answer to the active coordinator's next checkpoint write lost
after the store committed it: `lose_reply`). A killed process is healed by starting a
replacement (the workload decides what that is).

Windows. A workload may also name windows of its protocol (`target_windows`: the trainer's
`checkpoint-write`, `lease-renewal`, `takeover`) and start a fault inside one
(`window_fault(window, kind)`: it watches its processes and arms their pause points, so the
fault lands between an operation's invoke and its completion, not wherever a random moment
falls). Then each kill, pause or partition the schedule draws goes to the next window not
yet hit, until every window has been hit once (one that was missed — no write came — is
tried again after the others); after that every second such fault goes to a window, in
turn. The fault's start record says which window (`window`), whether it landed inside it
(`landed`) and where (`at`: the step of the write, the term of the lease).

Every start and every heal is an event in the history (process "nemesis", type info), with
the fault's id, kind, the nodes it touched and, for partitions, the graph of who can reach
whom; for a file fault, what was damaged (`damage`: node, file, offset, bytes, size before
and after; the flipped bits). Must never leave a fault in place: `heal_everything()`
undoes whatever is active, also resumes, restarts and reconnects what a failed heal may
have missed, and finishes a rejoin that broke off (every node a voter again).
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nemesis import member_shapes, partitions
from nemesis.platforms.base import Platform, PlatformError

log = logging.getLogger("nemesis")

FAULTS = ("partition", "kill", "pause", "packet", "reorder", "member", "truncate", "bitflip", "wipe-wal",
          "lose-unsynced", "slow-disk", "kill-all", "election", "rollback", "restore-majority",
          "hold", "none")
# Faults that damage a stopped node's files (the platform's `damage_files`).
FILE_FAULTS = ("truncate", "bitflip", "wipe-wal")
# Faults after which a node may refuse its data at the restart (exit 3): the heal waits for
# each restarted node and, on a refusal, rejoins it as a new member.
DISK_FAULTS = (*FILE_FAULTS, "lose-unsynced", "kill-all", "rollback", "restore-majority")
# Where each fault runs when not everywhere (the simulator's disk holds records, not bytes;
# its nodes have no identity to re-admit, so it deals only the member fault's two-in-flight).
FAULT_PLATFORMS = {"truncate": ("local", "docker", "ssh"),
                   "bitflip": ("local", "docker", "ssh"), "wipe-wal": ("local", "docker", "ssh"),
                   "lose-unsynced": ("local", "docker", "sim"),
                   "election": ("local", "docker", "sim"), "rollback": ("local", "sim"),
                   "restore-majority": ("local", "sim"),
                   "hold": ("sim", "local"), "reorder": ("sim", "local"), "slow-disk": ("local",)}
# Faults that take committed entries from a majority on purpose: outside Raft's model, so
# the simulator's monitor reports what they do (explore leaves them out of its draw), and
# the disk copies they restore are not in its replayable schedule (shrink refuses them).
BEYOND_RAFT = ("restore-majority", "rollback")
# Faults whose run puts every node's data on the lazy disk (nemesis/lazyfs.py).
LAZY_DISK_FAULTS = frozenset({"lose-unsynced", "slow-disk"})
# slow-disk: each fsync of every node waits a uniform draw from this range (ms) first.
SLOW_FSYNC_MS = (0.0, 150.0)
# ... for this long before the leader is killed: a node hands its fsyncs to its storage
# thread (and goes on stepping messages meanwhile) only once it has seen them slow.
SLOW_BEFORE_KILL_S = 2.0
KILL_TARGETS = ("leader", "random", "minority")
# lose-unsynced leads each round with every node at once: a node that skips fsync loses its
# acknowledged writes only when a majority loses them together (a canary must be caught in
# every seed), and a minority or the leader alone is the gentler case.
POWER_TARGETS = ("all", "minority", "leader")
PAUSE_TARGETS = ("leader", "isolated-leader", "random")
# isolated-leader: the leader cut from every peer and frozen (a long GC pause on the wrong
# side of a partition); when the fault ends it is resumed still cut off for this long, and
# only then are its links healed. Resumed, it still believes it leads until check-quorum
# counts an election timeout of ticks (0.5-1 s at the defaults) while the others have
# elected a leader and taken writes: the window a linearizable read's quorum round
# (ReadIndex) exists for. Real platforms only: the simulator's heal has no time to wait in.
ZOMBIE_S = 2.0
MEMBER_TARGETS = ("leader", "random")
# The end-of-run heal waits this long for a heal in progress (a rejoin: remove, add, start,
# a promotion of up to PROMOTE_TIMEOUT_S) before going on beside it.
END_JOIN_TIMEOUT_S = 240.0
# A promotion waits for the learner to catch up from an empty disk (a snapshot and the log
# since): generous, since the cluster keeps serving meanwhile.
PROMOTE_TIMEOUT_S = 90.0
LOSS_PROBABILITIES = (0.1, 0.2, 0.3, 0.5)
REORDER_PROBABILITIES = (0.2, 0.5)
# A run with `reorder` sends at most this many entries per APPEND: a follower catching up
# then takes many short APPENDs, one of which, late or twice, arrives after newer ones
# while the leader's commit index is past its end (commits-past-verified-entries: 3 of 3
# seeds with 2-entry APPENDs, 0 of 3 with 16 or the default 1024).
REORDER_APPEND_ENTRIES = 2
# Least nodes each fault needs to leave a majority able to serve (checked before a run).
# File faults and lose-unsynced need 3: a node that refuses its data is rejoined through
# membership changes, which the others must be a majority to commit.
MIN_NODES = {"partition": 3, "kill": 1, "pause": 1, "packet": 2, "reorder": 2, "slow-disk": 3, "member": 3, "truncate": 3,
             "bitflip": 3, "wipe-wal": 3, "lose-unsynced": 3, "kill-all": 1, "none": 1,
             # a split election needs two candidates one voter short of a majority each
             "election": 5, "rollback": 3, "restore-majority": 3, "hold": 3}
# On the simulator the election fault runs its deposed-leader and late-grant shapes from 3
# nodes (they need no split of the followers into voters and candidates), and its
# vote-then-restart from 5 (nemesis/elections.py SIM_SHAPE_MIN_NODES).
SIM_MIN_NODES = {"election": 3}


def min_nodes(fault: str, platform: str | None) -> int:
    """The least --nodes `fault` runs with on `platform` (None: not chosen yet)."""
    if platform == "sim" and fault in SIM_MIN_NODES:
        return SIM_MIN_NODES[fault]
    return MIN_NODES[fault]


REFUSED_EXIT = 3  # a node that refuses its data (docs/kv.md, "Recovery")
START_TIMEOUT_S = 60.0  # a restarted node answers or exits within this (a loaded machine)
# With file faults the nodes snapshot every this many entries (their default, 10,000, takes
# minutes at the default rate, and a rejoined node starts its count again): so that bit
# flips reach snapshot files, and a wiped WAL sits beside a snapshot, in runs of any length.
FILE_FAULT_SNAPSHOT_ENTRIES = 1000
TRUNCATE_NEWEST = 0.7  # share of truncations and WAL bit flips that hit the newest segment
MAX_FLIPPED_BITS = 8


def parse_faults(text: str) -> list[str]:
    """`partition,kill` -> ["partition", "kill"]; raises ValueError naming the bad entry."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise ValueError("--faults is empty; give a comma list of: " + ", ".join(FAULTS))
    for name in names:
        if name not in FAULTS:
            raise ValueError(f"unknown fault {name!r}; known faults: {', '.join(FAULTS)}")
    if "none" in names and len(names) > 1:
        raise ValueError("--faults none cannot be combined with other faults")
    return list(dict.fromkeys(names))


def unsupported(faults: list[str], platform: str) -> str | None:
    """The one-line refusal when a fault in `faults` does not run on `platform`, else None."""
    for fault in faults:
        where = FAULT_PLATFORMS.get(fault)
        if where is not None and platform not in where:
            why = {"lose-unsynced": "it has no lazy disk to hold unsynced writes",
                   "election": "it has not been tried there yet",
                   "rollback": "it copies a node's data directory, which only the local "
                               "platform does yet (and the simulator, its fake disk)",
                   "restore-majority": "it copies the nodes' data directories, which only "
                                       "the local platform does yet (and the simulator, its "
                                       "fake disks)",
                   "hold": "it delays messages, which iptables cannot: it drops them; "
                           "the local platform's proxies keep and deliver them late",
                   "reorder": "iptables drops packets, it cannot reorder them, and tc netem "
                              "is absent from this kernel; the local platform's link proxies "
                              "reorder the peer lanes' frames",
                   "slow-disk": "it slows fsync in the local platform's lazy disk (FUSE)"
                                if platform != "sim" else
                                "the simulator's fsyncs already complete at random"}.get(
                fault, "the simulator's disk holds records, not bytes")
            return (f"--faults {fault} does not run on --platform {platform} ({why}); "
                    f"use --platform {' or '.join(where)}")
    return None


@dataclass
class ActiveFault:
    id: int
    kind: str
    nodes: list[str]
    description: str
    heal: Callable[[], dict[str, Any]]
    started: float = field(default_factory=time.monotonic)


EventSink = Callable[[str, dict[str, Any]], None]
Step = Callable[[str, Callable[[], Any]], None]  # runs (and records) one step of a rejoin
PROCESS_PARTITION = "coordinator-from-store"
WINDOW_KINDS = ("kill", "pause", "partition")  # the kinds a workload's window fault can be
REPLY_LOST = "coordinator-reply-lost"
STALE_SNAPSHOT = "stale-snapshot"  # the simulator's partition shape (windows.py on real nodes)
HOLD_SHAPES = ("stale-leader", "overtaken")


def _is_node(name: str, nodes: list[str]) -> bool:
    return name in nodes


class Nemesis:
    """Runs the schedule in its own thread (`start`/`stop`); `heal_everything` at the end."""

    def __init__(self, platform: Platform, faults: list[str], *, seed: int, interval_s: float,
                 record: EventSink, shapes: tuple[str, ...] = partitions.SHAPES,
                 targets: Any = None, clients: Any = None) -> None:
        self.platform = platform
        self.faults = [f for f in faults if f != "none"]
        self.rng = random.Random(f"nemesis:{seed}")
        # What to damage depends on the files found (their number and sizes), so it draws
        # from its own source: the schedule's kinds and targets still repeat with the seed.
        self.damage_rng = random.Random(f"nemesis-damage:{seed}")
        self.interval_s = interval_s
        self.record = record
        self.nodes = list(platform.node_ids)
        self.shapes = tuple(s for s in shapes if len(self.nodes) >= partitions.MIN_NODES[s])
        # A workload's own processes (ProcessTargets) the nemesis may hurt, or None.
        self.targets = targets
        # The workload's clients, when it can hold them between operations (ClientGate:
        # restore-majority's quiet window), or None.
        self.clients = clients
        roles: tuple[str, ...] = tuple(targets.target_roles()) if targets is not None else ()
        self.kill_targets = (*roles, *KILL_TARGETS) if roles else KILL_TARGETS
        pause_targets = PAUSE_TARGETS
        if platform.name == "sim" or len(self.nodes) < partitions.MIN_NODES["isolate-leader"]:
            pause_targets = tuple(t for t in PAUSE_TARGETS if t != "isolated-leader")
        self.pause_targets = (*roles, *pause_targets) if roles else pause_targets
        self.zombie_s = ZOMBIE_S
        self.slow_before_kill_s = SLOW_BEFORE_KILL_S
        self.roles = roles
        if "coordinator" in roles:
            self.shapes = (*self.shapes, PROCESS_PARTITION, REPLY_LOST)
        elif platform.name == "sim" and len(self.nodes) >= 5:
            # Real nodes aim it by their Status (nemesis/windows.py); with fewer than 5 the
            # old leader and its follower are no minority.
            self.shapes = (*self.shapes, STALE_SNAPSHOT)
        windows = getattr(targets, "target_windows", None)
        self.process_windows: tuple[str, ...] = tuple(windows()) if windows is not None else ()
        self.windows_missing = list(self.process_windows)  # not yet hit, in the order to try them
        self._window_turn = 0  # process faults drawn since every window was hit
        self.windows_hit: dict[str, int] = {}
        self.active: dict[int, ActiveFault] = {}
        # Faults whose heal has begun and whose end is not yet recorded (a Docker heal is
        # several `docker exec`s): the progress line names them rather than say "none".
        self.healing: dict[int, ActiveFault] = {}
        # Nodes the nemesis has killed and not yet restarted: any other node found down has
        # crashed on its own, which the run reports.
        self.expected_down: set[str] = set()
        # Nodes that refused their data, and those whose rejoin (remove, wipe, add, start,
        # promote) has begun and not finished: the end-of-run heal finishes it.
        self.refused: set[str] = set()
        self.rejoining: set[str] = set()
        # Nodes found exited on their own, each exit recorded once (`node-crashed`, which
        # makes the run INVALID: checker/crashes.py); a node leaves the set once it runs.
        self.crashes_noted: set[str] = set()
        self.crashes: list[dict[str, Any]] = []
        self._wiped: set[str] = set()
        self.counts: dict[str, int] = {}
        # `election` faults by shape: {"aimed": n, "landed": n} (nemesis/elections.py).
        self.election_counts: dict[str, dict[str, int]] = {}
        self.errors: list[str] = []
        self._next_id = 1
        self._decks: dict[str, list[str]] = {}
        # Leader faults aimed at the store's windows (nemesis/windows.py), when attached.
        self.leader_windows: Any = None
        # The member fault's shapes (nemesis/member_shapes.py), dealt from a deck led by
        # two changes in flight; the plain remove-and-rejoin is the last.
        self.member_shapes: tuple[str, ...] = member_shapes.SHAPES
        system = getattr(platform, "system", None)
        if platform.name == "sim":  # its nodes cannot be wiped and re-admitted
            self.member_shapes = member_shapes.SIM_SHAPES
        elif system is not None and not system.single_membership_changes:
            self.member_shapes = ("remove-and-rejoin",)  # etcd: no change aimed at one node
        # Kinds dealt from a deck led by the first (a --faults all run), else drawn uniformly.
        self.deal_kinds = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ----- schedule --------------------------------------------------------------------

    def start(self, deadline: float) -> None:
        if not self.faults:
            return
        self._thread = threading.Thread(target=self._run, args=(deadline,), name="nemesis",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def busy(self) -> bool:
        """The schedule's thread is still running (a heal in progress)."""
        return self._thread is not None and self._thread.is_alive()

    def _run(self, deadline: float) -> None:
        while not self._stop.is_set():
            # Quiet, then a fault held for one interval, unless the run ends first.
            if self._stop.wait(self.interval_s) or time.monotonic() + self.interval_s / 2 > deadline:
                return
            fault = self.begin_next()
            if fault is None:
                continue
            self._stop.wait(max(0.0, min(self.interval_s, deadline - time.monotonic())))
            self.end(fault)

    # The two moves of the schedule, for an interpreter that owns time itself (the
    # simulator's runs, nemesis/sim_runner.py, call them in simulated time).

    def begin_next(self) -> ActiveFault | None:
        """Draw the next kind of fault and start it; None if it could not start."""
        kind = self._deal("kind", tuple(self.faults)) if self.deal_kinds else self.rng.choice(self.faults)
        if self.leader_windows is not None:
            aimed = self._guarded(kind, lambda: self.leader_windows.begin(kind))
            if aimed is not False:
                return aimed
        return self._guarded(kind, lambda: self._begin(kind))

    def end(self, fault: ActiveFault) -> None:
        """Heal `fault` (nothing if it is already healed) and record it."""
        self._end(fault)

    def _guarded(self, what: str, action: Callable[[], ActiveFault | None]) -> ActiveFault | None:
        try:
            return action()
        except Exception as exc:  # a platform failure must not kill the schedule silently
            message = f"{what}: {type(exc).__name__}: {exc}"
            log.warning("nemesis action failed: %s", message)
            self.errors.append(message)
            self.record("nemesis-error", {"what": what, "error": str(exc)})
            return None

    # ----- faults ----------------------------------------------------------------------

    def _begin(self, kind: str) -> ActiveFault | None:
        if kind in WINDOW_KINDS and self.process_windows and self._window_due():
            return self._window_fault(kind)
        if kind == "partition":
            return self._partition()
        if kind == "kill":
            return self._kill()
        if kind == "pause":
            return self._pause()
        if kind == "packet":
            return self._packet()
        if kind == "reorder":
            return self._reorder()
        if kind == "slow-disk":
            return self._slow_disk()
        if kind == "member":
            return self._member()
        if kind in FILE_FAULTS:
            return self._file_fault(kind)
        if kind == "lose-unsynced":
            return self._lose_unsynced()
        if kind == "kill-all":
            return self._kill_all()
        if kind == "election":
            from nemesis.elections import election

            return election(self)
        if kind == "rollback":
            from nemesis.rollback import rollback

            return rollback(self)
        if kind == "restore-majority":
            from nemesis.restore_majority import restore_majority

            return restore_majority(self)
        if kind == "hold":
            return self._hold()
        raise ValueError(f"unknown fault {kind!r}")

    def count_aimed(self, name: str, landed: bool, why: str) -> str:
        """Count a strike of a fault aimed at a window (`election_counts[name]`) and return
        its evidence. A strike the run's end cut short is no miss: not counted, and said."""
        counts = self.election_counts.setdefault(name, {"aimed": 0, "landed": 0})
        if self._stop.is_set() and not landed:
            # The waits return at once when the run ends.
            return f"the run ended first, no strike ({why})"
        counts["aimed"] += 1
        counts["landed"] += int(landed)
        return why

    def _register(self, kind: str, nodes: list[str], description: str,
                  heal: Callable[[], dict[str, Any]], value: dict[str, Any], f: str) -> ActiveFault:
        with self._lock:
            fault = ActiveFault(self._next_id, kind, nodes, description, heal)
            self._next_id += 1
            self.active[fault.id] = fault
            self.counts[kind] = self.counts.get(kind, 0) + 1
        self.record(f, {"fault": kind, "id": fault.id, "phase": "start", "nodes": nodes,
                        "description": description, **value})
        return fault

    def _end(self, fault: ActiveFault) -> None:
        with self._lock:
            if self.active.pop(fault.id, None) is None:
                return
            self.healing[fault.id] = fault
        try:
            try:
                value = fault.heal()
            except Exception as exc:
                message = f"heal {fault.kind} {fault.description}: {type(exc).__name__}: {exc}"
                log.warning("nemesis heal failed: %s", message)
                self.errors.append(message)
                value = {"error": str(exc)}
            f = {"partition": "heal-partition", "kill": "restart", "pause": "resume",
                 "packet": "stop-packet", "reorder": "stop-reorder", "slow-disk": "restore-disk",
                 "member": "rejoin-member", "restore-majority": "heal-partition",
                 "hold": "release"}.get(fault.kind, "restart")
            self.record(f, {"fault": fault.kind, "id": fault.id, "phase": "end",
                            "nodes": fault.nodes, "description": fault.description, **value})
        finally:
            with self._lock:
                self.healing.pop(fault.id, None)

    def _window_due(self) -> bool:
        if self.windows_missing:
            return True
        self._window_turn += 1
        return self._window_turn % 2 == 0

    def _window_fault(self, kind: str) -> ActiveFault | None:
        if self.windows_missing:
            window = self.windows_missing[0]
        else:
            window = self.process_windows[(self._window_turn // 2) % len(self.process_windows)]
        found = self.targets.window_fault(window, kind)
        if found is None:
            self.record("nemesis-skip", {"fault": kind, "window": window,
                                         "description": f"{window} window: nothing to hurt now"})
            return None
        if window in self.windows_missing:
            self.windows_missing.remove(window)
            if not found["landed"]:
                self.windows_missing.append(window)  # try the others, then this one again
        if found["landed"]:
            self.windows_hit[window] = self.windows_hit.get(window, 0) + 1
        processes = list(found["processes"])
        f = {"kill": "kill", "pause": "pause", "partition": "start-partition"}[kind]
        value = {"window": window, "landed": found["landed"], "at": found.get("at"),
                 "process": processes[0], "detail": found["detail"]}
        if kind == "partition":
            value["shape"] = f"{window}-window"
        else:
            value["target"] = f"{window}-window"
        return self._register(kind, processes, f"{window} window: {found['detail']}",
                              found["heal"], value, f)

    def _leader(self) -> str | None:
        return self.platform.leader()

    def _leader_or_skip(self, fault: str, shape: str) -> str | None:
        """The leader, or None after a `nemesis-skip` record saying there was none."""
        leader = self._leader()
        if leader is None:
            self.record("nemesis-skip", {"fault": fault, "shape": shape,
                                         "description": f"{shape}: no leader now"})
        return leader

    def _random_links(self) -> list[tuple[str, str]]:
        """About half of the directed links, at least one (packet, reorder)."""
        all_links = [(a, b) for a in self.nodes for b in self.nodes if a != b]
        return [link for link in all_links if self.rng.random() < 0.5] or [self.rng.choice(all_links)]

    def _restarter(self, nodes: list[str]) -> Callable[[], dict[str, Any]]:
        """The heal that starts `nodes` again (those the nemesis stopped) and stops
        expecting them down."""
        def heal() -> dict[str, Any]:
            for node in nodes:
                if not self.platform.is_running(node):
                    self.platform.start_node(node)
                self.expected_down.discard(node)
            return {}
        return heal

    def healer(self, links: list[tuple[str, str]]) -> Callable[[], dict[str, Any]]:
        """The heal of a fault on these directed links (cut or lossy): each link healed."""
        def heal() -> dict[str, Any]:
            self.platform.heal_links(links)
            return {}
        return heal

    def cut(self, graph: Any) -> tuple[list[tuple[str, str]], Callable[[], dict[str, Any]]]:
        """Cut every link `graph` leaves out; returns the links and the heal that restores them."""
        links = partitions.cuts(graph)
        self.platform.cut_links(links)
        return links, self.healer(links)

    def _partition(self) -> ActiveFault | None:
        shape_name = self._deal("shape", self.shapes)
        if shape_name in (PROCESS_PARTITION, REPLY_LOST):
            return self._cut_process(shape_name)
        if shape_name == STALE_SNAPSHOT:
            return self._stale_snapshot()
        leader = self._leader() if shape_name == "isolate-leader" else None
        graph = partitions.shape(shape_name, self.nodes, self.rng, leader)
        links, heal = self.cut(graph)
        text = partitions.describe(graph)
        touched = sorted({a for a, _ in links} | {b for _, b in links})
        return self._register("partition", touched, f"{shape_name}: {text}", heal,
                              {"shape": shape_name, "graph": partitions.to_json(graph),
                               "leader": leader, "cut": [list(link) for link in links]},
                              "start-partition")

    def _stale_snapshot(self) -> ActiveFault | None:
        """The simulator's stale-snapshot shape (SimPlatform.aim_stale_snapshot; on real
        nodes nemesis/windows.py aims it by their Status): landed or not, the heal says."""
        leader = self._leader_or_skip("partition", STALE_SNAPSHOT)
        if leader is None:
            return None
        follower = self.rng.choice(sorted(n for n in self.nodes if n != leader))
        self.platform.aim_stale_snapshot(leader, follower)

        def heal() -> dict[str, Any]:
            aim = self.platform.end_stale_aim() or {}
            if aim.get("phase") != "done":
                why = f"no leader of the others applied past {aim.get('first_stale')}"
                return {"landed": False, "landed_evidence": why, "detail": f"missed: {why}"}
            landed = aim["first_stale"] <= aim["index"] <= aim["follower_last"]
            why = (f"{aim['successor']} snapshot at {aim['index']}, "
                   f"{'inside' if landed else 'past'} {follower}'s stale entries "
                   f"{aim['first_stale']}..{aim['follower_last']}, when the partition healed")
            return {"landed": landed, "landed_evidence": why, "detail": why,
                    "window": {"kind": STALE_SNAPSHOT, "leader": aim["successor"],
                               "follower": follower, "index": aim["index"],
                               "first_stale": aim["first_stale"],
                               "follower_last": aim["follower_last"]}}

        return self._register("partition", [leader, follower],
                              f"{STALE_SNAPSHOT}: {leader} and {follower} cut off together "
                              f"until a leader of the others has a snapshot past them", heal,
                              {"shape": STALE_SNAPSHOT, "leader": leader}, "start-partition")

    def _deal(self, deck: str, variants: tuple[str, ...]) -> str:
        """The next variant of a shuffled round in which each appears once, the first
        variant (the one aimed at the leader) leading every round."""
        cards = self._decks.get(deck)
        if not cards:
            rest = list(variants[1:])
            self.rng.shuffle(rest)
            cards = self._decks[deck] = [variants[0], *rest]
        return cards.pop(0)

    def _cut_process(self, shape: str) -> ActiveFault | None:
        name = self.targets.resolve("coordinator")
        if name is None:
            self.record("nemesis-skip", {"fault": "partition", "description":
                                         f"{shape}: no active coordinator now"})
            return None
        if shape == REPLY_LOST:  # over when it starts: one answer lost, then forwarding
            value = self.targets.lose_reply(name)
            name = value.get("process", name)  # the workload may land it on a successor
            return self._register("partition", [name], f"{REPLY_LOST}: {name}: {value['detail']}",
                                  dict, {"shape": REPLY_LOST, "process": name, **value},
                                  "start-partition")
        self.targets.cut_from_store(name)

        def heal() -> dict[str, Any]:
            self.targets.heal_from_store(name)
            return {}

        return self._register("partition", [name], f"{PROCESS_PARTITION}: {name} | {' '.join(self.nodes)}",
                              heal, {"shape": PROCESS_PARTITION, "process": name,
                                     "cut": [[name, n] for n in self.nodes]
                                     + [[n, name] for n in self.nodes]}, "start-partition")

    def _targets(self, choices: tuple[str, ...]) -> tuple[str, list[str]]:
        target = self._deal(f"target:{','.join(choices)}", choices)
        if target in self.roles:
            name = self.targets.resolve(target)
            if name is not None:
                return target, [name]
            target = f"random (no {target} now)"
        if target in ("leader", "isolated-leader"):
            leader = self._leader()
            if leader is not None:
                return target, [leader]
            target = "random (no leader known)"
        if target == "all":
            return target, list(self.nodes)
        if target == "minority":
            size = max(1, (len(self.nodes) - 1) // 2)
            return target, sorted(self.rng.sample(self.nodes, size))
        return target, [self.rng.choice(self.nodes)]

    def _kill(self) -> ActiveFault:
        target, nodes = self._targets(self.kill_targets)
        if not _is_node(nodes[0], self.nodes):
            self.targets.kill_target(nodes[0])
            name = nodes[0]

            def heal_process() -> dict[str, Any]:
                return {"replacement": self.targets.restart_target(name)}

            return self._register("kill", nodes, f"{target}: {name}", heal_process,
                                  {"target": target, "process": name}, "kill")
        self.expected_down.update(nodes)
        for node in nodes:
            self.platform.kill(node)
        return self._register("kill", nodes, f"{target}: {' '.join(nodes)}",
                              self._restarter(nodes), {"target": target}, "kill")

    def _pause(self) -> ActiveFault:
        target, nodes = self._targets(self.pause_targets)
        if target == "isolated-leader":
            return self._pause_isolated(nodes[0])
        process = not _is_node(nodes[0], self.nodes)
        for node in nodes:
            if process:
                self.targets.pause_target(node)
            else:
                self.platform.pause(node)

        def heal() -> dict[str, Any]:
            notes = []
            for node in nodes:
                if process:
                    notes.append(self.targets.resume_target(node))
                else:
                    self.platform.resume(node)
            notes = [n for n in notes if n]
            return {"detail": "; ".join(notes)} if notes else {}

        return self._register("pause", nodes, f"{target}: {' '.join(nodes)}", heal,
                              {"target": target}, "pause")

    def _pause_isolated(self, leader: str) -> ActiveFault:
        """The leader cut from its peers and frozen; at the end resumed, left cut off for
        ZOMBIE_S so it can answer what reaches it (clients still do), then healed."""
        graph = partitions.shape("isolate-leader", self.nodes, self.rng, leader)
        links, heal_links = self.cut(graph)
        self.platform.pause(leader)

        def heal() -> dict[str, Any]:
            self.platform.resume(leader)
            self._stop.wait(self.zombie_s)  # cut short when the run stops
            heal_links()
            return {"detail": f"resumed, then healed its links after {self.zombie_s:g} s"}

        return self._register("pause", [leader], f"isolated-leader: {leader} "
                              f"(cut from its peers, then frozen)", heal,
                              {"target": "isolated-leader",
                               "cut": [list(link) for link in links]}, "pause")

    def _hold(self) -> ActiveFault | None:
        """The leader's messages kept on the wire (sim only, see the module doc): all it
        sends (stale-leader) or those in flight now (overtaken); released at the heal."""
        shape = self._deal("hold-shape", HOLD_SHAPES)
        leader = self._leader_or_skip("hold", shape)
        if leader is None:
            return None
        if shape == "stale-leader":
            self.platform.hold_from(leader)
            detail = "everything it sends held"
        elif self.platform.name == "sim":
            held = self.platform.hold_in_flight(leader)
            detail = f"its {held} message(s) in flight held, and its next APPENDs with entries"
        else:  # a byte stream: the whole aimed strike happens now (LocalPlatform)
            self.expected_down.add(leader)  # crashed by the strike, until the heal
            try:
                held = self.platform.hold_in_flight(leader)
            except Exception:
                self.expected_down.discard(leader)
                raise
            landed = self.platform.overtaken_landed
            detail = (f"{held} byte(s) held, overtaken, delivered "
                      f"{'once a majority acknowledged newer entries' if landed else 'unaimed (no majority acknowledged newer entries in 3 s)'}"
                      f"; the leader crashed until the heal")

        self.platform.released_in_window = 0

        def heal() -> dict[str, Any]:
            at_heal = self.platform.release_held()
            if self.platform.name != "sim":  # the proxies count bytes, not messages
                if shape == "overtaken":
                    self.expected_down.discard(leader)  # the strike crashed it; restarted
                return {"released_bytes": at_heal,
                        "detail": f"{at_heal} held byte(s) delivered, in order, late"}
            early = self.platform.released_in_window
            return {"released": at_heal + early, "released_in_window": early,
                    "detail": f"{at_heal + early} held message(s) released, {early} of them "
                              f"the moment a follower held an uncommitted entry of a newer term"}

        return self._register("hold", [leader], f"{shape}: {leader} ({detail})", heal,
                              {"shape": shape}, "hold")

    def _packet(self) -> ActiveFault:
        probability = self.rng.choice(LOSS_PROBABILITIES)
        links = self._random_links()
        for src, dst in links:
            self.platform.set_loss(src, dst, probability)
        heal = self.healer(links)

        touched = sorted({a for a, _ in links} | {b for _, b in links})
        return self._register("packet", touched, f"{probability:.0%} loss on {len(links)} links",
                              heal, {"probability": probability,
                                     "links": [list(link) for link in links]}, "start-packet")

    def _reorder(self) -> ActiveFault:
        """Messages on a random set of directed links delivered late (overtaken by later
        ones) and some twice: the stale APPENDs, answers and vote grants Figure 2 guards
        against (a follower's commit past what an APPEND verified, a truncation without a
        conflict). The simulator moves its messages; on local the link proxies move the
        peer lanes' frames (nemesis/platforms/frame_reorder.py). The run's nodes send
        short APPENDs (REORDER_APPEND_ENTRIES)."""
        probability = self.rng.choice(REORDER_PROBABILITIES)
        links = self._random_links()
        for src, dst in links:
            self.platform.set_reorder(src, dst, probability)
        touched = sorted({a for a, _ in links} | {b for _, b in links})
        heal = self.healer(links)
        counts = getattr(self.platform, "reordered_frames", None)
        if counts is not None:  # local: say what the proxies did, frames being invisible
            before = counts()

            def heal_and_count() -> dict[str, Any]:
                value = heal()
                late, twice = (now - then for now, then in zip(counts(), before, strict=True))
                return {**value, "frames_late": late, "frames_twice": twice}
        return self._register("reorder", touched, f"{probability:.0%} of messages late or "
                              f"twice on {len(links)} links",
                              heal if counts is None else heal_and_count,
                              {"probability": probability,
                               "links": [list(link) for link in links]}, "start-reorder")

    def _slow_disk(self) -> ActiveFault:
        """Every node's fsyncs slowed by a random 0-150 ms each (the lazy disk), and the
        leader killed 2 s later (once the nodes persist off their event loop): the next
        leader's first entries are fsynced behind its followers' acknowledgements about
        half the time (thesis §10.2.1: a leader sends
        before its own fsync returns), the window where a leader may count its own
        unsynced copy, or an older term's entries, toward a commit. Healed by restoring
        the disks and restarting that leader."""
        low, high = SLOW_FSYNC_MS
        slowed: list[str] = []
        try:
            for node in self.nodes:
                self.platform.slow_disk(node, low, high)
                slowed.append(node)
        except Exception:
            for node in slowed:
                self.platform.slow_disk(node, 0.0, 0.0)
            raise
        self._stop.wait(self.slow_before_kill_s)
        leader = self._leader()
        killed = [leader] if leader is not None else []
        for node in killed:
            self.expected_down.add(node)
            self.platform.kill(node)

        restart = self._restarter(killed)

        def heal() -> dict[str, Any]:
            for node in self.nodes:
                self.platform.slow_disk(node, 0.0, 0.0)
            return restart()

        text = (f"every fsync {low:g}-{high:g} ms slower on {' '.join(self.nodes)}; "
                + (f"leader {leader} killed" if leader else "no leader known to kill"))
        return self._register("slow-disk", list(self.nodes), text, heal,
                              {"fsync_delay_ms": [low, high], "killed": killed}, "slow-disk")

    def _member(self) -> ActiveFault | None:
        shape = self._deal("member-shape", self.member_shapes)
        if shape != "remove-and-rejoin":
            return member_shapes.MemberShapes(self).begin(shape)
        target, (node,) = self._targets(MEMBER_TARGETS)
        voters, _ = self.platform.membership()
        if node not in voters or len(voters) < MIN_NODES["member"]:
            self.record("nemesis-skip", {"fault": "member", "description":
                                         f"{node} is not one of {len(voters)} voters "
                                         f"({', '.join(sorted(voters))})"})
            return None
        # Removing the leader makes it hand leadership over first (node.py); the change is
        # retried at the new leader.
        # Down from the remove on: a removed member may stop itself (etcd does), which is
        # not a crash.
        self.expected_down.add(node)
        try:
            self.platform.change_membership("remove", node)
        except Exception:
            self.expected_down.discard(node)
            raise
        self.platform.kill(node)
        self.platform.wipe(node)

        def heal() -> dict[str, Any]:
            if self.leader_windows is not None:  # a strike at the leader while it catches up
                return self.leader_windows.rejoin(node)
            self._rejoin(node)
            return {"rejoined": node}

        return self._register("member", [node], f"{target}: {node} removed and wiped", heal,
                              {"target": target, "voters": sorted(voters - {node})},
                              "remove-member")

    def _rejoin(self, node: str, step: Step | None = None) -> None:
        """Bring `node` back as a voter from whatever step it is at (not a member, a
        learner, stopped, running). `step(name, action)` runs (and records) each step."""
        do = step or (lambda name, action: action())
        voters, learners = self.platform.membership()
        if node not in voters and node not in learners:
            do("add", lambda: self.platform.change_membership("add", node))
        if not self.platform.is_running(node):
            do("start", lambda: self.platform.start_node(node))
        self.expected_down.discard(node)
        if node not in voters:
            do("promote", lambda: self.platform.change_membership(
                "promote", node, timeout_s=PROMOTE_TIMEOUT_S))

    # ----- disk faults -----------------------------------------------------------------

    def _file_fault(self, kind: str) -> ActiveFault:
        """Kill a minority, damage each one's files as `kind` says, keep them down for the
        interval; the heal restarts them on the damaged files."""
        size = self.rng.randint(1, max(1, (len(self.nodes) - 1) // 2))
        nodes = sorted(self.rng.sample(self.nodes, size))
        self.expected_down.update(nodes)
        self.platform.kill_nodes(nodes)
        try:
            found = self.platform.data_files(nodes)
            plan = {n: d for n in nodes if (d := self._plan_damage(kind, found.get(n, {})))}
            done = self.platform.damage_files(plan) if plan else {}
        except Exception:
            try:  # no fault may stay in place
                self._bring_back(kind, None, nodes)
            except Exception as exc:
                self._error(f"restart {' '.join(nodes)} after a failed {kind}", exc)
            raise
        damage = [{"node": n, **_damage_record(d)} for n in nodes for d in done.get(n, [])]
        text = "; ".join(_describe_damage(d) for d in damage) or "nothing to damage"
        untouched = [n for n in nodes if n not in plan]
        if untouched and damage:
            text += f"; {' '.join(untouched)} only killed (nothing to damage)"
        fault: ActiveFault | None = None

        def heal() -> dict[str, Any]:
            return self._bring_back(kind, fault.id if fault else None, nodes)

        fault = self._register(kind, nodes, f"minority: {text}", heal,
                               {"target": "minority", "damage": damage}, kind)
        return fault

    def _plan_damage(self, kind: str, files: dict[str, int]) -> list[dict]:
        """The damage to do to one node's files (`disk_damage` requests): [] if none fits."""
        rng = self.damage_rng
        if kind == "wipe-wal":
            return [{"kind": "remove-wal"}]
        wal_dir, snapshot_dir = _layout_dirs(self.platform)
        wal = sorted(f for f, size in files.items() if f.startswith(wal_dir) and size > 0)
        snapshots = sorted(f for f, size in files.items()
                           if snapshot_dir and f.startswith(snapshot_dir) and size > 0)
        if kind == "truncate":
            if not wal:
                return []
            name = self._pick_segment(wal)
            size = files[name]
            # From one byte (a torn last record) to most of the file, spread evenly over the
            # orders of magnitude between: a uniform cut would almost never be small.
            most = max(1, size * 9 // 10)
            cut = min(most, max(1, round(math.exp(rng.uniform(0.0, math.log(most))))))
            return [{"kind": "truncate", "file": name, "size": size - cut}]
        if snapshots and (not wal or rng.random() < 0.5):
            name = rng.choice(snapshots)
        elif wal:
            name = self._pick_segment(wal)
        else:
            return []
        size = files[name]
        flips = {(rng.randrange(size), rng.randrange(8))
                 for _ in range(rng.randint(1, MAX_FLIPPED_BITS))}
        return [{"kind": "flip", "file": name, "flips": sorted([o, b] for o, b in flips)}]

    def _pick_segment(self, wal: list[str]) -> str:
        """The newest segment mostly (where a crash leaves its damage), sometimes another."""
        if len(wal) == 1 or self.damage_rng.random() < TRUNCATE_NEWEST:
            return wal[-1]
        return self.damage_rng.choice(wal[:-1])

    def _lose_unsynced(self) -> ActiveFault:
        target, nodes = self._targets(POWER_TARGETS)
        self.expected_down.update(nodes)
        self.platform.power_loss(nodes)
        fault: ActiveFault | None = None

        def heal() -> dict[str, Any]:
            return self._bring_back("lose-unsynced", fault.id if fault else None, nodes)

        fault = self._register("lose-unsynced", nodes, f"{target}: {' '.join(nodes)} lost "
                               f"every unsynced write", heal, {"target": target}, "lose-unsynced")
        return fault

    def _kill_all(self) -> ActiveFault:
        nodes = list(self.nodes)
        self.expected_down.update(nodes)
        self.platform.kill_nodes(nodes)
        fault: ActiveFault | None = None

        def heal() -> dict[str, Any]:
            return self._bring_back("kill-all", fault.id if fault else None, nodes)

        fault = self._register("kill-all", nodes, f"all: {' '.join(nodes)}", heal,
                               {"target": "all"}, "kill-all")
        return fault

    def _bring_back(self, kind: str, fault_id: int | None, nodes: list[str]) -> dict[str, Any]:
        """Start `nodes` with their usual command line and wait until each answers or exits.
        One that refuses its data (exit 3) is an expected outcome: it rejoins as a new
        member, as the node's own message says (`_rejoin_refused`). Any other exit is an
        error the run reports."""
        for node in nodes:
            if not self.platform.is_running(node):
                self.platform.start_node(node)
        outcome: dict[str, Any] = {}
        for node in nodes:
            try:
                code = self.platform.wait_started(node, START_TIMEOUT_S)
            except Exception as exc:  # neither answered nor exited: say so, go on
                self._error(f"restart {node} after {kind}", exc)
                self.expected_down.discard(node)
                continue
            if code is None:
                self.expected_down.discard(node)
            elif _refused(self.platform, code, reason := self.platform.exit_reason(node)):
                self.record("node-refused", {
                    "fault": kind, "id": fault_id, "phase": "step", "nodes": [node],
                    "node": node, "exit_code": code, "reason": reason,
                    "description": f"{node} refused to start (exit {code}): {reason}"})
                if not self.platform.supports_membership():  # the simulator's nodes
                    self._error(f"rejoin {node}", PlatformError(
                        f"the {self.platform.name} platform cannot take a node back through "
                        f"membership changes; {node} stays down"))
                    continue
                self.refused.add(node)
                # From here on it is never started on these files again, even if the
                # rejoin of another refused node breaks off first (heal_everything).
                self.rejoining.add(node)
                outcome.setdefault("refused", []).append(node)
            else:
                self.expected_down.discard(node)
                self.crashes_noted.discard(node)  # a new exit, after the restart
                self.note_crash(node, code)
                self._error(f"restart {node} after {kind}", PlatformError(
                    f"{node} exited with code {code}: {self.platform.exit_reason(node)}"))
                outcome.setdefault("crashed", []).append(node)
        for node in outcome.get("refused", []):
            self._rejoin_refused(kind, fault_id, node)
            outcome.setdefault("rejoined", []).append(node)
        return outcome

    def note_crash(self, node: str, code: int) -> bool:
        """Record that `node` exited with `code` though nothing stopped it; True the first
        time for this exit."""
        if node in self.crashes_noted:
            return False
        self.crashes_noted.add(node)
        reason = self.platform.exit_reason(node)
        self.crashes.append({"node": node, "exit_code": code, "reason": reason})
        self.record("node-crashed", {
            "fault": "crash", "phase": "start", "nodes": [node], "node": node,
            "exit_code": code, "reason": reason,
            "description": f"{node} exited with code {code} on its own: {reason or '(no output)'}"})
        return True

    def look_for_crashes(self) -> list[tuple[str, int]]:
        """One look at every node (on Docker each is a call to the engine): a node found
        exited that the nemesis did not stop, and is not taking back, is recorded, once
        per exit. Returns the exits recorded by this look. The runners look every tick of
        the run and once after its last reads."""
        found = []
        for node in self.platform.node_ids:
            # Asked before and after the look: a look takes a round trip (SSH, the Docker
            # engine) during which a heal may restart a node the nemesis killed and stop
            # expecting it down, while the look still read the killed process's exit.
            expected = node in self.expected_down or node in self.rejoining
            code = None if expected else self.platform.exit_code(node)
            if code is None or node in self.expected_down or node in self.rejoining:
                self.crashes_noted.discard(node)
                continue
            if self.note_crash(node, code):
                found.append((node, code))
        return found

    def _rejoin_refused(self, kind: str, fault_id: int | None, node: str) -> None:
        """The procedure the node printed: member remove, empty its directory, member add
        (a learner), start it empty, member promote once it caught up; each step recorded.
        Resumes an interrupted procedure (`rejoining`) from where it stopped."""
        self.rejoining.add(node)

        def step(name: str, action: Callable[[], Any]) -> None:
            started = time.monotonic()
            value = {"fault": kind, "id": fault_id, "phase": "step", "nodes": [node],
                     "node": node, "step": name}
            try:
                action()
            except Exception as exc:
                self.record("rejoin-step", {**value, "error": str(exc), "description":
                                            f"{node}: {name} failed: {exc}"})
                raise
            seconds = round(time.monotonic() - started, 3)
            self.record("rejoin-step", {**value, "seconds": seconds,
                                        "description": f"{node}: {name} ({seconds:g} s)"})

        if node not in self._wiped:
            # Just after a restart of several nodes a leader may still be coming.
            voters, learners = self.platform.membership(timeout_s=30.0)
            if node in voters or node in learners:
                step("remove", lambda: self.platform.change_membership("remove", node))
            if self.platform.is_running(node):
                self.expected_down.add(node)
                self.platform.kill(node)
            step("wipe", lambda: self.platform.wipe(node))
            self._wiped.add(node)
        self._rejoin(node, step)
        self._wiped.discard(node)
        self.rejoining.discard(node)

    def _error(self, what: str, exc: Exception) -> None:
        message = f"{what}: {type(exc).__name__}: {exc}"
        log.warning("nemesis: %s", message)
        self.errors.append(message)
        self.record("nemesis-error", {"what": what, "error": str(exc)})

    # ----- end of run ------------------------------------------------------------------

    def _restore_membership(self) -> list[str]:
        """Every node a voter again, whatever a failed or interrupted rejoin left."""
        actions = []
        try:
            voters, _ = self.platform.membership(timeout_s=30.0)
        except Exception as exc:
            self.errors.append(f"read the membership: {exc}")
            return actions
        for node in self.nodes:
            if node in voters and node not in self.rejoining:
                continue
            try:
                if node in self.rejoining:  # a refused node's rejoin, interrupted
                    self._rejoin_refused("all", None, node)
                else:
                    self._rejoin(node)
                actions.append(f"rejoined {node}")
            except Exception as exc:
                self.errors.append(f"rejoin {node}: {exc}")
        return actions

    def describe_active(self) -> list[str]:
        """The faults now active, and those being healed (`healing partition(...)`): a
        fault is not over until its heal is done and recorded."""
        with self._lock:
            return ([f"{f.kind}({f.description})" for f in self.active.values()]
                    + [f"healing {f.kind}({f.description})" for f in self.healing.values()])

    def heal_everything(self) -> None:
        """Undo every active fault, then make sure: all links healed, every node resumed
        and running. Records what it did."""
        if self._thread is not None and self._thread.is_alive():
            # A heal still running (a rejoin waits for a promotion): let it finish rather
            # than start, wipe or re-admit the same node from two threads.
            self._stop.set()
            self._thread.join(END_JOIN_TIMEOUT_S)
            if self._thread.is_alive():
                self.errors.append(f"the nemesis thread was still busy {END_JOIN_TIMEOUT_S:g} s "
                                   f"after the run's end; healing beside it")
        with self._lock:
            active = list(self.active.values())
        for fault in active:
            self._end(fault)
        actions = []
        try:
            self.platform.heal_all()
        except Exception as exc:
            self.errors.append(f"heal all links: {exc}")
        disk = any(f in DISK_FAULTS for f in self.faults)
        stopped = []
        for node in self.nodes:
            if node in self.rejoining:
                continue  # left to _restore_membership: its data is refused or wiped
            try:
                if self.platform.is_running(node):
                    self.platform.resume(node)
                    self.expected_down.discard(node)
                elif disk:
                    stopped.append(node)
                else:
                    self.platform.start_node(node)
                    actions.append(f"started {node}")
                    self.expected_down.discard(node)
            except Exception as exc:
                self.errors.append(f"bring back {node}: {exc}")
        if stopped:  # after a disk fault a node may refuse its data: waited for and rejoined
            try:
                outcome = self._bring_back("all", None, stopped)
                actions.append(f"started {' '.join(stopped)}")
                actions += [f"rejoined {n}" for n in outcome.get("rejoined", [])]
            except Exception as exc:
                self.errors.append(f"bring back {' '.join(stopped)}: {exc}")
        if "member" in self.faults or self.refused or self.rejoining:
            actions += self._restore_membership()
        if self.targets is not None:
            try:
                actions += self.targets.heal_targets()
            except Exception as exc:
                self.errors.append(f"heal the workload's processes: {exc}")
        self.record("heal-all", {"fault": "all", "phase": "end", "nodes": self.nodes,
                                 "description": "; ".join(actions) or "all links healed, all nodes running"})


def _refused(platform: Any, code: int, reason: str) -> bool:
    """Whether the node refused its data (`System.refuses_data`: its exit code and, for a
    system whose refusal code is generic, its last log line)."""
    system = getattr(platform, "system", None)
    if system is None:  # a platform double without a system: the store's code
        return code == REFUSED_EXIT
    return system.refuses_data(code, reason)


def _layout_dirs(platform: Any) -> tuple[str, str | None]:
    """("wal folder/", "snapshot folder/" or None) of the system's data layout
    (nemesis/systems/base.py DataLayout); the store's for a platform without a system."""
    system = getattr(platform, "system", None)
    layout = system.data_layout() if system is not None else None
    if layout is None:
        return "wal/", "snapshots/"
    return layout.wal[0] + "/", (layout.snapshots[0] + "/" if layout.snapshots else None)


def _damage_record(done: dict[str, Any]) -> dict[str, Any]:
    """What the history keeps of one damage: the file, where (offset) and how much."""
    kind = done["kind"]
    if kind == "remove-wal":
        return {"kind": kind, "file": "wal/", "offset": 0, "bytes": done["bytes"],
                "removed": done["removed"]}
    record = {"kind": kind, "file": done["file"], "size_before": done["size_before"],
              "size_after": done["size_after"]}
    if kind == "truncate":
        return {**record, "offset": done["size_after"],
                "bytes": done["size_before"] - done["size_after"]}
    flips = [list(f) for f in done["flips"]]
    return {**record, "offset": flips[0][0], "bytes": len({o for o, _ in flips}),
            "bits": len(flips), "flips": flips}


def _describe_damage(d: dict[str, Any]) -> str:
    if d["kind"] == "remove-wal":
        return (f"{d['node']} wal/ removed ({len(d['removed'])} segments, "
                f"{d['bytes']:,} bytes)")
    if d["kind"] == "truncate":
        return (f"{d['node']} {d['file']} cut at byte {d['offset']:,} "
                f"({d['bytes']:,} of {d['size_before']:,} bytes gone)")
    return (f"{d['node']} {d['file']} {d['bits']} bit(s) flipped at "
            f"{', '.join(str(o) for o, _ in d['flips'])} (of {d['size_before']:,} bytes)")
