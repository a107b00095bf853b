"""The member fault's change-at-new-leader on the simulator (SimPlatform.aim_change_at_new_leader):
the first node to lead after its predecessor was cut off is asked to remove it before it
can have committed anything of its term; the safe core refuses and nobody is removed, the
core that changes membership first takes it and the rule watch names it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.nemesis.test_sim_election import _advance_until, _rules
from tests.nemesis.test_sim_hold import _ready_platform


def _aim(platform: Any) -> tuple[str, dict[str, Any]]:
    old = platform.leader()
    for node in platform.node_ids:
        if node != old:
            platform.cut(old, node)
            platform.cut(node, old)
    platform.aim_change_at_new_leader(old)
    assert _advance_until(platform, lambda: platform.change_aim["new"] is not None)
    return old, platform.change_aim


@pytest.mark.parametrize("seed", [3, 4])
def test_the_new_leader_is_asked_before_it_committed_in_its_term_and_the_safe_core_refuses(
        tmp_path: Path, seed: int) -> None:
    platform = _ready_platform(tmp_path, nodes=5, seed=seed)
    old, aim = _aim(platform)
    assert aim["new"] != old and aim["new_term"] > aim["term"]
    assert aim["committed_in_term"] is False
    assert aim["outcome"] == "refused" and "not yet committed an entry of its term" in aim["detail"]
    assert platform.end_change_aim() is aim and platform.change_aim is None
    for _ in range(300):
        platform.advance()
    assert old in platform.membership()[0]  # nothing removed for good
    assert not platform.sim.safety_reports


def test_a_leader_that_changes_membership_before_committing_in_its_term_is_named(
        tmp_path: Path) -> None:
    platform = _ready_platform(tmp_path, nodes=5,
                               unsafe="changes-membership-before-committing-in-term")
    _, aim = _aim(platform)
    assert aim["outcome"] == "appended" and aim["committed_in_term"] is False
    assert "membership-change-before-commit-in-term" in _rules(platform)
