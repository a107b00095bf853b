"""A simulation's schedule: every action taken on it from outside, as data to replay.

What it is for: a randomized run (system/sim/swarm.py) or a harness run on the simulator
(nemesis/sim_runner.py) records, with `Simulation.schedule = []`, each action it took:
deliver, drop or duplicate a message, tick some nodes, cut, partition or heal links, crash
or restart a node, complete a leader's pending fsync (the pipelined ordering), invoke a client operation, submit it to a node, time it out, give it
up, change the membership. `play` replays a list of `Step`s on a fresh simulation, so a
failing run can be shrunk (system/sim/shrink.py) by replaying fewer steps; `to_code`
writes a schedule as the named calls on `Simulation` that a test in the style of
tests/raft/test_interleavings.py makes.

Replay is tolerant by design: a step that no longer applies once earlier steps are gone
(no such message on the wire, a node already down, an operation already complete) is
skipped, and `play` says which steps applied; the shrinker keeps only those. A message is
named by its type, its link and its place among the messages of that type in flight on
that link (0 = the oldest), not by its contents: a shorter schedule shifts terms and
indexes, and "deliver the oldest vote from n2 to n1" still means something then.

What it must never do: read a clock, use global randomness, or act on anything a step does
not name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from system.sim.clients import ClientOp
    from system.sim.network import InFlight
    from system.sim.simulation import Simulation

MessageKey = tuple[str, str, str, int]  # (type, src, dst, place among those in flight)

FAULT_KINDS = frozenset({"drop", "duplicate", "cut", "partition", "heal", "heal_link", "crash",
                         "restart", "membership"})
CLIENT_KINDS = frozenset({"invoke", "submit", "submit_held", "deliver_held", "time_out",
                          "give_up"})


def message_key(flight: InFlight, in_flight: Iterable[InFlight]) -> MessageKey:
    """How a schedule names `flight`: type, link, and how many older messages of the same
    type are in flight on the same link."""
    m = flight.message
    place = 0
    for other in in_flight:
        if other.id == flight.id:
            break
        o = other.message
        if (o.type, o.src, o.dst) == (m.type, m.src, m.dst):
            place += 1
    return (m.type.value, m.src, m.dst, place)


@dataclass(frozen=True, slots=True)
class Step:
    """One action: `kind` names the Simulation call, `args` its arguments as plain data."""

    kind: str
    args: tuple

    def line(self) -> str:
        """The step in words, for a person reading a shrunk schedule."""
        a = self.args
        if self.kind in ("deliver", "drop", "duplicate"):
            kind, src, dst, place = a[0]
            which = "the oldest" if place == 0 else f"the {_ordinal(place + 1)} oldest"
            return f"{self.kind} {which} {kind} {src}->{dst}"
        if self.kind == "tick":
            return f"tick {','.join(a[0])}"
        if self.kind == "cut":
            return f"cut {a[0]}{'<' if a[2] else ''}->{a[1]}"
        if self.kind == "partition":
            return "partition " + " | ".join(",".join(g) for g in a[0])
        if self.kind == "heal_link":
            return f"heal {a[0]}->{a[1]}"
        if self.kind == "fsync":
            return f"{a[0]}'s pending fsync completes"
        if self.kind == "crash":
            return f"crash {a[0]}{' losing unsynced writes' if a[1] else ''}"
        if self.kind == "invoke":
            op_id, f, key, value, expected, process = a[:6]
            text = f"op{op_id}: p{process} invokes {f} {key}"
            if value is not None:
                text += f"={value!r}"
            if expected is not None:
                text += f" if version {expected}"
            return text + (" (stale)" if a[7] else "")
        if self.kind == "submit":
            return f"op{a[0]} sent to {a[1]}"
        if self.kind == "submit_held":
            return f"op{a[0]} sent to {a[1]}, which is paused: it waits in the socket"
        if self.kind == "deliver_held":
            return f"{a[0]} resumed and reads the requests that waited"
        if self.kind in ("time_out", "give_up"):
            return f"op{a[0]} {self.kind.replace('_', ' ')}"
        if self.kind == "membership":
            return f"membership {a[1]} {a[2]} via {a[0]}"
        return " ".join([self.kind, *map(str, a)])


class Replay:
    """The named calls a schedule makes on a `Simulation`, each skipped (returning False)
    when it does not apply on this run: a shrunk schedule recorded on a broken variant
    replays on the real core, where a message may not exist or an operation may already
    be answered. `play` (the shrinker) and the generated tests both go through here, so
    they replay a schedule identically."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.ops: dict[int, ClientOp] = {}  # the schedule's operation numbers -> this run's

    def __enter__(self) -> Replay:
        return self

    def __exit__(self, kind, error, traceback) -> bool:  # noqa: ANN001
        """An exception escaping a core or shell is a finding (as in the randomized run):
        recorded as a `no node raises` violation, and the replay ends there."""
        if error is None or not isinstance(error, Exception):
            return False
        from system.sim.invariants import Rule

        self.sim.monitor.violate(Rule.NO_EXCEPTION, f"{type(error).__name__}: {error}")
        return True

    def _flight(self, kind: str, src: str, dst: str, place: int) -> InFlight | None:
        """The `place`-th oldest message of this type in flight on src -> dst (the
        youngest if there are fewer), or None if there is none."""
        found = None
        for flight in self.sim.network.in_flight.values():
            m = flight.message
            if (m.type.value, m.src, m.dst) == (kind, src, dst):
                found = flight
                if place == 0:
                    break
                place -= 1
        return found

    # -- the network ------------------------------------------------------------------------

    def deliver(self, kind: str, src: str, dst: str, place: int = 0) -> bool:
        """Deliver the `place`-th oldest message of this type on src -> dst, if any."""
        flight = self._flight(kind, src, dst, place)
        if flight is not None:
            self.sim.deliver_flight(flight)
        return flight is not None

    def drop(self, kind: str, src: str, dst: str, place: int = 0) -> bool:
        flight = self._flight(kind, src, dst, place)
        if flight is not None:
            self.sim.drop_flight(flight)
        return flight is not None

    def duplicate(self, kind: str, src: str, dst: str, place: int = 0) -> bool:
        flight = self._flight(kind, src, dst, place)
        if flight is not None:
            self.sim.duplicate_flight(flight)
        return flight is not None

    def cut(self, src: str, dst: str, both_ways: bool = True) -> bool:
        self.sim.cut(src, dst, both_ways=both_ways)
        return True

    def partition(self, *groups: list[str]) -> bool:
        self.sim.partition(*groups)
        return True

    def heal(self) -> bool:
        self.sim.heal()
        return True

    def heal_link(self, src: str, dst: str) -> bool:
        self.sim.heal_link(src, dst)
        return True

    # -- nodes ------------------------------------------------------------------------------

    def tick(self, *nodes: str) -> bool:
        running = [n for n in nodes if self.sim.nodes[n].alive]
        if running != list(nodes):
            return False
        self.sim.tick_nodes(running)
        return True

    def crash(self, node: str, lose_unsynced: bool = False) -> bool:
        if not self.sim.nodes[node].alive:
            return False
        self.sim.crash(node, lose_unsynced=lose_unsynced)
        return True

    def fsync(self, node: str) -> bool:
        """`node`'s pending fsync completes, if it has one."""
        if self.sim.nodes[node].persisting is None:
            return False
        self.sim.finish_persist(node)
        return True

    def restart(self, node: str) -> bool:
        if self.sim.nodes[node].alive:
            return False
        self.sim.restart(node)
        return True

    def membership(self, leader: str, kind: str, target: str) -> bool:
        from system.raft.core import (
            MembershipChangeKind,
            MembershipChangeRefused,
            NotLeader,
            ProposalDropped,
        )

        if self.sim.leader() != leader:
            return False
        try:
            self.sim.change_membership(leader, MembershipChangeKind(kind), target, wait=False)
        except (MembershipChangeRefused, NotLeader, ProposalDropped):
            return False
        return True

    # -- clients ----------------------------------------------------------------------------

    def invoke(self, op: int, f: str, key: str, value: str | None = None,
               expected_version: int | None = None, *, process: int, request_id: str = "",
               stale: bool = False, retry: bool = False) -> bool:
        """Operation number `op` of the schedule is invoked by `process`."""
        from system.sim.history import Function

        if any(o.process == process and not o.done for o in self.sim.ops):
            return False  # this run has not finished the process's previous operation
        self.ops[op] = self.sim.invoke(Function(f), key, value, expected_version, process,
                                       request_id or None, stale=stale,
                                       retry_on_refusal=retry)
        return True

    def _open(self, op: int) -> ClientOp | None:
        found = self.ops.get(op)
        return found if found is not None and not found.done else None

    def submit(self, op: int, node: str) -> bool:
        found = self._open(op)
        if found is not None:
            self.sim.submit(found, node)
        return found is not None

    def submit_held(self, op: int, node: str) -> bool:
        found = self._open(op)
        if found is not None and self.sim.nodes[node].alive:
            self.sim.submit(found, node, held=True)
            return True
        return False

    def deliver_held(self, node: str) -> bool:
        return self.sim.deliver_held(node) > 0

    def time_out(self, op: int, reason: str = "client timed out") -> bool:
        from system.sim.clients import AttemptState

        found = self._open(op)
        if found is None or not found.attempts or found.attempts[-1].state is not AttemptState.WAITING:
            return False
        self.sim.time_out(found, reason)
        return True

    def give_up(self, op: int, reason: str = "client gave up") -> bool:
        found = self._open(op)
        if found is not None:
            self.sim.give_up(found, reason)
        return found is not None


def play_step(replay: Replay, step: Step) -> bool:
    """Carry out one step; False (nothing done) if it does not apply any more."""
    a = step.args
    if step.kind in ("deliver", "drop", "duplicate"):
        return getattr(replay, step.kind)(*a[0])
    if step.kind == "tick":
        return replay.tick(*a[0])
    if step.kind == "partition":
        return replay.partition(*(list(g) for g in a[0]))
    if step.kind == "invoke":
        op, f, key, value, expected, process, request_id, stale, retry = a
        return replay.invoke(op, f, key, value, expected, process=process,
                             request_id=request_id, stale=stale, retry=retry)
    if step.kind in ("cut", "heal", "heal_link", "crash", "restart", "fsync", "membership",
                     "submit", "submit_held", "deliver_held", "time_out", "give_up"):
        return getattr(replay, step.kind)(*a)
    raise ValueError(f"unknown step kind {step.kind!r}")


def play(sim: Simulation, steps: list[Step], stop=None) -> list[bool]:  # noqa: ANN001
    """Replay `steps` on `sim`; returns, per step, whether it applied. With `stop`, a
    predicate on the simulation, the replay ends as soon as it holds."""
    applied: list[bool] = []
    with Replay(sim) as replay:
        for step in steps:
            applied.append(play_step(replay, step))
            if stop is not None and stop(sim):
                break
    return applied


def step_code(step: Step) -> str:
    """One step as a line of Python on a `Replay` called `r`."""
    a = step.args
    if step.kind in ("deliver", "drop", "duplicate"):
        args = a[0] if a[0][3] else a[0][:3]  # place 0 (the oldest) is the default
    elif step.kind == "tick":
        args = a[0]
    elif step.kind == "partition":
        args = tuple(list(g) for g in a[0])
    elif step.kind == "invoke":
        op, f, key, value, expected, process, request_id, stale, retry = a
        text = f"r.invoke({op}, {f!r}, {key!r}"
        if value is not None or expected is not None:
            text += f", {value!r}"
        if expected is not None:
            text += f", {expected!r}"
        text += f", process={process}"
        if request_id:
            text += f", request_id={request_id!r}"
        if stale:
            text += ", stale=True"
        if retry:
            text += ", retry=True"
        return text + ")"
    else:
        args = a
    return f"r.{step.kind}({', '.join(repr(x) for x in args)})"


def counts(steps: list[Step]) -> dict[str, int]:
    """steps / faults / client ops of a schedule (client ops = invokes)."""
    return {"steps": len(steps), "faults": sum(s.kind in FAULT_KINDS for s in steps),
            "client ops": sum(s.kind == "invoke" for s in steps)}


def _ordinal(n: int) -> str:
    return f"{n}{'tsnrhtdd'[(n // 10 % 10 != 1) * (n % 10 < 4) * n % 10::4]}"
