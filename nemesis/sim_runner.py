"""`python -m nemesis run --platform sim`: the main job against the simulator, in simulated time.

The real runner (nemesis/runner.py) is an interpreter that owns threads and the wall clock:
client threads, a nemesis thread, sleeps. This one is the same job with one thread and a
simulated clock, so the same seed gives the same history byte for byte:

    SimPlatform built from the seed -> ticks until a leader serves
    -> each tick: the clients, then the platform advances one tick; a tick in which the
       nemesis begins or ends a fault delivers a seeded number of messages first and
       lands the fault there, mid-tick, with requests in flight
    -> at the deadline: open operations time out, heal everything, final reads
    -> the same run folder (test.json, history.jsonl with nemesis records, nemesis.jsonl,
       nodes/, results.json), the same checkers and the same report

What is shared with the real platforms, unchanged: the workload's decisions
(`workloads.kv.ClientPlan`: pace, key, operation, value, compare-and-swap's expected
version), the fault schedule and vocabulary (`nemesis.faults.Nemesis`: kinds, shapes,
targets dealt from the same seeded decks), the history writer, the checkers
(`nemesis.check`) and the report. What differs is only the interpreter: a client here
talks to a node through the simulator (`Simulation.invoke/submit`), and its patience (a
0.5 s attempt timeout, then the next node; the operation's deadline `--op-timeout`) runs
on simulated time.

What it must never do: read a clock or use unseeded randomness between the seed and the
history (test.json and results.json may carry the wall-clock time of the run; the history
and nemesis.jsonl carry simulated time only).
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from histories.write import HistoryWriter
from nemesis import rollback, safety_reports
from nemesis.faults import REORDER_APPEND_ENTRIES, ActiveFault, Nemesis
from nemesis.platforms.base import ClusterConfig
from nemesis.platforms.sim import TICK_S, SimPlatform
from nemesis.store import write_json
from system.sim.clients import AttemptState, ClientOp, OpStatus
from system.sim.history import Function
from workloads import replicas
from workloads.kv import (
    READS,
    REPLAY,
    ClientPlan,
    KeyPool,
    KVWorkload,
    PlannedOp,
    Replayable,
    ReplayBook,
    expected_version,
)

log = logging.getLogger("nemesis")

LEADER_TIMEOUT_S = 60.0  # simulated: the first election
RECOVERY_TIMEOUT_S = 30.0  # simulated: a leader again after the heal
FINAL_READ_TIMEOUT_S = 30.0
REPLICA_READ_TIMEOUT_S = 60.0  # simulated: every node's turn of the replica reads
ATTEMPT_TIMEOUT_S = 0.5  # a silent node (paused, cut off) is given up for the next one
RETRY_BACKOFF_S = 0.04  # after a refusal, before the next attempt
# A fault begins or ends after up to this many of its tick's deliveries (drawn from the
# seed). At a tick boundary every request has been delivered and answered, so a fault
# there never meets a write in flight -- the window that request ids, ReadIndex's quorum
# round and check-quorum exist for, and where real faults land (a kill or a pause mid-RPC).
MID_TICK_DELIVERIES = 8
# And it waits up to this long (simulated) for a tick with a client's write in flight, so
# it lands on one: Jepsen's nemesis aims at the moments that matter in the same spirit.
AIM_WAIT_S = 0.5


@dataclass
class _Client:
    """One client thread of the workload, in simulated time."""

    thread_no: int
    plan: ClientPlan
    process: int
    next_at_s: float
    seen: dict[str, int] = field(default_factory=dict)  # key -> last version seen
    op: ClientOp | None = None
    kind: str = ""  # the mix's kind (get, stale-get, put, cas, delete, cas-delete)
    invoke_index: int = -1  # the invoke's index in the history
    started_s: float = 0.0
    retry_at_s: float = 0.0
    leader_hint: str | None = None
    book: ReplayBook | None = None  # its acknowledged writes, for `replay`
    write_no: int = 0  # the run's write count when its write in flight was invoked
    expected: int | None = None  # that write's expected version


class SimClients:
    """The kv workload's clients driven by the simulator; records into the run's history
    exactly what the real clients record (workloads/kv.py)."""

    def __init__(self, workload: KVWorkload, platform: SimPlatform, history: HistoryWriter,
                 seed: int) -> None:
        self.workload = workload
        self.platform = platform
        self.sim = platform.sim
        self.history = history
        self.pool: KeyPool = workload.pool
        self.clients = [
            _Client(t, plan := ClientPlan(seed, t, self.pool, workload.concurrency,
                                           workload.rate, workload.mix), process=t,
                    next_at_s=plan.first_delay_s, book=ReplayBook(workload.write_clock))
            for t in range(workload.concurrency)
        ]
        # A client-library canary runs in these clients, as in the real ones.
        self.canary = workload.client_canary

    # ----- the loop's two moves ------------------------------------------------------------

    def invoke_due(self, now_s: float, deadline_s: float) -> None:
        """Idle clients whose time has come start their next operation (none while the
        platform holds the clients: the restore-majority fault's quiet window)."""
        for client in self.clients if not self.platform.clients_held else ():
            if client.op is not None or now_s >= deadline_s or now_s < client.next_at_s:
                continue
            period = client.plan.period_s
            client.next_at_s = max(client.next_at_s + period, now_s - period)
            self._start(client, client.plan.next_op(client.process), now_s)
        self.collect(now_s)

    def collect(self, now_s: float) -> None:
        """Record finished operations; retry or time out the others."""
        for client in self.clients:
            op = client.op
            if op is None:
                continue
            if op.done:
                self._record(client, op)
                continue
            if now_s - client.started_s >= self.workload.op_timeout_s:
                self.sim.give_up(op, f"no answer within {self.workload.op_timeout_s:g} s")
                self._record(client, op)
                continue
            last = op.attempts[-1]
            if last.state is AttemptState.WAITING:
                if now_s - client.started_s >= ATTEMPT_TIMEOUT_S * len(op.attempts):
                    self.sim.time_out(op, "attempt timed out")
                    client.leader_hint = None
                    client.retry_at_s = now_s
                continue
            if last.leader_hint is not None:
                client.leader_hint = last.leader_hint
            elif last.state is not AttemptState.ANSWERED:
                client.leader_hint = None
            if client.retry_at_s == 0.0:
                client.retry_at_s = now_s + RETRY_BACKOFF_S
            if now_s >= client.retry_at_s:
                client.retry_at_s = 0.0
                if self.canary is not None and op.f is not Function.GET and op.maybe_applied():
                    fresh = f"{op.request_id}~{len(op.attempts)}"
                    op.request_id = self.canary.retry_request_id(lambda f=fresh: f,
                                                                 op.request_id)
                self.platform.submit(op, self._next_node(client, op))
                if op.done:
                    self._record(client, op)

    def op_in_flight(self) -> bool:
        """Whether some client's operation is open."""
        return any(c.op is not None for c in self.clients)

    def write_in_flight(self) -> bool:
        """Whether some client's write has been sent and not yet answered."""
        return any(c.op is not None and not c.op.done and c.op.f is not Function.GET
                   for c in self.clients)

    def stop(self, now_s: float) -> None:
        """The run's end: every open operation gives up (info if it may have applied)."""
        for client in self.clients:
            if client.op is not None and not client.op.done:
                self.sim.give_up(client.op, "run ended with the operation in flight")
        self.collect(now_s)

    # ----- one operation ---------------------------------------------------------------------

    def _start(self, client: _Client, planned: PlannedOp, now_s: float) -> None:
        process, key, kind = client.process, planned.key, planned.kind
        assert client.book is not None
        if kind == REPLAY:
            write = client.book.pick(planned.offset, client.book.tick())
            if write is None:
                return  # nothing acknowledged yet to send again
            f = Function.DELETE if write.deleting else (
                Function.CAS if write.expected is not None else Function.PUT)
            client.op = self.sim.invoke(f, write.key, write.value, write.expected,
                                        process=process, request_id=write.request_id,
                                        retry_on_refusal=True)
            fields: dict[str, Any] = {"replay_of": write.index,
                                      "replayed": "delete" if write.deleting else "put"}
            if write.expected is not None:
                fields["expected_version"] = write.expected
            client.invoke_index = self.history.invoke(process, REPLAY, write.key, write.value,
                                                      request_id=write.request_id, **fields)
        elif kind in READS:
            consistency = self.workload.consistency_of(kind)
            client.invoke_index = self.history.invoke(process, "get", key, None,
                                                      consistency=consistency)
            client.op = self.sim.invoke(Function.GET, key, process=process,
                                        stale=consistency == "stale", retry_on_refusal=True)
        else:
            expected, version_class = expected_version(planned, client.seen)
            fields: dict[str, Any] = {}
            if expected is not None:
                fields["expected_version"] = expected
                fields["version_class"] = version_class
            deleting = kind in ("delete", "cas-delete")
            value = None if deleting else planned.value
            if deleting:
                f = Function.DELETE
            else:
                f = Function.CAS if expected is not None else Function.PUT
            client.write_no, client.expected = client.book.tick(), expected
            client.op = self.sim.invoke(f, key, value, expected, process=process,
                                        request_id=f"p{process}-{planned.value}",
                                        retry_on_refusal=True)
            client.invoke_index = self.history.invoke(process, f.value if deleting else "put",
                                                      key, value,
                                                      request_id=client.op.request_id, **fields)
        client.kind, client.started_s, client.retry_at_s = kind, now_s, 0.0
        self.platform.submit(client.op, self._home(client) if kind in READS
                        else client.leader_hint or self._home(client))
        if client.op.done:
            self._record(client, client.op)

    def _home(self, client: _Client) -> str:
        nodes = self.platform.node_ids
        return nodes[client.process % len(nodes)]

    def _next_node(self, client: _Client, op: ClientOp) -> str:
        """The leader a refusal named, else the next node after the last one tried."""
        if client.leader_hint is not None:
            return client.leader_hint
        nodes = self.platform.node_ids
        last = nodes.index(op.attempts[-1].node)
        return nodes[(last + 1) % len(nodes)]

    def _record(self, client: _Client, op: ClientOp) -> None:
        """The completion, as workloads/kv.py records it for the same outcome."""
        history, index, kind = self.history, client.invoke_index, client.kind
        counts = self.workload.counts
        client.op = None
        if op.f is Function.GET:
            if op.status is OpStatus.OK:
                client.seen[op.key] = op.result_version or 0
                history.complete(index, "ok", op.result_value, version=op.result_version,
                                 node=op.answered_by)
                counts.add(kind, "ok")
            else:  # a read changes nothing: not served is certainly not applied
                history.complete(index, "fail", None, error=op.error or "not served")
                counts.add(kind, "fail")
            return
        replay = kind == REPLAY
        if not replay and client.book is not None and (
                op.status is OpStatus.OK or op.applied is False):
            client.book.note(Replayable(index, op.f is Function.DELETE, op.key, op.value,
                                        client.expected, op.request_id, client.write_no))
        if replay and op.status is OpStatus.OK:  # the first answer again: nothing new seen
            history.complete(index, "ok", op.value, version=op.result_version, applied=True,
                             node=op.answered_by)
            counts.add(kind, "ok")
        elif replay and op.applied is False:
            history.complete(index, "ok", op.value, version=op.result_version, applied=False,
                             node=op.answered_by)
            counts.add(kind, "ok")
        elif op.status is OpStatus.OK:
            # A delete reports the version it removed; the process now sees the key absent.
            client.seen[op.key] = 0 if op.f is Function.DELETE else op.result_version or 0
            if op.answered_by:
                client.leader_hint = op.answered_by
            term = next((a.term for a in op.attempts if a.state is AttemptState.ANSWERED), None)
            history.complete(index, "ok", op.value, version=op.result_version, applied=True,
                             node=op.answered_by, term=term)
            counts.add(kind, "ok")
        elif op.applied is False:  # a compare that did not match: a result, recorded ok
            client.seen[op.key] = op.result_version or 0
            history.complete(index, "ok", op.value, version=op.result_version, applied=False,
                             node=op.answered_by)
            counts.add(kind, "ok")
        elif op.status is OpStatus.FAIL:
            history.complete(index, "fail", op.value, error=op.error or "refused")
            counts.add(kind, "fail")
        else:  # unknown outcome: the process retires, as Jepsen's do
            history.complete(index, "info", op.value, error=op.error or "unknown")
            counts.add(kind, "info")
            client.process += self.workload.concurrency
            client.seen.clear()
            client.leader_hint = None

    # ----- the end ---------------------------------------------------------------------------

    def final_reads(self, run: SimRun, timeout_s: float) -> dict[str, Any]:
        """A linearizable read of every key the run touched, each retried (as new
        operations) until it succeeds or `timeout_s` of simulated time runs out; the
        answers are the replica reads' references, as in workloads/kv.py."""
        deadline = self.platform.now_s() + timeout_s
        read, failed = 0, []
        self.final_answers: dict[str, replicas.Answer] = {}
        for key in list(self.pool.touched):
            answer = self._final_read(run, key, deadline)
            if answer is None:
                failed.append(key)
            else:
                self.final_answers[key] = answer
                read += 1
        return {"keys": len(self.pool.touched), "read": read, "unread": failed}

    def _final_read(self, run: SimRun, key: str, deadline: float) -> replicas.Answer | None:
        process = self.workload.final_process()
        while True:
            index = self.history.invoke(process, "get", key, None, consistency="linearizable",
                                        phase=replicas.PHASE_FINAL)
            op = self.sim.invoke(Function.GET, key, process=process, retry_on_refusal=False)
            self.platform.submit(op, self.platform.leader() or self.platform.node_ids[0])
            run.advance_until(lambda op=op: op.done, ATTEMPT_TIMEOUT_S * 4)
            if not op.done:
                self.sim.give_up(op, "final read timed out")
            if op.status is OpStatus.OK:
                self.history.complete(index, "ok", op.result_value, version=op.result_version,
                                      node=op.answered_by, **_applied(op))
                return replicas.Answer(op.result_value, op.result_version or 0,
                                       op.result_applied_index)
            self.history.complete(index, "fail", None, error=op.error or "not served")
            if self.platform.now_s() >= deadline:
                return None
            run.advance_until(lambda: False, RETRY_BACKOFF_S)

    def replica_reads(self, run: SimRun, timeout_s: float, out) -> dict[str, Any]:  # noqa: ANN001
        """workloads/kv.py's replica reads in simulated time: every key the final reads
        read, read from each node on its own (stale, that node only), repeated until its
        answers match or its time runs out; a node that is down is skipped."""
        from nemesis.runner import print_line

        rounds = replicas.ReplicaRounds(list(self.pool.touched), self.final_answers)
        nodes = self.platform.node_ids
        for node in nodes:
            if not self.platform.is_running(node):
                rounds.skip(node, "down at the end")
        if not rounds.keys:
            return rounds.summary()
        deadline = self.platform.now_s() + timeout_s
        for number, node in enumerate(nodes):
            if node in rounds.skipped:
                continue
            if self.platform.now_s() >= deadline:
                rounds.skip(node, "the replica reads' time ran out before its turn")
                continue
            self._replica_rounds(run, rounds, node, number,
                                 min(deadline, self.platform.now_s() + replicas.NODE_TIMEOUT_S))
            print_line(out, rounds.line(node))
        return rounds.summary()

    def _replica_rounds(self, run: SimRun, rounds: replicas.ReplicaRounds, node: str,
                        number: int, deadline: float) -> None:
        process = self.workload.final_process() + replicas.PROCESS_OFFSET + number
        progress = rounds.start(node)
        while progress.pending and progress.rounds < replicas.MAX_ROUNDS:
            if self.platform.now_s() >= deadline:
                return
            progress.rounds += 1
            for key in list(progress.pending):
                index = self.history.invoke(process, "get", key, None, consistency="stale",
                                            phase=replicas.PHASE_REPLICA, target=node)
                op = self.sim.invoke(Function.GET, key, process=process, stale=True,
                                     retry_on_refusal=False)
                self.platform.submit(op, node)
                run.advance_until(lambda op=op: op.done, ATTEMPT_TIMEOUT_S * 4)
                if not op.done:
                    self.sim.give_up(op, "replica read timed out")
                if op.status is not OpStatus.OK:
                    self.history.complete(index, "fail", None, error=op.error or "not served")
                    progress.failed += 1
                    progress.last_error = op.error or "not served"
                    break  # the node is not answering: next round
                self.history.complete(index, "ok", op.result_value, version=op.result_version,
                                      node=op.answered_by, **_applied(op))
                answer = replicas.Answer(op.result_value, op.result_version or 0,
                                         op.result_applied_index)
                if rounds.judge(node, key, answer) == "differs":
                    fresh = self._final_read(run, key, min(deadline, self.platform.now_s() + 5.0))
                    if fresh is not None:
                        rounds.refresh(key, fresh)
            if progress.pending:
                run.advance_until(lambda: False, min(replicas.round_pause(progress.rounds),
                                                     max(0.0, deadline - self.platform.now_s())))


def _applied(op: ClientOp) -> dict[str, int]:
    """A read's applied index, where the simulator told it."""
    return {} if op.result_applied_index is None else {"applied_index": op.result_applied_index}


class SimRun:
    """The run's simulated clock, its fault schedule and its clients, stepped together."""

    def __init__(self, platform: SimPlatform, nemesis: Nemesis, clients: SimClients,
                 interval_s: float, *, seed: int) -> None:
        self.platform = platform
        self.nemesis = nemesis
        self.clients = clients
        self.interval_s = interval_s
        self.fault: ActiveFault | None = None
        self.fault_ends_s = 0.0
        self.next_fault_s = interval_s  # quiet first, as nemesis.Nemesis._run
        self.split_rng = random.Random(f"sim-run:{seed}:mid-tick")
        self.waiting_since: float | None = None
        self.reports_seen = 0  # platform.sim.safety_reports looked at so far
        self.reported: set[tuple[str, str]] = set()

    def advance_until(self, condition, limit_s: float) -> bool:  # noqa: ANN001 - a predicate
        """Advance simulated time (no new faults or operations) until `condition()`."""
        end = self.platform.now_s() + limit_s
        while not condition():
            if self.platform.now_s() >= end:
                return False
            self.platform.advance()
            self.clients.collect(self.platform.now_s())
        return True

    def fault_due(self, now_s: float, deadline_s: float) -> bool:
        """Whether `schedule_faults` would begin or end a fault at this time."""
        if not self.nemesis.faults:
            return False
        if self.fault is not None:
            return now_s >= self.fault_ends_s
        return now_s >= self.next_fault_s and now_s + self.interval_s / 2 <= deadline_s

    def schedule_faults(self, now_s: float, deadline_s: float) -> None:
        """Nemesis._run's rhythm in simulated time: quiet for an interval, a fault held for
        an interval (cut short by the deadline), healed, and again."""
        nemesis = self.nemesis
        if not nemesis.faults:
            return
        if self.fault is not None:
            if now_s >= self.fault_ends_s:
                nemesis.end(self.fault)
                self.fault = None
                self.next_fault_s = now_s + self.interval_s
            return
        if now_s < self.next_fault_s or now_s + self.interval_s / 2 > deadline_s:
            return
        self.fault = nemesis.begin_next()
        if self.fault is None:
            self.next_fault_s = now_s + self.interval_s
        else:
            self.fault_ends_s = min(now_s + self.interval_s, deadline_s)

    def note_crashes(self) -> None:
        """A node that stopped itself, as the real runner's watch (nemesis/runner.py), and
        the safety reports made since the last look, recorded when they are made (the
        real runner gathers them from the logs at the end)."""
        nemesis = self.nemesis
        reports = self.platform.sim.safety_reports
        if len(reports) > self.reports_seen:
            fresh = sim_safety_reports(reports[self.reports_seen:], self.reported)
            self.reports_seen = len(reports)
            safety_reports.record_all(fresh, nemesis.record)
        nemesis.look_for_crashes()

    def run_workload(self, duration_s: float) -> None:
        platform = self.platform
        start = platform.now_s()
        deadline = start + duration_s
        self.next_fault_s = start + self.interval_s
        for client in self.clients.clients:  # each thread's pace starts with the workload
            client.next_at_s += start
        while platform.now_s() < deadline:
            now = platform.now_s()
            self.clients.invoke_due(now, deadline)
            due = self.fault_due(now, deadline)
            if due and self.waiting_since is None:
                self.waiting_since = now  # the due fault waits for a write in flight
            if due and (self.clients.write_in_flight()
                        or now >= self.waiting_since + AIM_WAIT_S):
                platform.deliver_pending(self.split_rng.randrange(MID_TICK_DELIVERIES + 1))
                self.schedule_faults(now, deadline)
                self.waiting_since = None
            platform.advance()
            self.clients.collect(platform.now_s())
            self.note_crashes()
        if self.fault is not None:
            self.nemesis.end(self.fault)
            self.fault = None


def run_sim(config, run_dir: Path, run_id: str, out, test: dict[str, Any]) -> int:  # noqa: ANN001
    """The run on the simulator; writes the run folder and returns the exit code
    (0 valid, 1 invalid, 2 unknown, 3 harness error), as `runner.run` does."""
    from nemesis.runner import finish_run, print_line

    workload = make_workload(config)
    test["workload"] = workload.describe()
    variant = variant_for_run(config.unsafe)
    test["sim"] = {"tick_s": TICK_S, "attempt_timeout_s": ATTEMPT_TIMEOUT_S,
                   "variant": variant.name if variant is not None else "correct"}
    write_json(run_dir / "test.json", test)
    run_info: dict[str, Any] = {"run_id": run_id, "platform": "sim", "crashed_nodes": [],
                                "nemesis_errors": [], "harness_error": None}
    platform = simulate(config, run_dir, run_id, out, run_info)
    write_json(run_dir / "results.json", run_info)
    if platform.sim.violations:
        expected = (" (expected: restore-majority took committed entries from a majority on "
                    "purpose, which Raft's safety properties assume never happens)"
                    if (run_info.get("faults") or {}).get("restore-majority") else "")
        print_line(out, f"the simulator's safety monitor saw {len(platform.sim.violations)} "
                        f"violation(s){expected}; first: {platform.sim.violations[0].line()}")
    return finish_run(config, run_dir, run_info, out)


def make_workload(config) -> KVWorkload:  # noqa: ANN001 - a RunConfig
    from nemesis.runner import make_workload as make_real_workload

    workload = make_real_workload(config)
    assert isinstance(workload, KVWorkload), "the simulator runs the kv workload only"
    return workload


def simulate(config, run_dir: Path, run_id: str, out, run_info: dict[str, Any],  # noqa: ANN001
             record_schedule: bool = False) -> SimPlatform:
    """The whole run in simulated time: history.jsonl, nemesis.jsonl and nodes/ written
    to `run_dir`, what happened added to `run_info`. With `record_schedule`, the
    simulation's `schedule` records every step (for `python -m nemesis shrink`)."""
    from nemesis.runner import print_line

    raft_config: dict[str, Any] = {}
    if "reorder" in config.faults:  # what it reorders: many short APPENDs (faults.py)
        raft_config["max_append_entries"] = REORDER_APPEND_ENTRIES
    elif "rollback" in config.faults:  # a catch-up of many APPENDs (nemesis/rollback.py)
        raft_config["max_append_entries"] = rollback.MAX_APPEND_ENTRIES
    platform = SimPlatform(ClusterConfig(nodes=config.nodes, run_id=run_id, work_dir=run_dir),
                           seed=config.seed, variant=variant_for_run(config.unsafe),
                           record_trace=not record_schedule, **raft_config)
    if record_schedule:
        platform.sim.schedule = []
    workload = make_workload(config)
    history = HistoryWriter(run_dir / "history.jsonl", clock_ns=platform.now_ns)
    with (run_dir / "nemesis.jsonl").open("w", encoding="utf-8") as nemesis_events:

        def record(f: str, value: dict[str, Any]) -> None:
            index = history.event("nemesis", f, value)
            nemesis_events.write(json.dumps({"index": index, "sim_time_s": platform.now_s(),
                                             "f": f, **value}, default=str) + "\n")

        nemesis = Nemesis(platform, config.faults, seed=config.seed,
                          interval_s=config.interval_s, record=record)
        nemesis.deal_kinds = config.faults_all
        run_info["crashed_nodes"] = nemesis.crashes
        clients = SimClients(workload, platform, history, config.seed)
        platform.ops_in_flight = clients.op_in_flight
        run = SimRun(platform, nemesis, clients, config.interval_s, seed=config.seed)
        try:
            if not run.advance_until(lambda: platform.ready() is not None, LEADER_TIMEOUT_S):
                raise RuntimeError(f"no leader within {LEADER_TIMEOUT_S:g} simulated seconds: "
                                   f"{platform.describe()}")
            print_line(out, f"leader {platform.leader()} at {platform.now_s():.2f} s (simulated); "
                            f"running the kv workload for {config.duration_s:g} simulated s "
                            f"with faults {','.join(config.faults)} (seed {config.seed})")
            run.run_workload(config.duration_s)
            clients.stop(platform.now_s())
            print_line(out, "healing every fault ...")
            nemesis.heal_everything()
            run_info["recovered_leader"] = (
                platform.leader() if run.advance_until(lambda: platform.ready() is not None,
                                                       RECOVERY_TIMEOUT_S) else None)
            print_line(out, "final reads ...")
            run_info["final_reads"] = clients.final_reads(run, FINAL_READ_TIMEOUT_S)
            run_info["replica_reads"] = clients.replica_reads(run, REPLICA_READ_TIMEOUT_S, out)
            run.note_crashes()  # what happened during the heal and the final reads
        except Exception as exc:  # a harness bug must never read as "invalid" (exit 1)
            log.exception("harness failure")
            run_info["harness_error"] = f"{type(exc).__name__}: {exc}"
            print_line(out, f"harness error: {type(exc).__name__}: {exc}")
        finally:
            for index in history.in_flight():
                history.complete(index, "info", None, error="run ended with the operation in flight")
            history.close()
            platform.collect_logs()
            run_info["nemesis_errors"] = list(nemesis.errors)
            run_info["faults"] = dict(nemesis.counts)
            run_info["sim"] = {
                "simulated_s": round(platform.now_s(), 3), "ticks": platform.ticks,
                "steps": platform.sim.step_count, "trace_hash": platform.sim.trace_hash(),
                "monitor_violations": [v.line() for v in platform.sim.violations][:20],
            }
    return platform


def sim_safety_reports(reports: list[tuple[str, str, str]], reported: set[tuple[str, str]]
                       ) -> list[dict[str, Any]]:
    """The simulated nodes' reports of a broken rule (Ready.errors, the RuleWatch), as the
    real runner reads them from the node logs (nemesis/safety_reports.py): each distinct
    (node, text) once, up to MAX_REPORTS a run (`reported` holds those recorded already)."""
    fresh = []
    for node, rule, text in reports:
        if (node, text) in reported or len(reported) >= safety_reports.MAX_REPORTS:
            continue
        reported.add((node, text))
        fresh.append({"node": node, "rule": rule, "text": text, "logged_at": None})
    return fresh


def variant_for_run(unsafe: str | None):  # noqa: ANN201 - SimVariant | None
    """The simulator's variant of the store for `--unsafe` (None: the real store, also
    for a client-library canary, which the clients run)."""
    from system.kv.unsafe import CLIENT_CANARIES

    if not unsafe or unsafe in CLIENT_CANARIES:
        return None
    from system.sim.unsafe import variant_for

    return variant_for(unsafe)

