"""Randomized simulation of a Raft cluster, one seed at a time, with swarm testing.

What it is for: to look for orderings nobody thought of. For each seed, `draw_swarm`
first randomizes the run's own settings (cluster size, batching, snapshot chunking,
compaction, election timeout) and its fault rates: some seeds lose many messages and
never crash, others crash and partition often with a perfect network (swarm testing:
diverse runs find more bugs than one "average" mix). `run_seed` then plays:

1. a safety phase of `safety_steps` random steps: deliver a random (or the oldest)
   message, lose or duplicate it, complete a leader's pending fsync (when the seed
   pipelines a leader's Readies as the real node does), tick, partition / cut one way / heal, crash (with or
   without losing unsynced writes), restart, and let clients put / cas / get (stale or
   linearizable), retrying with the same request id, timing out into `info`;
2. a liveness phase: heal everything, restart every crashed node, stop injecting faults;
   a new write must be committed and acknowledged within `liveness_steps`;
3. convergence and a final linearizable read of every key, then the end checks:
   acknowledged writes present everywhere, identical state machines, linearizable history
   (decided by the checker the caller passes in as `check`: the project's,
   `checker.check_versioned_kv`, model `versioned-kv`; the system never imports it).

The `SafetyMonitor` checks Raft's safety properties after every input to every core.
A seed's outcome is a `SeedResult`; a failing seed prints the one command that replays
it exactly. Everything derives from the seed: no clock, no global randomness. The one
exception is the linearizability checker's wall-clock budget (`Simulation.check_linearizable`):
it can only turn a seed's verdict into "unknown", which is reported as such.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from system.raft.core import (
    MembershipChangeKind,
    MembershipChangeRefused,
    NotLeader,
    ProposalDropped,
)
from system.sim.clients import AttemptState, ClientOp, OpStatus
from system.sim.history import Function
from system.sim.invariants import Rule, Violation
from system.sim.network import InFlight
from system.sim.simulation import LinearizabilityCheck, Simulation
from system.sim.variant import SimVariant

# Defaults chosen so that 500 seeds take well under four minutes on one core (measured;
# see docs/raft-testing.md) while still driving several elections, crashes and snapshot
# transfers per seed.
SAFETY_STEPS = 3_000
LIVENESS_STEPS = 3_000
# Catching every node up may need a whole snapshot sent in small chunks: allow more.
CONVERGENCE_STEPS = 20_000


@dataclass(frozen=True)
class Swarm:
    """What one seed randomized about its run. Probabilities are per step unless noted."""

    node_count: int
    election_timeout_ticks: int
    max_append_entries: int
    max_inflight_appends: int
    snapshot_chunk_bytes: int
    compact_every_entries: int  # 0: never snapshot
    keys: int
    clients: int
    tick_probability: float  # advance time rather than deliver a message
    # Per node: the chance it ticks when time advances. Below 1.0 the node's clock runs
    # slow (a paused or overloaded process): a deposed leader notices late.
    clock_rates: tuple[float, ...]
    # Which in-flight message goes next: "fifo" the oldest of all; "links" the oldest on a
    # random link (each link in order, like a TCP stream, links interleaved at random);
    # "random" any message at all (reordering within a link too).
    delivery: str
    drop_probability: float  # per delivery: lose the message instead
    duplicate_probability: float  # per delivery: also keep a copy for later
    partition_probability: float
    one_way_fraction: float  # of partitions, how many cut a single direction
    heal_probability: float
    crash_probability: float
    lose_unsynced_fraction: float  # of crashes, how many lose unsynced writes
    restart_probability: float
    client_probability: float
    read_fraction: float
    stale_read_fraction: float  # of reads
    cas_fraction: float  # of writes
    op_timeout_steps: int
    max_attempts: int
    # Membership changes (drawn from their own rng so the other settings of a seed are
    # what they were before membership faults existed): spare nodes that are not members
    # at the start, and the rate at which the leader is asked to add a learner, promote a
    # caught-up learner or remove a member (the leader itself sometimes).
    spare_nodes: int = 0
    membership_probability: float = 0.0
    # The core's configuration (each from its own rng, like membership, so a seed's other
    # settings are what they were before): PreVote and CheckQuorum hide election rules
    # that must hold without them too (etcd runs with PreVote off by default).
    pre_vote: bool = True
    check_quorum: bool = True
    # Commit indexes sent at once (etcd) or with the next APPEND or heartbeat (the store's
    # default): lazily, followers apply later and the leader's answers never wait on it.
    eager_commit: bool = True
    # Holding messages across terms: the chance per step that a message in flight is kept
    # back for `hold_steps` steps (several elections' worth) and only then becomes
    # deliverable, so rules about stale messages from older terms get exercised.
    hold_probability: float = 0.0
    hold_steps: int = 0
    # The real node's ordering for a leader's Ready (system/sim/shell.py): its APPENDs
    # leave before its own fsync, which completes with this chance per step; off, every
    # Ready is fsynced before anything leaves (own rng: the other settings are unchanged).
    pipeline: bool = False
    fsync_probability: float = 0.0
    # Per step while a leader's fsync is pending: it crashes in that window (mostly a power
    # loss), the moment its APPENDs are out and its own copy is not yet on disk.
    window_crash_probability: float = 0.0

    def line(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.__dict__.items())


def draw_swarm(seed: int) -> Swarm:
    """The settings and fault rates of one seed."""
    rng = random.Random(f"raft-sim:{seed}:swarm")

    def maybe(probability: float, low: float, high: float) -> float:
        return rng.uniform(low, high) if rng.random() < probability else 0.0

    membership_rng = random.Random(f"raft-sim:{seed}:membership")
    membership_on = membership_rng.random() < 0.4
    config_rng = random.Random(f"raft-sim:{seed}:config")
    hold_rng = random.Random(f"raft-sim:{seed}:hold")
    hold_on = hold_rng.random() < 0.4
    commit_rng = random.Random(f"raft-sim:{seed}:commit")
    pipeline_rng = random.Random(f"raft-sim:{seed}:pipeline")
    pipeline_on = pipeline_rng.random() < 0.7
    return Swarm(
        pipeline=pipeline_on,
        fsync_probability=pipeline_rng.choice((0.05, 0.2, 0.6)) if pipeline_on else 0.0,
        window_crash_probability=pipeline_rng.choice((0.0, 0.02, 0.1)) if pipeline_on else 0.0,
        eager_commit=commit_rng.random() < 0.5,
        pre_vote=config_rng.random() < 0.7,
        check_quorum=config_rng.random() < 0.7,
        hold_probability=hold_rng.uniform(0.002, 0.02) if hold_on else 0.0,
        hold_steps=hold_rng.choice((200, 500, 1500)) if hold_on else 0,
        spare_nodes=membership_rng.choice((1, 2)) if membership_on else 0,
        membership_probability=membership_rng.uniform(0.002, 0.02) if membership_on else 0.0,
        node_count=rng.choice((3, 3, 3, 5)),
        election_timeout_ticks=rng.choice((4, 6, 10)),
        max_append_entries=rng.choice((1, 2, 4, 64)),
        max_inflight_appends=rng.choice((1, 2, 8)),
        snapshot_chunk_bytes=rng.choice((64, 512, 4096)),
        compact_every_entries=rng.choice((0, 3, 8, 20)),
        keys=rng.choice((1, 2, 3)),
        clients=rng.choice((2, 3, 4)),
        tick_probability=rng.uniform(0.02, 0.15),
        clock_rates=tuple(
            1.0 if rng.random() < 0.6 else rng.uniform(0.1, 0.8) for _ in range(5)
        ),
        delivery=rng.choice(("fifo", "links", "links", "random", "random")),
        drop_probability=maybe(0.5, 0.01, 0.25),
        duplicate_probability=maybe(0.4, 0.01, 0.15),
        partition_probability=maybe(0.6, 0.002, 0.03),
        one_way_fraction=rng.choice((0.0, 0.3)),
        heal_probability=rng.uniform(0.005, 0.05),
        crash_probability=maybe(0.6, 0.002, 0.02),
        lose_unsynced_fraction=rng.choice((0.0, 0.5, 1.0)),
        restart_probability=rng.uniform(0.01, 0.08),
        client_probability=rng.uniform(0.02, 0.15),
        read_fraction=rng.uniform(0.2, 0.6),
        stale_read_fraction=rng.choice((0.0, 0.2)),
        cas_fraction=rng.uniform(0.0, 0.6),
        op_timeout_steps=rng.choice((40, 100, 300)),
        max_attempts=rng.choice((1, 3, 6)),
    )


@dataclass
class _Client:
    process: int
    op: ClientOp | None = None
    leader_hint: str | None = None
    next_write: int = 0


@dataclass
class SeedResult:
    seed: int
    variant: str
    violations: list[Violation]
    swarm: Swarm
    steps: int
    faults: dict[str, int] = field(default_factory=dict)
    ops: dict[str, int] = field(default_factory=dict)  # ok / fail / info counts
    committed: int = 0  # highest commit index reached
    trace_hash: str = ""
    linearizability: str = ""  # "valid", "invalid" or "unknown"
    linearizability_note: str = ""  # unknown: which budget ran out, on which key

    @property
    def ok(self) -> bool:
        return not self.violations


class SwarmRun:
    """Drives one Simulation through the phases described in the module docstring."""

    def __init__(
        self,
        seed: int,
        variant: SimVariant | None = None,
        safety_steps: int = SAFETY_STEPS,
        liveness_steps: int = LIVENESS_STEPS,
        record_trace: bool = True,
        *,
        check: LinearizabilityCheck,
    ) -> None:
        self.seed = seed
        self.check = check
        self.swarm = swarm = draw_swarm(seed)
        self.safety_steps = safety_steps
        self.liveness_steps = liveness_steps
        self.rng = random.Random(f"raft-sim:{seed}:schedule")
        # When pending fsyncs complete: its own rng, so a seed without pipelining plays
        # the schedule it played before pipelining existed.
        self.fsync_rng = random.Random(f"raft-sim:{seed}:fsync")
        self.sim = Simulation(
            node_count=swarm.node_count,
            seed=seed,
            variant=variant,
            compact_every_entries=swarm.compact_every_entries,
            record_trace=record_trace,
            election_timeout_ticks=swarm.election_timeout_ticks,
            max_append_entries=swarm.max_append_entries,
            max_inflight_appends=swarm.max_inflight_appends,
            snapshot_chunk_bytes=swarm.snapshot_chunk_bytes,
            spare_nodes=swarm.spare_nodes,
            pre_vote=swarm.pre_vote,
            check_quorum=swarm.check_quorum,
            eager_commit=swarm.eager_commit,
            pipeline=swarm.pipeline,
        )
        self.sim.record(f"swarm {swarm.line()}")
        self.clients = [_Client(self.sim.new_process()) for _ in range(swarm.clients)]
        self.keys = [f"k{i}" for i in range(1, swarm.keys + 1)]
        self.faults_on = True
        self.new_ops_on = True
        self.held_until: dict[int, int] = {}  # message id -> step from which it may go

    # -- the run -------------------------------------------------------------------------

    def run(self) -> SeedResult:
        sim = self.sim
        try:
            for _ in range(self.safety_steps):
                self.random_step()
                if sim.violations:
                    return self.result("stopped at the first violation")
            self.liveness_phase()
            if not sim.violations:
                self.final_reads()
            while sim.persisting():  # the end checks compare each disk with its core
                sim.finish_persist(sim.persisting()[0])
        except Exception as error:  # noqa: BLE001 -- any escape is a finding, with its seed
            last = "\n".join(sim.trace[-5:])
            sim.monitor.violate(
                Rule.NO_EXCEPTION, f"{type(error).__name__}: {error}\nlast events:\n{last}"
            )
            return self.result("stopped by an exception")
        sim.finish()
        sim.check_final_state()
        verdict = sim.check_linearizable(self.check)
        if verdict.valid is False:
            sim.monitor.violate(Rule.LINEARIZABILITY, verdict.explanation)
        if verdict.valid is True:
            return self.result("valid")
        if verdict.valid is False:
            return self.result("invalid")
        return self.result("unknown", verdict.explanation)

    def result(self, linearizability: str, note: str = "") -> SeedResult:
        sim = self.sim
        counts = {"ok": 0, "fail": 0, "info": 0}
        for op in sim.ops:
            if op.status is not OpStatus.OPEN:
                counts[op.status.value] += 1
        return SeedResult(
            seed=self.seed,
            variant=sim.variant.name,
            violations=list(sim.violations),
            swarm=self.swarm,
            steps=sim.step_count,
            faults=dict(sim.faults),
            ops=counts,
            committed=sim.monitor.max_committed,
            trace_hash=sim.trace_hash(),
            linearizability=linearizability,
            linearizability_note=note,
        )

    def liveness_phase(self) -> None:
        """Heal, restart, stop faults: a fresh write must commit within liveness_steps."""
        sim = self.sim
        self.faults_on = False
        self.new_ops_on = False
        sim.heal()
        for node in sim.node_ids:
            if not sim.nodes[node].alive:
                sim.restart(node)
        client = _Client(sim.new_process())
        client.op = sim.invoke(Function.PUT, self.keys[0], "liveness", process=client.process,
                               retry_on_refusal=True)
        self.clients.append(client)
        deadline = sim.step_count + self.liveness_steps
        while sim.step_count < deadline and not client.op.done:
            self.random_step()
        if not client.op.ok:
            what = (f"after healing, a new write was not acknowledged within "
                    f"{self.liveness_steps} steps (status {client.op.status.value}: "
                    f"{client.op.error})\n{sim.describe_cluster()}")
            sim.monitor.violate(Rule.LIVENESS, what)
            return
        # Convergence: every member applies everything, so the end checks compare all
        # (removed and never-added nodes are not kept up to date by anyone).
        def converged() -> bool:
            members = sim.members()
            applied = {sim.nodes[n].applied_index for n in members}
            return len(applied) == 1 and min(applied) >= sim.monitor.max_committed

        self.run_quietly(converged, "all members applied the same index",
                         budget=CONVERGENCE_STEPS)

    def final_reads(self) -> None:
        """Read every key back linearizably (Jepsen's final read): lost writes show up."""
        sim = self.sim
        for key in self.keys:
            client = _Client(sim.new_process())
            self.clients.append(client)
            client.op = sim.invoke(Function.GET, key, process=client.process,
                                   retry_on_refusal=True)
            self.run_quietly(lambda op=client.op: op.done, f"final read of {key}")

    def run_quietly(self, condition, what: str, budget: int | None = None) -> None:  # noqa: ANN001
        sim = self.sim
        budget = budget or self.liveness_steps
        deadline = sim.step_count + budget
        while sim.step_count < deadline and not condition():
            self.random_step()
        if not condition():
            sim.monitor.violate(
                Rule.LIVENESS,
                f"{what}: not reached within {budget} fault-free steps\n"
                + sim.describe_cluster(),
            )

    # -- one random step -----------------------------------------------------------------

    def random_step(self) -> None:
        sim, swarm, rng = self.sim, self.swarm, self.rng
        self.drive_clients()
        persisting = sim.persisting() if swarm.pipeline else []
        if persisting:
            roll = self.fsync_rng.random()
            if roll < swarm.fsync_probability:
                sim.finish_persist(self.fsync_rng.choice(persisting))
                return
            if self.faults_on and roll < swarm.fsync_probability + swarm.window_crash_probability:
                sim.crash(self.fsync_rng.choice(persisting),
                          lose_unsynced=self.fsync_rng.random() < 0.7)
                return
        roll = rng.random()
        if self.faults_on:
            fault_budget = (
                swarm.partition_probability + swarm.heal_probability
                + swarm.crash_probability + swarm.restart_probability
                + swarm.membership_probability + swarm.hold_probability
            )
            if roll < fault_budget:
                self.inject_fault(roll)
                return
            roll -= fault_budget
        if self.new_ops_on and roll < swarm.client_probability:
            self.start_operation()
            return
        in_flight = self.deliverable()
        # Once healed, time only advances when the network is idle: Raft needs the
        # broadcast time well below the election timeout (§9), and a schedule that ticks
        # faster than it delivers tests the schedule, not the core's liveness.
        deliver_now = (
            rng.random() >= swarm.tick_probability or len(in_flight) > 64
            if self.faults_on
            else True
        )
        if in_flight and deliver_now:
            flight = self.next_flight(in_flight)
            if self.faults_on and rng.random() < swarm.drop_probability:
                sim.drop_flight(flight)
                return
            if self.faults_on and rng.random() < swarm.duplicate_probability:
                sim.duplicate_flight(flight)
            sim.deliver_flight(flight)
            return
        alive = sim.alive()
        if not alive:
            node = rng.choice(sim.node_ids)
            sim.restart(node)
            return
        rates = swarm.clock_rates
        ticking = [
            n for n in alive if rng.random() < rates[sim.node_ids.index(n) % len(rates)]
        ]
        if ticking:
            sim.tick_nodes(ticking)

    def deliverable(self) -> list[InFlight]:
        """Messages in flight, oldest first, but those held back (`hold_message`) until
        their release step."""
        flights = list(self.sim.network.in_flight.values())
        if not self.held_until:
            return flights
        now = self.sim.step_count
        for flight_id in [i for i, until in self.held_until.items()
                          if until <= now or i not in self.sim.network.in_flight]:
            del self.held_until[flight_id]
        return [f for f in flights if f.id not in self.held_until]

    def hold_message(self) -> None:
        """Keep one message in flight back for `hold_steps` steps: it arrives terms late."""
        flights = self.deliverable()
        if flights:
            flight = flights[self.rng.randrange(len(flights))]
            self.held_until[flight.id] = self.sim.step_count + self.swarm.hold_steps
            self.sim.count_fault("hold across terms")
            self.sim.record(f"hold #{flight.id} for {self.swarm.hold_steps} steps")

    def next_flight(self, flights: list[InFlight]) -> InFlight:
        """The message to deliver next, of `flights` (oldest first). Once healed, links
        deliver in order (a healed network is a set of working TCP streams); before, as
        the swarm drew."""
        delivery = self.swarm.delivery if self.faults_on else "links"
        if delivery == "fifo":
            return flights[0]
        chosen = flights[self.rng.randrange(len(flights))]
        if delivery == "random":
            return chosen
        src, dst = chosen.message.src, chosen.message.dst
        return next(f for f in flights if f.message.src == src and f.message.dst == dst)

    def inject_fault(self, roll: float) -> None:
        sim, swarm, rng = self.sim, self.swarm, self.rng
        if roll < swarm.partition_probability:
            nodes = list(sim.node_ids)
            rng.shuffle(nodes)
            leader = sim.leader()
            if leader is not None and rng.random() < 0.5:
                # Cut the leader off with a minority: the classic way to get two nodes
                # that both believe they lead (and to test who may still serve reads).
                nodes.remove(leader)
                nodes.insert(0, leader)
            if rng.random() < swarm.one_way_fraction:
                sim.cut(nodes[0], nodes[1], both_ways=False)
            else:
                side = rng.randint(1, len(nodes) // 2)
                sim.partition(nodes[:side], nodes[side:])
            return
        roll -= swarm.partition_probability
        if roll < swarm.heal_probability:
            if sim.network.cut_links:
                sim.heal()
            return
        roll -= swarm.heal_probability
        if roll < swarm.crash_probability:
            alive = sim.alive()
            if alive:
                # Prefer the leader now and then: leader crashes are where writes get lost.
                leader = sim.leader()
                node = leader if leader and rng.random() < 0.5 else rng.choice(alive)
                sim.crash(node, lose_unsynced=rng.random() < swarm.lose_unsynced_fraction)
            return
        roll -= swarm.crash_probability
        if roll < swarm.restart_probability:
            crashed = [n for n in sim.node_ids if not sim.nodes[n].alive]
            if crashed:
                sim.restart(rng.choice(crashed))
            return
        roll -= swarm.restart_probability
        if roll < swarm.hold_probability:
            self.hold_message()
            return
        self.change_membership()

    def change_membership(self) -> None:
        """Ask the leader for one membership change: add a non-member as a learner,
        promote a learner, or remove a learner or a voter (itself now and then). The
        leader may refuse (a change in flight, not caught up, ...): that is its right."""
        sim, rng = self.sim, self.rng
        leader = sim.leader()
        if leader is None:
            return
        core = sim.core(leader)
        membership = core.membership
        choices: list[tuple[MembershipChangeKind, str]] = []
        choices += [(MembershipChangeKind.ADD_LEARNER, n) for n in sim.node_ids
                    if n not in membership.members()]
        choices += [(MembershipChangeKind.PROMOTE, n) for n in membership.learners]
        choices += [(MembershipChangeKind.REMOVE, n) for n in membership.learners]
        if len(membership.voters) >= 3:
            choices += [(MembershipChangeKind.REMOVE, n) for n in membership.voters]
        if not choices:
            return
        kind, target = rng.choice(choices)
        try:
            sim.change_membership(leader, kind, target, wait=False)
        except (MembershipChangeRefused, NotLeader, ProposalDropped) as error:
            sim.record(f"membership change refused: {error}")

    # -- clients -------------------------------------------------------------------------

    def start_operation(self) -> None:
        sim, swarm, rng = self.sim, self.swarm, self.rng
        idle = [c for c in self.clients if c.op is None]
        if not idle:
            return
        client = rng.choice(idle)
        key = rng.choice(self.keys)
        if rng.random() < swarm.read_fraction:
            stale = rng.random() < swarm.stale_read_fraction
            client.op = sim.invoke(Function.GET, key, process=client.process, stale=stale,
                                   retry_on_refusal=True)
        else:
            client.next_write += 1
            value = f"p{client.process}.{client.next_write}"
            if rng.random() < swarm.cas_fraction:
                expected = self.guess_version(key)
                client.op = sim.invoke(Function.CAS, key, value, expected, client.process,
                                       retry_on_refusal=True)
            else:
                client.op = sim.invoke(Function.PUT, key, value, process=client.process,
                                       retry_on_refusal=True)
        sim.submit(client.op, self.pick_node(client))

    def guess_version(self, key: str) -> int:
        """A plausible expected version: what some node's state machine holds now."""
        node = self.rng.choice(self.sim.node_ids)
        return self.sim.replica(node).read(key).version

    def pick_node(self, client: _Client) -> str:
        rng = self.rng
        if client.leader_hint is not None and rng.random() < 0.8:
            return client.leader_hint
        return rng.choice(self.sim.node_ids)

    def drive_clients(self) -> None:
        """Timeouts, retries (same request id) and retiring processes after `info`."""
        sim, swarm = self.sim, self.swarm
        for client in self.clients:
            op = client.op
            if op is None:
                continue
            if op.done:
                if op.status is OpStatus.INFO:
                    client.process = sim.new_process()  # Jepsen: an info op retires its process
                elif op.ok and op.answered_by:
                    client.leader_hint = op.answered_by
                client.op = None
                continue
            if not op.attempts:
                sim.submit(op, self.pick_node(client))
                continue
            last = op.attempts[-1]
            if last.state is AttemptState.WAITING:
                if sim.step_count - last.step > swarm.op_timeout_steps:
                    sim.time_out(op)
                continue
            if last.leader_hint is not None:
                client.leader_hint = last.leader_hint
            elif last.state is not AttemptState.ANSWERED:
                client.leader_hint = None
            if sim.step_count - last.step < 5:
                continue  # back off a little before retrying
            if len(op.attempts) >= swarm.max_attempts and self.new_ops_on:
                sim.give_up(op, f"no answer after {len(op.attempts)} attempts")
                continue
            node = client.leader_hint or self.rng.choice(sim.node_ids)
            if self.new_ops_on is False and client.leader_hint is None:
                leader = sim.leader()
                node = leader or node
            sim.submit(op, node)


def run_seed(
    seed: int,
    variant: SimVariant | None = None,
    safety_steps: int = SAFETY_STEPS,
    liveness_steps: int = LIVENESS_STEPS,
    record_trace: bool = True,
    *,
    check: LinearizabilityCheck,
) -> SeedResult:
    """Play one seed, `check` deciding linearizability; see the module docstring."""
    return SwarmRun(seed, variant, safety_steps, liveness_steps, record_trace, check=check).run()


def replay_command(seed: int, variant_path: str | None) -> str:
    command = f"python -m system.sim --seed {seed}"
    if variant_path:
        command += f" --variant {variant_path}"
    return command

