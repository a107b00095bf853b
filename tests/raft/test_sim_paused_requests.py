"""A request sent to a paused node waits unread until the node resumes (or crashes).

A SIGSTOPped process reads nothing from its sockets; the simulator served such a request
at once, so a paused old leader proposed writes and answered reads no real paused process
could — a broken read barrier looked caught on the simulator alone (0 of 5 seeds on real
processes, 5 of 5 on the simulator)."""

from __future__ import annotations

from system.sim.clients import AttemptState
from system.sim.history import Function
from system.sim.simulation import Simulation


def _leader_sim() -> Simulation:
    sim = Simulation(3, seed=1)
    sim.campaign("n1")
    sim.settle()
    assert sim.leader() == "n1"
    return sim


def test_a_held_write_is_proposed_only_when_the_node_resumes() -> None:
    sim = _leader_sim()
    last = sim.core("n1").log.last_index()
    op = sim.invoke(Function.PUT, "x", "a", process=1, request_id="p1-a")
    attempt = sim.submit(op, "n1", held=True)
    sim.run(20)
    assert attempt.state is AttemptState.WAITING and not op.done
    assert sim.core("n1").log.last_index() == last  # the request was never read
    assert sim.deliver_held("n1") == 1
    sim.run_until(lambda: op.done, 300)
    assert op.status.value == "ok" and sim.core("n1").log.last_index() > last


def test_a_held_read_nobody_waits_for_is_dropped_and_a_crash_loses_held_requests() -> None:
    sim = _leader_sim()
    read = sim.invoke(Function.GET, "x", process=1)
    sim.submit(read, "n1", held=True)
    sim.give_up(read, "client gave up")
    assert sim.deliver_held("n1") == 1
    assert read.done and sim.nodes["n1"].read_waiters == {}  # not served to nobody
    write = sim.invoke(Function.PUT, "x", "b", process=2, request_id="p2-b")
    attempt = sim.submit(write, "n2", held=True)
    sim.crash("n2")
    assert attempt.state is AttemptState.UNKNOWN and sim.held == []
    assert sim.deliver_held("n2") == 0
