"""Which nodes the end-of-run replica reads skip (nemesis/runner.py `not_read_back`): a node
down after the heal, and one that is not a member after member changes."""

from __future__ import annotations

from types import SimpleNamespace

from nemesis.runner import not_read_back


class _Platform:
    def __init__(self, running: set[str], members: tuple[set[str], set[str]] | Exception,
                 membership: bool = True) -> None:
        self.node_ids = ["n1", "n2", "n3", "n4"]
        self.running = running
        self.members = members
        self.membership_supported = membership
        self.asked = 0

    def is_running(self, node: str) -> bool:
        return node in self.running

    def supports_membership(self) -> bool:
        return self.membership_supported

    def membership(self) -> tuple[set[str], set[str]]:
        self.asked += 1
        if isinstance(self.members, Exception):
            raise self.members
        return self.members


def _nemesis(faults: list[str]) -> SimpleNamespace:
    return SimpleNamespace(faults=faults, refused=set(), rejoining=set())


def test_a_node_down_at_the_end_is_skipped_and_membership_is_not_asked_without_changes() -> None:
    platform = _Platform({"n1", "n2", "n3"}, ({"n1"}, set()))
    assert not_read_back(platform, _nemesis(["partition", "kill"])) == {"n4": "down at the end"}
    assert platform.asked == 0


def test_after_member_changes_a_non_member_is_skipped_and_a_learner_is_read() -> None:
    platform = _Platform({"n1", "n2", "n3", "n4"}, ({"n1", "n2"}, {"n3"}))
    assert not_read_back(platform, _nemesis(["member"])) == {"n4": "not a member at the end"}


def test_membership_unknown_reads_every_running_node() -> None:
    platform = _Platform({"n1", "n2", "n3", "n4"}, RuntimeError("no leader"))
    assert not_read_back(platform, _nemesis(["member"])) == {}
