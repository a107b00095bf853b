"""The node shell's RuleWatch (system/raft/watch.py): silent on the safe core over many
swarm seeds, and each broken core of system/raft/unsafe.py that it can see is reported
under the rule it breaks, within a bounded number of seeds."""

from __future__ import annotations

import pytest

from checker import check_versioned_kv
from system.raft.core import MembershipChangeKind, MembershipChangeRefused
from system.sim.simulation import Simulation
from system.sim.swarm import SwarmRun
from system.sim.unsafe import variant_for as sim_variant

SAFE_SEEDS = 300

# (variant, the rule the watch names, seeds tried): about three expected hits in the range
# at the rates a 200-seed swarm measured (e.g. commits-past-verified-entries 8 of 200).
CAUGHT = [
    ("commits-old-term-entries", "leader-committed-old-term", 30),
    ("votes-twice", "voted-twice", 30),
    ("counts-votes-from-older-terms", "leader-without-majority-of-votes", 200),
    ("accepts-appends-from-older-terms", "stale-append-taken", 40),
    ("commits-past-verified-entries", "commit-past-verified", 150),
    ("truncates-without-a-conflict", "truncated-without-conflict", 30),
    ("ignores-higher-term-answers", "higher-term-ignored", 30),
    ("counts-unsynced-self", "leader-committed-without-majority", 30),
    ("installs-snapshot-by-index-only", "snapshot-kept-conflicting-log", 60),
    ("changes-membership-before-committing-in-term", "membership-change-before-commit-in-term", 40),
    ("allows-two-membership-changes-in-flight", "membership-changes-overlap", 30),
    ("skips-pre-vote", "election-without-pre-vote", 20),
]


def _reports(seed: int, name: str | None) -> list[tuple[str, str, str]]:
    run = SwarmRun(seed, sim_variant(name) if name else None, record_trace=False,
                   check=check_versioned_kv)
    run.run()
    return run.sim.safety_reports


def test_the_safe_core_never_gives_the_watch_a_finding() -> None:
    found = {seed: reports for seed in range(SAFE_SEEDS) if (reports := _reports(seed, None))}
    assert not found, found


@pytest.mark.parametrize(("name", "rule", "seeds"), CAUGHT, ids=[c[0] for c in CAUGHT])
def test_a_broken_core_is_reported_under_the_rule_it_breaks(name: str, rule: str, seeds: int) -> None:
    for seed in range(seeds):
        reports = _reports(seed, name)
        if any(r == rule for _, r, _ in reports):
            text = next(t for _, r, t in reports if r == rule)
            assert text.startswith("n") and len(text) > 60, text  # says who and why
            return
    pytest.fail(f"{name}: no {rule} report in {seeds} swarm seeds")


def test_a_membership_change_before_the_leaders_first_commit_is_reported() -> None:
    """The watch's own check at the call, whatever the core allows: a leader of a new term
    that has not committed an entry of it is refused by the safe core (nothing reported),
    and reported when a broken core lets the change through."""
    for name, reported in ((None, False), ("changes-membership-before-committing-in-term", True)):
        rules = _change_at_a_new_leader(name)
        assert rules == (["membership-change-before-commit-in-term"] if reported else []), rules


def _change_at_a_new_leader(name: str | None) -> list[str]:
    """A learner added at a leader elected a moment ago; what the watch reported."""
    sim = Simulation(node_count=3, seed=5, variant=sim_variant(name) if name else None)
    sim.run_until(lambda: sim.leader() is not None, 2_000, "a leader")
    old = sim.leader()
    sim.run_until(lambda: sim.core(old).commit_index >= 1, 500, "its first commit")
    sim.crash(old)
    sim.run_until(lambda: sim.leader() not in (None, old), 2_000, "a new leader")
    new = sim.leader()
    core, shell = sim.core(new), sim.nodes[new]
    assert core.log.term(core.log.committed) != core.term, "the new leader committed already"
    try:
        shell.watch.change_membership(core, MembershipChangeKind.ADD_LEARNER, "n9")
    except MembershipChangeRefused:
        assert name is None, "the broken core refused"
    return [rule for rule, _ in shell.watch.take()]


def test_garbage_passes_the_watch_to_the_core_which_refuses_it() -> None:
    """No bad input crashes a node: the core refuses a malformed message (`malformed`), and
    the watch in front of it must not raise on it first."""
    from dataclasses import replace

    from system.raft.messages import Message, MessageType

    sim = Simulation(node_count=3, seed=5)
    sim.run_until(lambda: sim.leader() is not None, 2_000, "a leader")
    node = sim.leader()
    core, watch = sim.core(node), sim.nodes[node].watch
    good = Message(MessageType.APPEND_RESPONSE, "n2" if node != "n2" else "n1", node, core.term)
    for bad in (None, "append", replace(good, index="7"), replace(good, term=None),
                replace(good, type="append")):
        before = core.ignored_message_count
        watch.step(core, bad)  # type: ignore[arg-type]
        assert core.ignored_message_count == before + 1, bad
    assert watch.take() == []


@pytest.mark.parametrize("keep_through", [0, 3])
def test_a_leader_probing_a_follower_whose_log_went_backwards_forever_is_named(
        keep_through: int) -> None:
    from tests.raft import broken
    from tests.raft.test_interleavings import follower_log_went_backwards

    sim, *_ = follower_log_went_backwards(keep_through=keep_through)
    assert not sim.safety_reports  # the safe leader finds out in one verify round
    sim, *_ = follower_log_went_backwards(broken.IGNORES_FOLLOWER_LOG_WENT_BACKWARDS,
                                          keep_through=keep_through)
    rules = [(node, rule) for node, rule, _ in sim.safety_reports]
    assert ("n1", "rejections-at-match-ignored") in rules, sim.safety_reports
