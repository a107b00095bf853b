"""Workload `kv`: Jepsen's independent compare-and-swap registers, on the store's versions.

`concurrency` client processes each run a loop: pick one of the active keys, then a
linearizable read (`get`), a write of a unique value (`put`), or a compare-and-swap (`put`
with `expected_version` = the version this process last saw for the key, 0 if none). Each
key takes at most `ops_per_key` operations, then a fresh key replaces it, so no single key's
history grows past what the checker searches quickly (Jepsen's `independent`).

Outcomes, as the client library reports them (system/kv/client.py):
- a result: `ok` (a compare that did not match is `ok` with `applied: false`);
- Unavailable / InvalidArgument: `fail` (certainly not applied);
- Indeterminate, or any unexpected error on a write: `info`, and the process retires;
- a read that could not be served is `fail` (a read changes nothing either way).

Process `p` runs on thread `p % concurrency`; its client prefers node `p % nodes` first, so
the load and the first contact are spread across nodes, as Jepsen binds clients to nodes.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from typing import Any

from histories.write import HistoryWriter
from system.kv.client import (
    CasMismatch,
    GetResult,
    Indeterminate,
    InvalidArgument,
    KVClient,
    NotFound,
    Unavailable,
    WriteResult,
)
from workloads.base import RunContext, Workload

OPS = ("get", "put", "cas")


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
                 rate: float) -> None:
        self.rng = random.Random(f"kv:{seed}:{thread_no}")
        self.pool = pool
        # Seconds between two invocations of this thread (0: as fast as it goes).
        self.period_s = concurrency / rate if rate > 0 else 0.0
        self.first_delay_s = self.rng.uniform(0, self.period_s)  # spreads the threads
        self._counter = itertools.count(1)

    def next_op(self, process: int) -> tuple[str, str, str]:
        """(key, op, value) of the next operation: op is get, put or cas; the value is
        unique in the run (process and a counter)."""
        key = self.pool.pick(self.rng)
        op = self.rng.choice(OPS)
        return key, op, f"{process}-{next(self._counter)}"


def expected_version(op: str, key: str, seen: dict[str, int]) -> int | None:
    """A cas expects the version this process last saw of the key (0 if none)."""
    return seen.get(key, 0) if op == "cas" else None


class KVWorkload(Workload):
    name = "kv"
    model = "versioned-kv"

    def __init__(self, *, concurrency: int, rate: float, op_timeout_s: float,
                 read_consistency: str = "linearizable", keys: int = 3,
                 ops_per_key: int = 300) -> None:
        super().__init__()
        if read_consistency not in ("linearizable", "stale"):
            raise ValueError(f"read consistency must be linearizable or stale, got {read_consistency!r}")
        self.concurrency = concurrency
        self.rate = rate
        self.op_timeout_s = op_timeout_s
        self.read_consistency = read_consistency
        self.pool = KeyPool(keys, ops_per_key)
        self.keys = keys
        self._threads: list[threading.Thread] = []
        self._next_process = concurrency  # ids for the final reads start above every client's
        self._process_lock = threading.Lock()
        self.harness_errors: list[str] = []

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "concurrency": self.concurrency, "rate": self.rate,
                "op_timeout_s": self.op_timeout_s, "read_consistency": self.read_consistency,
                "active_keys": self.keys, "ops_per_key": self.pool.ops_per_key}

    # ----- clients ---------------------------------------------------------------------

    def _client(self, ctx: RunContext, process: int) -> KVClient:
        nodes = list(ctx.addresses)
        home = process % len(nodes)
        ordered = {n: ctx.addresses[n] for n in nodes[home:] + nodes[:home]}
        # The client's own attempt timeout (short, doubling) gives up on a silent (paused,
        # cut) node well before the op's deadline and tries the next node, same request id.
        return KVClient(ordered, timeout_s=self.op_timeout_s, client_id=f"p{process}")

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
        plan = ClientPlan(ctx.seed, thread_no, self.pool, self.concurrency, self.rate)
        period = plan.period_s
        process = thread_no
        client = self._client(ctx, process)
        seen: dict[str, int] = {}  # key -> last version this process saw
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
                key, op, value = plan.next_op(process)
                retired = self._one(ctx.history, client, process, op, key, value, seen)
                if retired:
                    client.close()
                    process += self.concurrency
                    client = self._client(ctx, process)
                    seen.clear()
        finally:
            client.close()

    def _one(self, history: HistoryWriter, client: KVClient, process: int, op: str, key: str,
             value: str, seen: dict[str, int]) -> bool:
        """One operation, recorded; returns True when the process must retire (info).
        Reads go to the process's home node first (then wherever it points), as a Jepsen
        client bound to one node; writes go to the leader the client last found."""
        home = next(iter(client.node_addresses))
        if op == "get":
            i = history.invoke(process, "get", key, None, consistency=self.read_consistency)
            try:
                r = client.get(key, consistency=self.read_consistency, via=home)
            except NotFound as exc:
                seen[key] = 0
                history.complete(i, "ok", None, version=0, node=exc.node_id or None)
                self.counts.add("get", "ok")
                return False
            except (Unavailable, Indeterminate, InvalidArgument) as exc:
                history.complete(i, "fail", None, error=_error(exc))
                self.counts.add("get", "fail")
                return False
            except Exception as exc:  # a read changes nothing: certainly-not-applied is safe
                self.harness_errors.append(f"get: {type(exc).__name__}: {exc}")
                history.complete(i, "fail", None, error=f"{type(exc).__name__}: {exc}")
                self.counts.add("get", "fail")
                return False
            seen[key] = r.version
            history.complete(i, "ok", _text(r), version=r.version, node=r.node_id,
                             applied_index=r.applied_index)
            self.counts.add("get", "ok")
            return False
        expected = expected_version(op, key, seen)
        fields: dict[str, Any] = {}
        if expected is not None:
            fields["expected_version"] = expected
        rid = client.new_request_id()
        i = history.invoke(process, "put", key, value, request_id=rid, **fields)
        try:
            w: WriteResult = client.put(key, value.encode(), expected_version=expected,
                                        request_id=rid)
        except CasMismatch as exc:
            seen[key] = exc.current_version
            history.complete(i, "ok", value, version=exc.current_version, applied=False,
                             node=exc.node_id or None)
            self.counts.add(op, "ok")
            return False
        except (Unavailable, InvalidArgument) as exc:
            history.complete(i, "fail", value, error=_error(exc))
            self.counts.add(op, "fail")
            return False
        except Indeterminate as exc:
            history.complete(i, "info", value, error=_error(exc))
            self.counts.add(op, "info")
            return True
        except Exception as exc:  # unknown failure of a write: it may have applied
            self.harness_errors.append(f"put: {type(exc).__name__}: {exc}")
            history.complete(i, "info", value, error=f"{type(exc).__name__}: {exc}")
            self.counts.add(op, "info")
            return True
        seen[key] = w.version
        history.complete(i, "ok", value, version=w.version, applied=True, node=w.node_id,
                         term=w.term)
        self.counts.add(op, "ok")
        return False

    # ----- the end ---------------------------------------------------------------------

    def final_reads(self, ctx: RunContext, timeout_s: float) -> dict[str, Any]:
        """A linearizable read of every key the run touched, each retried (as new
        operations) until it succeeds or `timeout_s` runs out."""
        deadline = time.monotonic() + timeout_s
        process = self.concurrency * 1_000_000  # far above any retired client's id
        client = KVClient(ctx.addresses, timeout_s=self.op_timeout_s, client_id="final")
        read, failed = 0, []
        try:
            for key in list(self.pool.touched):
                while True:
                    i = ctx.history.invoke(process, "get", key, None, consistency="linearizable")
                    try:
                        r = client.get(key, consistency="linearizable")
                        ctx.history.complete(i, "ok", _text(r), version=r.version, node=r.node_id,
                                             applied_index=r.applied_index)
                        read += 1
                        break
                    except NotFound as exc:
                        ctx.history.complete(i, "ok", None, version=0, node=exc.node_id or None)
                        read += 1
                        break
                    except Exception as exc:
                        ctx.history.complete(i, "fail", None, error=_error(exc))
                        if time.monotonic() >= deadline:
                            failed.append(key)
                            break
        finally:
            client.close()
        return {"keys": len(self.pool.touched), "read": read, "unread": failed}


def _text(r: GetResult) -> str:
    return r.value.decode("utf-8", errors="replace")


def _error(exc: Exception) -> str:
    text = str(exc)
    return text if len(text) <= 300 else text[:297] + "..."
