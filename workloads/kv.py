"""Workload `kv`: Jepsen's independent compare-and-swap registers, on the store's versions.

`concurrency` client processes each run a loop: pick one of the active keys, then one
operation drawn from the mix (`--mix`, `parse_mix`; default `DEFAULT_MIX`):

- `get`: a read at the run's `--read-consistency` (linearizable unless told otherwise);
- `stale-get`: a read served without the ReadIndex barrier (checked for how stale it was,
  checker/staleness.py, not for linearizability: it promises no recency);
- `put`: an unconditional write of a unique value;
- `cas`: a put with an expected version; `delete`: an unconditional delete;
  `cas-delete`: a delete with an expected version;
- `replay`: one of this thread's earlier acknowledged writes (put, cas, delete or
  cas-delete, applied or refused on its version) sent again, same arguments, same request
  id: a store with idempotent request ids answers its first result and changes nothing
  (docs/kv.md). Recorded as f `replay` with `replay_of` (the original's invoke index);
  checker/replays.py compares the answers, and the linearizability model takes a replay
  as changing nothing, so a store that applied it again shows in the reads too. Offered
  only where the system has request ids (`System.idempotent_request_ids`); the target is
  drawn from the thread's last `REPLAY_CANDIDATES` acknowledged writes younger than
  `REPLAY_HORIZON_WRITES` writes of the run (the store forgets ids after 100,000 log
  entries), so old ones are replayed after the snapshots, restarts and leader changes a
  run brings. Its own draws (`kv-replay:` generator) leave every other draw of a seed as
  it was.

A conditional operation draws its version class (`VERSION_CLASSES`) from the version this
process last saw of the key (0 if none, or after it saw the key deleted): `right` (that
version), `stale` (older than it, still >= 1), `future` (above it), `absent` (0 on a key
seen to exist; a non-zero version on a key seen absent). The wrong classes are there on
purpose: a store that skips a version check shows it only when some request should have
been refused. Keys are reused after deletes (a key retires only after `ops_per_key`
operations), so re-creation at version 1 is exercised too.

Each key takes at most `ops_per_key` operations, then a fresh key replaces it, so no single
key's history grows past what the checker searches quickly (Jepsen's `independent`).

Outcomes, as the system's client reports them (nemesis/systems/base.py `KvClient`):
- a result: `ok` (a compare that did not match, `VersionMismatch`, is `ok` with
  `applied: false`);
- `Fail`: `fail` (certainly not applied);
- `Unknown`, or any unexpected error on a write: `info`, and the process retires;
- a read that could not be served is `fail` (a read changes nothing either way).

Process `p` runs on thread `p % concurrency`; its client prefers node `p % nodes` first, so
the load and the first contact are spread across nodes, as Jepsen binds clients to nodes.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

from histories.write import HistoryWriter
from nemesis.systems.base import Fail, KvClient, KvResult, System, Unknown, VersionMismatch
from workloads import replicas
from workloads.base import RunContext, Workload

OPS = ("get", "stale-get", "put", "cas", "delete", "cas-delete")
REPLAY = "replay"
MIX_KINDS = (*OPS, REPLAY)
REPLAY_CANDIDATES = 64  # a thread's acknowledged writes a replay may pick from
REPLAY_HORIZON_WRITES = 20_000  # well inside the store's 100,000-entry request-id window
CONDITIONAL = ("cas", "cas-delete")
READS = ("get", "stale-get")
# Every kind and every version class within a few dozen operations of any seed.
DEFAULT_MIX = {"get": 20, "stale-get": 10, "put": 15, "cas": 30, "delete": 10, "cas-delete": 15,
               "replay": 5}
VERSION_CLASSES = ("right", "stale", "future", "absent")
VERSION_WEIGHTS = (40, 20, 20, 20)
MAX_VERSION_OFFSET = 3  # how far a stale or future version is from the one seen


def parse_mix(text: str) -> dict[str, int]:
    """`get=30,put=20,...` as {kind: weight}; ValueError with one line saying what is wrong.
    Kinds left out weigh 0; at least one weight must be positive."""
    mix: dict[str, int] = {}
    for part in text.split(","):
        name, sep, weight = part.strip().partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"want KIND=WEIGHT pairs separated by commas, got {part.strip()!r}")
        if name not in MIX_KINDS:
            raise ValueError(f"unknown operation {name!r}; known: {', '.join(MIX_KINDS)}")
        if name in mix:
            raise ValueError(f"{name!r} is named twice")
        try:
            mix[name] = int(weight)
        except ValueError:
            raise ValueError(f"weight of {name} must be a whole number, got {weight.strip()!r}") from None
        if mix[name] < 0:
            raise ValueError(f"weight of {name} must be >= 0, got {mix[name]}")
    if not any(mix.get(kind) for kind in OPS):
        raise ValueError("at least one weight of an operation other than replay must be positive")
    return {kind: mix.get(kind, 0) for kind in MIX_KINDS}


def format_mix(mix: dict[str, int]) -> str:
    """The mix as `--mix` takes it (kinds with weight 0 left out)."""
    return ",".join(f"{kind}={mix[kind]}" for kind in MIX_KINDS if mix.get(kind))


@dataclass(frozen=True)
class PlannedOp:
    """One operation a client thread will invoke; `version_class` and `offset` only for
    conditional ones (the expected version itself depends on what the process saw)."""

    key: str
    kind: str
    value: str
    version_class: str | None = None
    offset: int = 0


@dataclass(frozen=True)
class Replayable:
    """A write as sent (a new one, then, once acknowledged, what a later `replay` sends
    again; the checker finds its answer in the history by `index`)."""

    index: int  # its invoke's index in the history (-1 until invoked)
    deleting: bool
    key: str
    value: str | None
    expected: int | None
    request_id: str
    write_no: int  # the run's write count when it was invoked


class ReplayBook:
    """One client thread's recent acknowledged writes (`note`), and the pick of one to
    replay (`pick`, by a planned draw). `clock` counts the run's writes, shared by every
    thread; a write older than `REPLAY_HORIZON_WRITES` of them is never picked."""

    def __init__(self, clock: itertools.count) -> None:
        self.clock = clock
        self._recent: list[Replayable] = []

    def tick(self) -> int:
        return next(self.clock)

    def note(self, write: Replayable) -> None:
        self._recent.append(write)
        del self._recent[:-REPLAY_CANDIDATES]

    def pick(self, draw: int, now: int) -> Replayable | None:
        fresh = [w for w in self._recent if now - w.write_no <= REPLAY_HORIZON_WRITES]
        return fresh[draw % len(fresh)] if fresh else None


class KeyPool:
    """The active keys; each retires after `ops_per_key` invocations (thread-safe)."""

    def __init__(self, active: int, ops_per_key: int) -> None:
        self.ops_per_key = ops_per_key
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._active = [self._new() for _ in range(active)]
        self._used: dict[str, int] = {}
        self.touched: list[str] = []

    def _new(self) -> str:
        return f"r{next(self._ids)}"

    def pick(self, rng: random.Random) -> str:
        with self._lock:
            slot = rng.randrange(len(self._active))
            key = self._active[slot]
            used = self._used.get(key, 0) + 1
            self._used[key] = used
            if used == 1:
                self.touched.append(key)
            if used >= self.ops_per_key:
                self._active[slot] = self._new()
            return key


class ClientPlan:
    """What one client thread does next: its pace and its operations, drawn from its own
    seeded generator. Pure decisions, shared by the real clients (threads on wall-clock
    time, below) and the simulator's (nemesis/sim_runner.py, in simulated time), so a seed
    means the same mix of operations on every platform."""

    def __init__(self, seed: int, thread_no: int, pool: KeyPool, concurrency: int,
                 rate: float, mix: dict[str, int] | None = None) -> None:
        self.rng = random.Random(f"kv:{seed}:{thread_no}")
        self.pool = pool
        # Seconds between two invocations of this thread (0: as fast as it goes).
        self.period_s = concurrency / rate if rate > 0 else 0.0
        self.first_delay_s = self.rng.uniform(0, self.period_s)  # spreads the threads
        self._counter = itertools.count(1)
        mix = mix or DEFAULT_MIX
        self._kinds = [kind for kind in OPS if mix.get(kind)]
        self._weights = [mix[kind] for kind in self._kinds]
        # Replays come from their own generator, after the operation is drawn, so turning
        # them on or off leaves every other draw of the seed where it was.
        self.replay_rng = random.Random(f"kv-replay:{seed}:{thread_no}")
        self.replay_p = mix.get(REPLAY, 0) / max(1, sum(mix.get(k, 0) for k in MIX_KINDS))

    def next_op(self, process: int) -> PlannedOp:
        """The next operation; a put's value is unique in the run (process and a counter).
        A `replay` names no key of its own: `offset` picks which earlier write."""
        planned = self._draw(process)
        if self.replay_p and self.replay_rng.random() < self.replay_p:
            return PlannedOp(planned.key, REPLAY, planned.value,
                             offset=self.replay_rng.randrange(1 << 30))
        return planned

    def _draw(self, process: int) -> PlannedOp:
        key = self.pool.pick(self.rng)
        kind = self.rng.choices(self._kinds, self._weights)[0]
        value = f"{process}-{next(self._counter)}"
        if kind not in CONDITIONAL:
            return PlannedOp(key, kind, value)
        version_class = self.rng.choices(VERSION_CLASSES, VERSION_WEIGHTS)[0]
        offset = self.rng.randint(1, MAX_VERSION_OFFSET)
        return PlannedOp(key, kind, value, version_class, offset)


def expected_version(op: PlannedOp, seen: dict[str, int]) -> tuple[int | None, str | None]:
    """(expected version, its class as sent) of `op`, from the version this process last
    saw of the key (0: none, or seen absent). A stale version needs one seen above 1 to
    be older than; below that the operation expects a future version instead."""
    if op.version_class is None:
        return None, None
    saw = seen.get(op.key, 0)
    version_class = op.version_class
    if version_class == "stale" and saw < 2:
        version_class = "future"
    if version_class == "right":
        return saw, version_class
    if version_class == "stale":
        return max(1, saw - op.offset), version_class
    if version_class == "future":
        return saw + op.offset, version_class
    return (0 if saw > 0 else op.offset), version_class


class KVWorkload(Workload):
    name = "kv"
    model = "versioned-kv"

    def __init__(self, *, concurrency: int, rate: float, op_timeout_s: float,
                 read_consistency: str = "linearizable", keys: int = 3,
                 ops_per_key: int = 300, mix: dict[str, int] | None = None,
                 client_unsafe: str | None = None,
                 unsafe_environ: dict[str, str] | None = None,
                 system: System | None = None) -> None:
        super().__init__()
        if system is None:  # the store, for callers that predate --system
            from nemesis.systems.store import StoreSystem

            system = StoreSystem()
        self.system = system
        if read_consistency not in ("linearizable", "stale"):
            raise ValueError(f"read consistency must be linearizable or stale, got {read_consistency!r}")
        self.concurrency = concurrency
        self.rate = rate
        self.op_timeout_s = op_timeout_s
        self.read_consistency = read_consistency
        self.mix = dict(mix or DEFAULT_MIX)
        if not system.idempotent_request_ids and self.mix.get(REPLAY):
            if mix is not None:
                raise ValueError(f"{system.name} has no request ids: a replayed write would "
                                 f"apply again; leave replay out of --mix")
            self.mix[REPLAY] = 0
        self.write_clock = itertools.count()  # the run's writes, for the replays' horizon
        # A client-library canary (`System.client_canaries`) every client runs; refused
        # unless `unsafe_environ` (default: ours) allows it.
        self.client_unsafe = client_unsafe
        self.client_canary = system.client_canary(client_unsafe, unsafe_environ)
        self.pool = KeyPool(keys, ops_per_key)
        self.keys = keys
        self._threads: list[threading.Thread] = []
        self._next_process = concurrency  # ids for the final reads start above every client's
        self._process_lock = threading.Lock()
        self.harness_errors: list[str] = []
        self.final_answers: dict[str, replicas.Answer] = {}  # key -> its final read's answer
        # ClientGate (workloads/base.py): while held, no client invokes an operation.
        self._gate = threading.Condition()
        self._held = False
        self._in_flight = 0

    def describe(self) -> dict[str, Any]:
        described = {**super().describe(), "concurrency": self.concurrency, "rate": self.rate,
                     "op_timeout_s": self.op_timeout_s, "read_consistency": self.read_consistency,
                     "mix": format_mix(self.mix), "active_keys": self.keys,
                     "ops_per_key": self.pool.ops_per_key}
        if self.client_unsafe:
            described["client_unsafe"] = self.client_unsafe
        return described

    def consistency_of(self, kind: str) -> str:
        """A `get` reads at the run's consistency; a `stale-get` always stale."""
        return "stale" if kind == "stale-get" else self.read_consistency

    # ----- the gate (ClientGate) ---------------------------------------------------------

    def hold_clients(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._gate:
            self._held = True
            while self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._gate.wait(left)
        return True

    def release_clients(self) -> None:
        with self._gate:
            self._held = False
            self._gate.notify_all()

    def _enter(self, ctx: RunContext) -> bool:
        """Wait while the clients are held; False if the run ends first."""
        with self._gate:
            while self._held:
                if ctx.stop.is_set() or time.monotonic() >= ctx.deadline:
                    return False
                self._gate.wait(0.1)
            self._in_flight += 1
        return True

    def _leave(self) -> None:
        with self._gate:
            self._in_flight -= 1
            if not self._in_flight:
                self._gate.notify_all()

    # ----- clients ---------------------------------------------------------------------

    def _client(self, ctx: RunContext, process: int) -> KvClient:
        nodes = list(ctx.addresses)
        home = process % len(nodes)
        ordered = {n: ctx.addresses[n] for n in nodes[home:] + nodes[:home]}
        # The store's client's own attempt timeout (short, doubling) gives up on a silent
        # (paused, cut) node well before the op's deadline and tries the next node.
        return self.system.kv_client(ordered, timeout_s=self.op_timeout_s,
                                     client_id=f"p{process}", tls=ctx.tls,
                                     unsafe=self.client_canary)

    def start(self, ctx: RunContext) -> None:
        for thread_no in range(self.concurrency):
            t = threading.Thread(target=self._loop, args=(ctx, thread_no), daemon=True,
                                 name=f"client-{thread_no}")
            t.start()
            self._threads.append(t)

    def join(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def _loop(self, ctx: RunContext, thread_no: int) -> None:
        plan = ClientPlan(ctx.seed, thread_no, self.pool, self.concurrency, self.rate, self.mix)
        period = plan.period_s
        process = thread_no
        client = self._client(ctx, process)
        seen: dict[str, int] = {}  # key -> last version this process saw
        book = ReplayBook(self.write_clock)
        next_at = time.monotonic() + plan.first_delay_s
        try:
            while not ctx.stop.is_set():
                now = time.monotonic()
                if now >= ctx.deadline:
                    return
                if next_at > now and ctx.stop.wait(min(next_at, ctx.deadline) - now):
                    return
                if time.monotonic() >= ctx.deadline:
                    return
                next_at = max(next_at + period, time.monotonic() - period)
                if not self._enter(ctx):
                    return
                try:
                    planned = plan.next_op(process)
                    retired = self._one(ctx.history, client, process, planned, seen, book)
                finally:
                    self._leave()
                if retired:
                    client.close()
                    process += self.concurrency
                    client = self._client(ctx, process)
                    seen.clear()
        finally:
            client.close()

    def _one(self, history: HistoryWriter, client: KvClient, process: int, planned: PlannedOp,
             seen: dict[str, int], book: ReplayBook) -> bool:
        """One operation, recorded; returns True when the process must retire (info).
        Reads go to the process's home node first (then wherever it points), as a Jepsen
        client bound to one node; writes go to the leader the client last found."""
        key, kind = planned.key, planned.kind
        if kind in READS:
            self._read(history, client, process, kind, key, seen)
            return False
        if kind == REPLAY:
            write = book.pick(planned.offset, book.tick())
            return write is not None and self._replay(history, client, process, write)
        write_no = book.tick()
        expected, version_class = expected_version(planned, seen)
        fields: dict[str, Any] = {}
        if expected is not None:
            fields["expected_version"] = expected
            fields["version_class"] = version_class
        deleting = kind in ("delete", "cas-delete")
        write = Replayable(-1, deleting, key, None if deleting else planned.value, expected,
                           client.new_request_id(), write_no)
        i, outcome, version = self._send(history, client, process, kind,
                                         "delete" if deleting else "put", write, fields)
        if outcome in ("applied", "refused"):
            # A delete reports the version it removed; the process now sees the key absent.
            seen[key] = 0 if deleting and outcome == "applied" else version  # type: ignore[assignment]
            book.note(dataclasses.replace(write, index=i))
        return outcome == "info"

    def _replay(self, history: HistoryWriter, client: KvClient, process: int,
                write: Replayable) -> bool:
        """Send `write` again with its request id (see the module doc), recorded as f
        `replay`; True when the process must retire (info). What this process has seen of
        the key is left alone: the answer is the first one's, not news."""
        fields: dict[str, Any] = {"replay_of": write.index,
                                  "replayed": "delete" if write.deleting else "put"}
        if write.expected is not None:
            fields["expected_version"] = write.expected
        return self._send(history, client, process, REPLAY, REPLAY, write, fields)[1] == "info"

    def _send(self, history: HistoryWriter, client: KvClient, process: int, kind: str, f: str,
              write: Replayable, fields: dict[str, Any]) -> tuple[int, str, int | None]:
        """Invoke `write` as `f`, send it and record its outcome: (invoke index, outcome,
        version answered). Outcome `applied` or `refused` (a compare that did not match,
        recorded ok with applied false), `fail` (certainly not applied) or `info` (it may
        have applied: the process must retire)."""
        i = history.invoke(process, f, write.key, write.value, request_id=write.request_id,
                           **fields)
        try:
            if write.deleting:
                w = client.delete(write.key, expected_version=write.expected,
                                  request_id=write.request_id)
            else:
                w = client.put(write.key, write.value.encode(),  # type: ignore[union-attr]
                               expected_version=write.expected, request_id=write.request_id)
        except VersionMismatch as exc:
            history.complete(i, "ok", write.value, version=exc.current_version, applied=False,
                             node=exc.node)
            self.counts.add(kind, "ok")
            return i, "refused", exc.current_version
        except Fail as exc:
            history.complete(i, "fail", write.value, error=_error(exc))
            self.counts.add(kind, "fail")
            return i, "fail", None
        except Unknown as exc:
            history.complete(i, "info", write.value, error=_error(exc))
            self.counts.add(kind, "info")
            return i, "info", None
        except Exception as exc:  # noqa: BLE001 - unknown failure of a write: it may have applied
            self.harness_errors.append(f"{kind}: {type(exc).__name__}: {exc}")
            history.complete(i, "info", write.value, error=f"{type(exc).__name__}: {exc}")
            self.counts.add(kind, "info")
            return i, "info", None
        history.complete(i, "ok", write.value, version=w.version, applied=True, node=w.node,
                         term=w.term)
        self.counts.add(kind, "ok")
        return i, "applied", w.version

    def _read(self, history: HistoryWriter, client: KvClient, process: int, kind: str,
              key: str, seen: dict[str, int]) -> None:
        consistency = self.consistency_of(kind)
        home = next(iter(client.node_addresses))
        i = history.invoke(process, "get", key, None, consistency=consistency)
        try:
            r = client.get(key, consistency=consistency, via=home)
        except (Fail, Unknown) as exc:
            history.complete(i, "fail", None, error=_error(exc))
            self.counts.add(kind, "fail")
            return
        except Exception as exc:  # a read changes nothing: certainly-not-applied is safe
            self.harness_errors.append(f"get: {type(exc).__name__}: {exc}")
            history.complete(i, "fail", None, error=f"{type(exc).__name__}: {exc}")
            self.counts.add(kind, "fail")
            return
        seen[key] = r.version
        history.complete(i, "ok", _text(r), version=r.version, node=r.node,
                         **_applied(r))
        self.counts.add(kind, "ok")

    # ----- the end ---------------------------------------------------------------------

    def final_reads(self, ctx: RunContext, timeout_s: float) -> dict[str, Any]:
        """A linearizable read of every key the run touched, each retried (as new
        operations) until it succeeds. `timeout_s` is how long the reads may go without a
        success, not a budget for them all: on a loaded machine a cluster that serves one
        read in several seconds still gets every key read (a shared 30 s left one key of
        39 unread, and the run unknown). The whole is capped at `timeout_s` plus two op
        timeouts per key; keys left when the cap passes are not tried. The answers are
        the references of the replica reads (`replica_reads`)."""
        keys = list(self.pool.touched)
        start = time.monotonic()
        cap = start + timeout_s + 2 * self.op_timeout_s * len(keys)
        deadline = start + timeout_s
        client = self.system.kv_client(ctx.addresses, timeout_s=self.op_timeout_s,
                                       client_id="final", tls=ctx.tls)
        read, failed = 0, []
        self.final_answers = {}
        try:
            for key in keys:
                if time.monotonic() >= cap:
                    failed.append(key)
                    continue
                answer = self._final_read(ctx, client, key, min(deadline, cap))
                if answer is None:
                    failed.append(key)
                else:
                    self.final_answers[key] = answer
                    read += 1
                    deadline = time.monotonic() + timeout_s
        finally:
            client.close()
        return {"keys": len(self.pool.touched), "read": read, "unread": failed}

    def final_process(self) -> int:
        return self.concurrency * 1_000_000  # far above any retired client's id

    def _final_read(self, ctx: RunContext, client: KvClient, key: str,
                    deadline: float) -> replicas.Answer | None:
        """One key's linearizable read, retried until it succeeds or `deadline`."""
        process = self.final_process()
        while True:
            i = ctx.history.invoke(process, "get", key, None, consistency="linearizable",
                                   phase=replicas.PHASE_FINAL)
            try:
                r = client.get(key, consistency="linearizable")
            except Exception as exc:
                ctx.history.complete(i, "fail", None, error=_error(exc))
                if time.monotonic() >= deadline:
                    return None
                continue
            ctx.history.complete(i, "ok", _text(r), version=r.version, node=r.node, **_applied(r))
            return replicas.Answer(_text(r), r.version, r.applied_index)

    def replica_reads(self, ctx: RunContext, skipped: dict[str, str], timeout_s: float,
                      say=print) -> dict[str, Any]:  # noqa: ANN001 - a print-like callable
        """After `final_reads`: every key it read, read from each node but `skipped`'s
        (node -> why) on its own
        (a client given only that node's address, stale consistency), repeated until the
        node's answers match the final reads or its time runs out (workloads/replicas.py).
        Recorded as operations, so checker/replicas.py decides from the history."""
        rounds = replicas.ReplicaRounds(list(self.pool.touched), self.final_answers)
        for node, why in skipped.items():
            rounds.skip(node, why)
        if not rounds.keys:
            return rounds.summary()
        deadline = time.monotonic() + timeout_s
        reference = self.system.kv_client(ctx.addresses, timeout_s=self.op_timeout_s,
                                          client_id="final-refresh", tls=ctx.tls)
        try:
            for number, node in enumerate(ctx.addresses):
                if node in skipped:
                    continue
                if time.monotonic() >= deadline:
                    rounds.skip(node, "the replica reads' time ran out before its turn")
                    continue
                self._replica_rounds(ctx, rounds, node, number, reference,
                                     min(deadline, time.monotonic() + replicas.NODE_TIMEOUT_S))
                say(rounds.line(node))
        finally:
            reference.close()
        return rounds.summary()

    def _replica_rounds(self, ctx: RunContext, rounds: replicas.ReplicaRounds, node: str,
                        number: int, reference: KvClient, deadline: float) -> None:
        process = self.final_process() + replicas.PROCESS_OFFSET + number
        progress = rounds.start(node)
        # Each read gets a short timeout: a silent node costs one per round, not per key.
        client = self.system.kv_client({node: ctx.addresses[node]},
                                       timeout_s=min(self.op_timeout_s, 2.0),
                                       client_id=f"replica-{node}", tls=ctx.tls)
        try:
            while progress.pending and progress.rounds < replicas.MAX_ROUNDS:
                if time.monotonic() >= deadline:
                    break
                progress.rounds += 1
                for key in list(progress.pending):
                    i = ctx.history.invoke(process, "get", key, None, consistency="stale",
                                           phase=replicas.PHASE_REPLICA, target=node)
                    try:
                        r = client.get(key, consistency="stale")
                    except Exception as exc:
                        ctx.history.complete(i, "fail", None, error=_error(exc))
                        progress.failed += 1
                        progress.last_error = _error(exc)
                        break  # the node is not answering: try again next round
                    ctx.history.complete(i, "ok", _text(r), version=r.version, node=r.node,
                                         **_applied(r))
                    answer = replicas.Answer(_text(r), r.version, r.applied_index)
                    if rounds.judge(node, key, answer) == "differs":
                        # A write that landed after the final read moves the reference;
                        # a diverged node stays different from the fresh one too.
                        fresh = self._final_read(ctx, reference, key,
                                                 min(deadline, time.monotonic() + 5.0))
                        if fresh is not None:
                            rounds.refresh(key, fresh)
                if progress.pending:
                    pause = min(replicas.round_pause(progress.rounds),
                                max(0.0, deadline - time.monotonic()))
                    time.sleep(pause)  # (ctx.stop is set by now: the workload has ended)
        finally:
            client.close()


def _text(r: KvResult) -> str | None:
    """The value read; None for an absent key (version 0)."""
    if r.value is None:
        return None
    return r.value.decode("utf-8", errors="replace")


def _applied(r: KvResult) -> dict[str, int]:
    """The read's applied index, for the staleness checker, where the system tells."""
    return {} if r.applied_index is None else {"applied_index": r.applied_index}


def _error(exc: Exception) -> str:
    text = str(exc)
    return text if len(text) <= 300 else text[:297] + "..."
