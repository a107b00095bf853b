"""Named interleavings: each test drives a simulated cluster through one ordering of
messages, crashes and restarts, and checks the safety property that ordering threatens.

Every scenario is a function that takes the variant to run (the real core by default)
and returns the finished `Simulation`; a `*_problems` function lists what is wrong with
the outcome. The test of the real core asserts there are no problems; a second test runs
the SAME scenario with a deliberately broken variant (tests/raft/broken.py) and asserts
the problems are found, so every safety test here is shown to be able to fail.
"""

from __future__ import annotations

import random

import pytest

from checker import check_versioned_kv
from system.raft.core import Role
from system.raft.messages import MessageType
from system.raft.types import EntryKind
from system.sim.clients import OpStatus
from system.sim.invariants import Rule
from system.sim.simulation import Simulation, SimulationStuck
from system.sim.variant import SimVariant
from tests.raft import broken

APPEND = MessageType.APPEND
APPEND_RESPONSE = MessageType.APPEND_RESPONSE
SNAPSHOT = MessageType.SNAPSHOT
VOTE = MessageType.VOTE
VOTE_RESPONSE = MessageType.VOTE_RESPONSE
PRE_VOTE = MessageType.PRE_VOTE
PRE_VOTE_RESPONSE = MessageType.PRE_VOTE_RESPONSE


def common_problems(sim: Simulation) -> list[str]:
    """Safety monitor violations plus a non-linearizable client history."""
    problems = [v.line() for v in sim.violations]
    verdict = sim.check_linearizable(check_versioned_kv)
    if verdict.valid is not True:
        problems.append(f"history not linearizable: {verdict.explanation}")
    return problems


def rules(sim: Simulation) -> set[Rule]:
    return {v.rule for v in sim.violations}


def converge(sim: Simulation) -> bool:
    """Run until every live node applied the leader's commit index (bounded). Returns
    whether it got there; a broken variant may never converge, and the problems
    functions then report what is wrong instead of the scenario stopping here."""
    steps = sim.run_until(
        lambda: sim.leader() is not None
        and len({sim.nodes[n].applied_index for n in sim.alive()}) == 1
        and sim.nodes[sim.alive()[0]].applied_index == sim.core(sim.leader()).commit_index,
        3_000,
        required=False,
    )
    return steps >= 0


def read_back(sim: Simulation, node: str, key: str) -> tuple[str | None, int | None]:
    read = sim.get(node, key)
    sim.run_until(lambda: read.done, 500, f"linearizable read of {key} on {node}")
    assert read.ok, read.error
    return read.result_value, read.result_version


# ---------------------------------------------------------------------------------------
# 1. The essay's lost write
# ---------------------------------------------------------------------------------------


def lost_write(variant: SimVariant | None = None) -> tuple[Simulation, object]:
    sim = Simulation(3, seed=11, variant=variant)
    sim.campaign("n1")
    sim.settle()
    write = sim.put("n1", "x", "unreplicated")
    sim.drop(type=APPEND, src="n1")  # n1 appended and persisted it; nobody else did
    sim.crash("n1")  # ... and it dies before a majority has it
    sim.campaign("n2")  # n2 wins with n3's vote and commits its NOOP at the same index
    sim.restart("n1")
    converge(sim)  # n1 rejoins: its uncommitted entry is overwritten by n2's log
    sim.give_up(write)
    return sim, write


def lost_write_problems(sim: Simulation, write) -> list[str]:  # noqa: ANN001
    value, _ = read_back(sim, "n2", "x")  # Jepsen's final read, part of the history
    problems = common_problems(sim)
    if write.status is OpStatus.OK:
        problems.append("the client was told ok for a write that no majority ever held")
    if value is not None:
        problems.append(f"x reads {value!r}: the overwritten write became visible")
    overwritten = [e for e in sim.core("n1").log_entries() if e.index == 2]
    if overwritten and overwritten[0].kind is not EntryKind.NOOP:
        problems.append("n1 still holds its uncommitted entry at index 2")
    return problems


def test_lost_write_leader_crashes_before_a_majority_has_the_entry() -> None:
    """The essay's lost write: the leader appends a client write and crashes before a
    majority has it; another node wins and overwrites that index. The client was never
    told "ok" (its operation ends unknown), no committed entry is lost, and the write is
    never visible."""
    sim, write = lost_write()
    assert write.status is OpStatus.INFO  # may or may not have happened, from its view
    assert lost_write_problems(sim, write) == []


def test_lost_write_is_caught_when_the_shell_acknowledges_at_append() -> None:
    sim, write = lost_write(broken.ACKNOWLEDGES_AT_APPEND)
    problems = lost_write_problems(sim, write)
    assert "the client was told ok for a write that no majority ever held" in problems
    assert Rule.ACKNOWLEDGED_WRITE_LOST in rules(sim)
    assert any("not linearizable" in p for p in problems)


# ---------------------------------------------------------------------------------------
# 2. Committed, then the leader crashes before replying; the client retries
# ---------------------------------------------------------------------------------------


def commit_then_crash_before_reply(variant: SimVariant | None = None):  # noqa: ANN201
    sim = Simulation(3, seed=12, variant=variant)
    sim.campaign("n1")
    sim.settle()
    write = sim.put("n1", "x", "once", request_id="req-1")
    sim.deliver_all(type=APPEND, src="n1")  # n2 and n3 persist the write: it is committed
    sim.drop(type=APPEND_RESPONSE, dst="n1")  # ... but n1 never learns it
    assert write.status is OpStatus.OPEN
    sim.crash("n1")  # dies before replying; the client cannot know what happened
    sim.campaign("n2")  # n2's NOOP commits the write (Log Matching)
    sim.retry(write, "n2")  # the client retries with the SAME request id
    sim.run_until(lambda: write.done, 500, "the retried write answered")
    sim.restart("n1")
    converge(sim)
    return sim, write


def commit_then_crash_problems(sim: Simulation, write) -> list[str]:  # noqa: ANN001
    problems = common_problems(sim)
    if not write.ok or write.result_version != 1:
        problems.append(
            f"the retry answered {write.status.value} version {write.result_version}, not the "
            "first result (version 1)"
        )
    for node in sim.node_ids:
        cell = sim.replica(node).read("x")
        if (cell.value, cell.version) != ("once", 1):
            problems.append(f"{node} holds x={cell.value!r} v{cell.version}: applied twice")
    return problems


def test_commit_then_crash_before_reply_retry_returns_the_first_result() -> None:
    """The write is committed (a majority has it) but the leader dies before replying. A
    retry carrying the same request id, sent to the new leader, is appended again yet
    returns the FIRST result, and the write is applied exactly once on every node."""
    sim, write = commit_then_crash_before_reply()
    proposals = [
        e for e in sim.core("n2").log_entries() if e.kind is EntryKind.NORMAL and b"req-1" in e.data
    ]
    assert len(proposals) == 2  # the original and the retry are both in the log
    assert commit_then_crash_problems(sim, write) == []


def test_commit_then_crash_is_caught_when_request_ids_are_ignored() -> None:
    sim, write = commit_then_crash_before_reply(broken.IGNORES_REQUEST_IDS)
    problems = commit_then_crash_problems(sim, write)
    assert any("applied twice" in p for p in problems)
    assert any("not the first result" in p for p in problems)
    assert any("not linearizable" in p for p in problems)


# ---------------------------------------------------------------------------------------
# 3. Figure 8 of the Raft paper
# ---------------------------------------------------------------------------------------


def figure8(variant: SimVariant | None = None):  # noqa: ANN201
    # One entry per APPEND, so a follower can hold the old entry without the new NOOP.
    sim = Simulation(3, seed=5, variant=variant, max_append_entries=1)
    sim.campaign("n1")  # term a: NOOP at index 1 committed everywhere
    sim.settle()
    write = sim.put("n1", "x", "old-term")  # index 2, term a, only on n1
    sim.drop(type=APPEND, src="n1")
    sim.crash("n1")
    sim.campaign("n2", wait_for_commit=False)  # term b: n2's NOOP at index 2, only on n2
    sim.drop(type=APPEND, src="n2")
    sim.crash("n2")
    sim.restart("n1")
    sim.campaign("n1", wait_for_commit=False)  # term c > b: NOOP at index 3, only on n1
    old_term = sim.core("n1").log_entries()[1].term
    # n1 replicates its old-term entry (index 2) to n3: now a majority holds it...
    sim.run_until(
        lambda: any(e.index == 2 and e.term == old_term for e in sim.core("n3").log_entries())
        and not sim.pending(type=APPEND_RESPONSE, dst="n1"),
        200,
        "n3 holding the old-term entry and n1 knowing it",
    )
    commit_with_old_entry_on_majority = sim.core("n1").commit_index
    sim.drop(type=APPEND, src="n1")  # ... but its own-term NOOP never arrives
    sim.crash("n1")
    sim.restart("n2")
    sim.campaign("n2")  # n2's last term b > a: n3 votes for it; index 2 is overwritten
    sim.restart("n1")
    converge(sim)
    sim.give_up(write)
    return sim, write, commit_with_old_entry_on_majority


def figure8_problems(sim: Simulation, write, commit_seen: int) -> list[str]:  # noqa: ANN001
    problems = common_problems(sim)
    if commit_seen >= 2:
        problems.append(
            f"n1 committed index 2 (commit={commit_seen}) by counting replicas of an entry "
            "from an earlier term"
        )
    if write.status is OpStatus.OK:
        problems.append("the client was told ok for the overwritten old-term write")
    return problems


def test_figure8_old_term_entry_on_a_majority_is_not_committed_and_is_overwritten_safely() -> None:
    """Figure 8: an entry from an older term that reaches a majority is NOT committed by
    counting replicas; a node with a newer last term then wins and overwrites it, which
    is safe precisely because it was never committed nor acknowledged."""
    sim, write, commit_seen = figure8()
    assert commit_seen == 1
    final = sim.core("n3").log_entries()
    assert final[1].term != sim.core("n1").log_entries()[0].term or final[1].kind is EntryKind.NOOP
    assert figure8_problems(sim, write, commit_seen) == []


def test_figure8_is_caught_when_old_term_entries_are_committed_by_counting() -> None:
    sim, write, commit_seen = figure8(broken.COMMITS_OLD_TERM_ENTRIES)
    problems = figure8_problems(sim, write, commit_seen)
    assert any("by counting replicas" in p for p in problems)
    assert rules(sim) & {Rule.LEADER_COMPLETENESS, Rule.STATE_MACHINE_SAFETY}


# ---------------------------------------------------------------------------------------
# 4. A partitioned old leader and ReadIndex
# ---------------------------------------------------------------------------------------


def partitioned_old_leader(variant: SimVariant | None = None):  # noqa: ANN201
    sim = Simulation(3, seed=21, variant=variant)
    sim.campaign("n1")
    first = sim.put("n1", "x", "old")
    sim.run_until(lambda: first.done, 200, "first write")
    sim.settle()
    sim.isolate("n1")  # n1 still believes it leads: its clock has not run out yet
    sim.campaign("n2")
    second = sim.put("n2", "x", "new")
    sim.run_until(lambda: second.done, 200, "second write")
    assert sim.core("n1").role is Role.LEADER  # deposed, but it does not know
    linearizable = sim.get("n1", "x")
    stale = sim.get("n1", "x", stale=True)
    fresh = sim.get("n2", "x")
    sim.run(300)  # time passes: n1's CheckQuorum eventually deposes it
    return sim, linearizable, stale, fresh


def partitioned_old_leader_problems(sim: Simulation, linearizable, stale, fresh) -> list[str]:  # noqa: ANN001
    problems = common_problems(sim)
    if linearizable.ok:
        problems.append(
            f"the deposed leader answered a linearizable read with {linearizable.result_value!r}"
        )
    if not (fresh.ok and fresh.result_value == "new"):
        problems.append(f"the new leader read {fresh.result_value!r} ({fresh.status.value})")
    completion = [e for e in sim.history if e.process == stale.process and e.type.value == "ok"]
    if not (stale.ok and stale.result_value == "old" and completion and completion[0].stale):
        problems.append("the stale read did not return the old value marked stale")
    return problems


def test_partitioned_old_leader_never_answers_a_linearizable_read() -> None:
    """A leader cut off from the majority still believes it leads. A linearizable read
    sent to it never returns (it is refused once the leader steps down), while the new
    leader serves the newer value; a read marked stale may return the old value and is
    recorded as stale."""
    sim, linearizable, stale, fresh = partitioned_old_leader()
    assert linearizable.status is OpStatus.FAIL  # refused when n1 stepped down
    assert partitioned_old_leader_problems(sim, linearizable, stale, fresh) == []


def test_partitioned_old_leader_is_caught_when_reads_skip_the_heartbeat_round() -> None:
    sim, linearizable, stale, fresh = partitioned_old_leader(broken.READS_WITHOUT_QUORUM_CHECK)
    problems = partitioned_old_leader_problems(sim, linearizable, stale, fresh)
    assert "the deposed leader answered a linearizable read with 'old'" in problems
    assert any("not linearizable" in p for p in problems)


# ---------------------------------------------------------------------------------------
# 5. A lagging follower catches up by chunked InstallSnapshot
# ---------------------------------------------------------------------------------------


def lagging_follower(variant: SimVariant | None = None):  # noqa: ANN201
    sim = Simulation(
        3, seed=31, variant=variant, compact_every_entries=4, snapshot_chunk_bytes=64
    )
    sim.campaign("n3")
    sim.settle()
    sim.isolate("n3")  # n3 keeps leading alone and appends writes nobody else gets
    stranded = [sim.put("n3", "x", f"stranded-{i}") for i in range(6)]
    sim.campaign("n1")
    for i in range(3):  # n1 compacts at index 4, inside n3's divergent suffix
        write = sim.put("n1", "x", f"committed-{i}")
        sim.run_until(lambda write=write: write.done, 300, "write on the majority side")
    assert sim.core("n1").snapshot_meta is not None  # the prefix n3 needs is compacted away
    before = len([line for line in sim.trace if " snapshot n1->n3" in line])
    sim.heal()
    converge(sim)
    chunks = len([line for line in sim.trace if "deliver" in line and " snapshot n1->n3" in line])
    sim.crash("n2")  # from now on every commit needs n3
    after = sim.put("n1", "x", "needs-n3")
    sim.run_until(lambda: after.done, 500, required=False)  # a broken variant may hang
    converge(sim)
    for op in stranded:
        sim.give_up(op)
    return sim, after, chunks - before


def lagging_follower_problems(sim: Simulation, after, chunks: int) -> list[str]:  # noqa: ANN001
    problems = common_problems(sim)
    if chunks < 2:
        problems.append(f"n3 caught up with {chunks} snapshot chunks, not a chunked transfer")
    if not after.ok:
        problems.append(f"the write needing n3 did not commit: {after.status.value}")
    if sim.replica("n3").digest() != sim.replica("n1").digest():
        problems.append("n3's state machine differs from the leader's")
    return problems


def test_lagging_follower_catches_up_by_chunked_install_snapshot_then_commits() -> None:
    """A follower (here a deposed leader holding stranded, uncommitted entries) is so far
    behind that the entries it needs were compacted away. The leader sends its snapshot
    in chunks; the follower installs it (dropping its divergent log), ends with the same
    state machine as the leader, and then takes part in commits: with the third node
    down, a new write commits with it."""
    sim, after, chunks = lagging_follower()
    assert lagging_follower_problems(sim, after, chunks) == []


def test_lagging_follower_is_caught_when_snapshots_are_installed_by_index_only() -> None:
    sim, after, chunks = lagging_follower(broken.INSTALLS_SNAPSHOT_BY_INDEX_ONLY)
    problems = lagging_follower_problems(sim, after, chunks)
    assert Rule.STATE_MACHINE_SAFETY in rules(sim)
    assert "n3's state machine differs from the leader's" in problems


# ---------------------------------------------------------------------------------------
# 6. Restarts: state from snapshot + log, and never two votes in one term
# ---------------------------------------------------------------------------------------


def restart_rebuilds_state(variant: SimVariant | None = None):  # noqa: ANN201
    sim = Simulation(3, seed=41, variant=variant, compact_every_entries=4)
    sim.campaign("n1")
    for i in range(5):
        write = sim.put("n1", f"k{i % 2}", f"v{i}")
        sim.run_until(lambda write=write: write.done, 300, "write")
    converge(sim)
    before = sim.replica("n2").digest()
    applied = sim.nodes["n2"].applied_index
    snapshot = sim.nodes["n2"].disk.current.snapshot
    sim.crash("n2")
    sim.restart("n2")  # state = its snapshot + its log re-applied up to the commit hint
    return sim, before, applied, snapshot


def test_restart_rebuilds_state_from_snapshot_plus_log() -> None:
    """A node that crashes after compacting restarts from its durable snapshot plus the
    log entries after it, and ends with exactly the state machine it had."""
    sim, before, applied, snapshot = restart_rebuilds_state()
    assert snapshot is not None and 0 < snapshot.index < applied  # both parts are needed
    assert sim.nodes["n2"].applied_index == applied
    assert sim.replica("n2").digest() == before
    assert common_problems(sim) == []


def test_restart_rebuild_is_caught_when_the_log_is_not_replayed() -> None:
    sim, before, applied, _ = restart_rebuilds_state(broken.RESTORES_SNAPSHOT_ONLY)
    assert sim.replica("n2").digest() != before


def double_vote(variant: SimVariant | None = None, power_loss: bool = False) -> Simulation:
    sim = Simulation(3, seed=42, variant=variant)
    sim.cut("n1", "n3")  # n1 and n3 each campaign through n2 only
    for node in ("n1", "n3"):  # both time out and ask n2 for a pre-vote
        while not sim.pending(type=PRE_VOTE, src=node):
            sim.tick(node)
    sim.deliver_all(type=(PRE_VOTE, PRE_VOTE_RESPONSE))  # n2 grants both pre-votes
    assert sim.core("n1").term == sim.core("n3").term == 1  # two candidates, one term
    sim.deliver(type=VOTE, src="n1", dst="n2")  # n2 votes for n1 (durably)...
    sim.deliver(type=VOTE_RESPONSE, src="n2", dst="n1")  # ... and n1 leads term 1
    sim.crash("n2", lose_unsynced=power_loss)
    sim.restart("n2")
    sim.deliver(type=VOTE, src="n3", dst="n2")  # n3's request for the same term
    sim.deliver_all(type=VOTE_RESPONSE, dst="n3")
    return sim


@pytest.mark.parametrize("power_loss", [False, True], ids=["process-crash", "power-loss"])
def test_restart_never_votes_twice_in_one_term(power_loss: bool) -> None:
    """Two candidates in the same term; the voter grants the first, crashes (even losing
    every unsynced write) and restarts, then receives the second's request: it must
    refuse, because its vote was fsynced before the grant was sent, so there is never
    more than one leader per term."""
    sim = double_vote(power_loss=power_loss)
    assert sim.core("n2").vote == "n1"
    assert sim.core("n3").role is not Role.LEADER
    assert sim.violations == []


@pytest.mark.parametrize(
    ("variant", "power_loss"),
    [(broken.FORGETS_VOTE_ON_RESTART, False), (broken.VOTES_TWICE, False),
     (broken.SKIPS_FSYNC, True)],
    ids=["forgets-vote-on-restart", "votes-twice", "skips-fsync"],
)
def test_double_vote_is_caught_when_the_vote_is_forgotten_ignored_or_unsynced(
    variant: SimVariant, power_loss: bool
) -> None:
    sim = double_vote(variant, power_loss)
    assert sim.core("n3").role is Role.LEADER
    assert Rule.ELECTION_SAFETY in rules(sim)


# ---------------------------------------------------------------------------------------
# 7. PreVote
# ---------------------------------------------------------------------------------------


def rejoining_node(variant: SimVariant | None = None):  # noqa: ANN201
    sim = Simulation(3, seed=51, variant=variant)
    sim.campaign("n1")
    sim.settle()
    term = sim.core("n1").term
    sim.isolate("n3")
    for _ in range(60):  # six election timeouts: n3 keeps timing out alone
        sim.tick()
        sim.settle()
    isolated_term = sim.core("n3").term
    sim.heal()
    for _ in range(30):
        sim.tick()
        sim.settle()
    return sim, term, isolated_term


def rejoining_node_problems(sim: Simulation, term: int, isolated_term: int) -> list[str]:
    problems = [v.line() for v in sim.violations]
    if sim.leader() != "n1" or sim.core("n1").term != term:
        problems.append(
            f"the healthy leader was disrupted: leader {sim.leader()} at term "
            f"{sim.core(sim.leader() or 'n1').term}, was n1 at term {term}"
        )
    if isolated_term != term:
        problems.append(f"the isolated node raised its term to {isolated_term}")
    return problems


def test_prevote_a_rejoining_node_does_not_disrupt_a_healthy_leader() -> None:
    """PreVote: a node cut off from the cluster keeps timing out, but its pre-votes fail,
    so its term never rises; when it rejoins, the healthy leader keeps leading in the
    same term and the node simply follows it."""
    sim, term, isolated_term = rejoining_node()
    assert rejoining_node_problems(sim, term, isolated_term) == []
    assert sim.core("n3").leader_id == "n1"


def test_prevote_disruption_is_caught_when_prevote_is_skipped() -> None:
    sim, term, isolated_term = rejoining_node(broken.SKIPS_PRE_VOTE)
    problems = rejoining_node_problems(sim, term, isolated_term)
    assert any("disrupted" in p for p in problems)
    assert Rule.PRE_VOTE in rules(sim)


def test_prevote_stale_grant_from_an_earlier_round_is_not_counted() -> None:
    """A granted pre-vote for term t+1 that arrives late, when the node already moved to
    term t+1 and pre-campaigns for t+2, must not count towards the t+2 round; otherwise a
    node raises its term without a majority's pre-vote (and later disrupts the leader)."""
    sim = Simulation(3, seed=1)
    while not sim.pending(type=PRE_VOTE, src="n1"):
        sim.tick("n1")
    sim.deliver(type=PRE_VOTE, src="n1", dst="n2")
    late = sim.hold(type=PRE_VOTE_RESPONSE, src="n2", dst="n1")[0]  # n2's grant is slow
    sim.drop(type=PRE_VOTE, src="n1", dst="n3")
    sim.campaign("n3")  # n1 follows n3 in term 1
    sim.cut("n1", "n3")
    while not sim.pending(type=PRE_VOTE, src="n1", where=lambda m: m.term == 2):
        sim.tick("n1")  # n1 loses n3 and pre-campaigns for term 2
    sim.deliver(id=late.id)  # the term-1 grant finally arrives
    assert sim.core("n1").term == 1
    assert Rule.PRE_VOTE not in rules(sim)


def snapshot_under_reordering(order_seed: int) -> tuple[Simulation, int]:
    sim = Simulation(3, seed=31, compact_every_entries=4, snapshot_chunk_bytes=64)
    sim.campaign("n1")
    sim.settle()
    sim.isolate("n3")
    for i in range(30):  # a ~2 KB snapshot: about 32 chunks of 64 bytes
        write = sim.put("n1", "x", f"value-{i}-" + "x" * 40)
        sim.run_until(lambda write=write: write.done, 300, "write")
    sim.heal()
    order = random.Random(order_seed)
    for step in range(5_000):  # a network that reorders but never loses a message
        if sim.nodes["n3"].applied_index == sim.nodes["n1"].applied_index:
            return sim, step
        flights = list(sim.network.in_flight.values())
        if flights and order.random() < 0.85:
            sim.deliver_flight(flights[order.randrange(len(flights))])
        else:
            sim.tick()
    return sim, -1


def test_snapshot_transfer_completes_on_a_network_that_reorders_but_never_loses() -> None:
    """InstallSnapshot makes progress when chunks arrive out of order: with every message
    eventually delivered, the lagging follower installs the snapshot (here within 5,000
    steps; it needs about 32 chunk round trips). Regression test of docs/raft-bugs-found.md #2."""
    sim, steps = snapshot_under_reordering(order_seed=0)
    chunks_in_flight = len(sim.pending(type=SNAPSHOT))
    assert steps >= 0, f"not caught up after 5000 steps; {chunks_in_flight} chunks in flight"


# ---------------------------------------------------------------------------------------
# A follower whose log went backwards (lost durable state)
# ---------------------------------------------------------------------------------------


def follower_log_went_backwards(variant: SimVariant | None = None, keep_through: int = 0):  # noqa: ANN201
    """n3 acknowledged every write; its disk then comes back shorter (wiped, or restored
    from an older copy); the same leader must bring it back."""
    sim = Simulation(3, seed=41, variant=variant)
    sim.campaign("n1")
    for i in range(5):
        write = sim.put("n1", "x", f"v{i}")
        sim.run_until(lambda write=write: write.done, 300, "write")
    sim.settle()
    term = sim.core("n1").term
    acknowledged = sim.core("n1").progress["n3"].match
    sim.crash("n3")
    sim.shorten_log("n3", keep_through)
    sim.restart("n3")
    write = sim.put("n1", "x", "after")  # the next APPEND finds n3's log short
    sim.run_until(lambda: write.done, 300, "write after the restart")
    caught_up = sim.run_until(
        lambda: sim.nodes["n3"].applied_index == sim.nodes["n1"].applied_index,
        2_000, required=False,
    ) >= 0
    return sim, term, acknowledged, caught_up


@pytest.mark.parametrize("keep_through", [0, 3])
def test_follower_whose_log_went_backwards_is_caught_up_by_the_same_leader(keep_through: int) -> None:
    """A follower that lost entries it had acknowledged (wiped: keep 0; restored from an
    older copy: keep 3) rejects the next APPEND with a hint below its acknowledged match.
    The same leader notices, warns naming the follower and the indexes, resets its
    progress and sends it the entries again: n3 converges without an election."""
    sim, term, acknowledged, caught_up = follower_log_went_backwards(keep_through=keep_through)
    assert caught_up, f"n3 never caught up: {sim.core('n1').progress['n3']}"
    assert sim.leader() == "n1" and sim.core("n1").term == term
    warnings = [line for line in sim.trace if "log went backwards" in line]
    assert warnings and "n3" in warnings[0] and f"index {acknowledged}" in warnings[0]
    assert common_problems(sim) == []


def test_follower_whose_log_went_backwards_stays_behind_when_the_leader_ignores_it() -> None:
    sim, _, _, caught_up = follower_log_went_backwards(broken.IGNORES_FOLLOWER_LOG_WENT_BACKWARDS)
    assert not caught_up
    progress = sim.core("n1").progress["n3"]
    assert progress.match > sim.nodes["n3"].applied_index  # the leader believes a lie


def voter_lost_acknowledged_write(variant: SimVariant | None = None):  # noqa: ANN201
    """The issue's data loss in Raft terms: a write is committed on n1 and n3 only; n3's
    disk loses it; the leader tells n3 so (one entry per APPEND, so n3 is still short);
    then n1 crashes and n2, which never had the write, asks n3 for its vote."""
    sim = Simulation(3, seed=43, variant=variant, max_append_entries=1)
    sim.campaign("n1")
    sim.settle()
    sim.cut("n1", "n2")  # n2 never receives the write
    write = sim.put("n1", "x", "acknowledged", request_id="w1")
    sim.run_until(lambda: write.done, 300, "write committed by n1 and n3")
    assert write.ok
    sim.crash("n3")
    sim.shorten_log("n3", 0)  # n3's data directory is gone
    sim.restart("n3")
    probe = sim.put("n1", "y", "probe")  # n1's next APPEND finds n3's log empty
    # n3 rejects (hint 0 < match); n1 probes at the acknowledged index with a nonce; n3's
    # fresh rejection confirms the loss; n1 resets n3's progress and marks its APPENDs.
    while not sim.core("n1").progress["n3"].catch_up_to:
        flight = sim.pending(type=APPEND, src="n1", dst="n3", where=lambda m: not m.context
                             or m.context.startswith(b"verify"))
        flight = flight or sim.pending(type=APPEND_RESPONSE, src="n3", dst="n1")
        sim.deliver(id=flight[0].id)
    sim.deliver(type=APPEND, src="n1", dst="n3",
                where=lambda m: m.context.startswith(b"catch-up"))
    assert sim.core("n3").commit_index < 2  # entry 1 only, and told to catch up to 2
    sim.crash("n1")
    sim.give_up(probe)
    sim.heal()
    sim.drop()
    for _ in range(200):  # n2 campaigns; only n3 can give it a majority
        sim.tick_nodes(["n2", "n3"])
        sim.settle()
    sim.restart("n1")
    converge(sim)
    return sim, write


def voter_lost_acknowledged_write_problems(sim: Simulation, write) -> list[str]:  # noqa: ANN001
    value, _ = read_back(sim, sim.leader() or "n1", "x")
    problems = common_problems(sim)
    if value != "acknowledged":
        problems.append(f"x reads {value!r}: the acknowledged write is lost")
    return problems


def test_voter_that_lost_acknowledged_entries_grants_no_vote_until_caught_up() -> None:
    """n3 knows (from the leader) that it lost entries it had acknowledged, so it refuses
    n2's (pre-)votes: n2 lacks the write and cannot be elected; once n1 is back, the write
    is still there."""
    sim, write = voter_lost_acknowledged_write()
    assert sim.core("n3").term >= 1
    assert voter_lost_acknowledged_write_problems(sim, write) == []


def test_voter_that_lost_acknowledged_entries_elects_a_leader_without_them_when_it_votes() -> None:
    sim, write = voter_lost_acknowledged_write(broken.VOTES_AFTER_LOSING_ENTRIES)
    problems = voter_lost_acknowledged_write_problems(sim, write)
    assert any("acknowledged write is lost" in p for p in problems)
    assert Rule.ACKNOWLEDGED_WRITE_LOST in rules(sim) or any(
        "not linearizable" in p for p in problems
    )


def old_leader_with_diverged_commit(variant: SimVariant | None = None):  # noqa: ANN201
    """The issue's aftermath: a write is committed on n1 (leader) and n3 only; n3's disk
    loses it while n1 is cut off, so n3 never learns it lost anything and elects n2,
    which never had the write. n2 commits its NOOP at the write's index. Then n1 comes
    back: its COMMITTED log conflicts with the new leader's at index 2.

    Then, while n2 has applied nothing beyond n1's commit index (so it has no snapshot
    that could repair n1), n2 is cut off and time passes on n1 and n3 (n1 restarts
    half-way): n1 alone could give n3 the vote it needs. Then n2 is back and commits a write: its snapshot beyond
    index 2 can replace n1's log and state machine.

    Returns the simulation, the steps from the heal to n2's report, n1's (role, term,
    vote) after every tick of the cut-off phase, whether some leader then probed n1
    without end (messages still flowing after 10,000 deliveries), and the steps from
    n2's write until n1 held n2's log and state (-1: never, within 2,000 steps)."""
    sim = Simulation(3, seed=47, variant=variant)
    sim.campaign("n1")
    sim.settle()
    sim.cut("n1", "n2")  # n2 never receives the write
    write = sim.put("n1", "x", "acknowledged", request_id="w1")
    sim.run_until(lambda: write.done, 300, "write committed by n1 and n3")
    assert write.ok
    sim.settle()
    assert sim.core("n1").commit_index == 2
    sim.isolate("n1")
    sim.crash("n3")
    sim.shorten_log("n3", 1)  # n3's disk comes back without the write (entry 2)
    sim.restart("n3")
    sim.campaign("n2")  # with n3's vote: n3's shortened log looks no better than n2's
    assert sim.core("n2").log_entries()[1].term != sim.core("n1").log_entries()[1].term
    sim.heal()
    reported = sim.run_until(
        lambda: any(line.split()[1:3] == ["error", "n2:"] for line in sim.trace),
        300, required=False,
    )
    sim.cut("n2", "n1")
    sim.cut("n2", "n3")
    seen: list[tuple[Role, int, str | None]] = []
    probing_forever = False
    for tick in range(300):  # time passes on n1 and n3: n3 campaigns, n1 holds the vote
        if tick == 150:  # a restart forgets the flag, not the refusal (catch_up_to)
            sim.crash("n1")
            sim.restart("n1")
        sim.tick_nodes(["n1", "n3"])
        try:
            sim.settle()
        except SimulationStuck:
            probing_forever = True
        n1 = sim.core("n1")
        seen.append((n1.role, n1.term, n1.vote))
        if probing_forever:
            return sim, reported, seen, probing_forever, -1
    sim.heal()
    after = sim.put("n2", "y", "after", request_id="w2")
    sim.run_until(lambda: after.done, 300, "a write on n2 once it is back")
    repaired = sim.run_until(lambda: same_log_and_state(sim, "n1", "n2"), 2_000, required=False)
    return sim, reported, seen, probing_forever, repaired


def same_log_and_state(sim: Simulation, node: str, leader: str) -> bool:
    a, b = sim.core(node), sim.core(leader)
    if a.commit_index != b.commit_index or a.applied_index != b.applied_index:
        return False
    if sim.nodes[node].replica.digest() != sim.nodes[leader].replica.digest():
        return False
    low = max(a.log.snapshot_index, b.log.snapshot_index)
    return [a.log.term(i) for i in range(low, a.commit_index + 1)] == [
        b.log.term(i) for i in range(low, b.commit_index + 1)]


def test_old_leader_whose_committed_log_diverged_is_reported_never_votes_and_is_repaired() -> None:
    """n1 answers n2's APPENDs below its commit index by comparing the entries there
    with its own; the conflict at index 2 makes it refuse, report itself, and stop
    voting (durably); n2 reports n1 naming the index and both commit indexes, and counts
    n1 for nothing. With n2 cut off, n3 cannot be elected: n1 never grants it a vote,
    and never campaigns. Once n2 has applied beyond n1's commit index it takes a
    snapshot and sends it; n1 installs it although its own log claims more, and ends
    with n2's log and state machine."""
    sim, reported, seen, probing_forever, repaired = old_leader_with_diverged_commit()
    assert not probing_forever
    assert 0 <= reported <= 50, "n2 never reported n1's diverged commit"
    leader_error = [line for line in sim.trace if line.split()[1:3] == ["error", "n2:"]]
    assert len(leader_error) == 1, leader_error
    assert "follower n1's committed log diverged from ours at index 2 (its commit index 2, " \
        "ours 2)" in leader_error[0], leader_error
    own_error = [line for line in sim.trace if line.split()[1:3] == ["error", "n1:"]]
    assert own_error and "diverged from leader n2's at index 2 (term 1 here, " in own_error[0]
    heal_term = sim.core("n2").term
    assert all(role is Role.FOLLOWER for role, _, _ in seen), sorted({r for r, _, _ in seen})
    assert all(vote is None for _, term, vote in seen if term > heal_term)
    assert 0 <= repaired <= 200, f"n1 never got n2's log and state: {sim.core('n1')}"
    n1 = sim.core("n1")
    assert not n1.log_diverged and not n1.lost_entries_forbid_vote()
    sim.run_until(lambda: sim.core("n2").progress["n1"].match == sim.core("n2").log.last_index(),
                  200, "n2 to stream to n1 again")


def test_old_leader_whose_committed_log_diverged_goes_unnoticed_and_votes_when_it_answers_as_a_match() -> None:
    """The same run with the shortcut taken on trust: the core reports nothing, n1 gives
    n3 the vote it needs, and n3 then probes n1 without end (the issue's symptom). Only
    the shells' rule watch (system/raft/watch.py) says so: n1's, that a committed conflict
    went unnoticed; n3's, that it keeps probing n1 at an index n1 had acknowledged."""
    sim, reported, seen, probing_forever, repaired = old_leader_with_diverged_commit(
        broken.ANSWERS_BELOW_COMMIT_AS_MATCH)
    assert reported < 0
    assert not any("this node's committed log diverged" in line or "follower n1's committed"
                   in line for line in sim.trace)
    assert {(node, rule) for node, rule, _ in sim.safety_reports} == {
        ("n1", "committed-conflict-unnoticed"), ("n3", "rejections-at-match-ignored")}, \
        sim.safety_reports
    heal_term = sim.core("n2").term
    voted = [vote for _, term, vote in seen if term > heal_term and vote is not None]
    assert voted == ["n3"] * len(voted) and voted, seen[-3:]
    assert sim.core("n3").role is Role.LEADER
    assert probing_forever and repaired < 0
