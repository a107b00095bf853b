"""The `election` fault (nemesis/elections.py): its steps, what it records, and that it
leaves nothing in place.

The unit tests drive it against a scripted cluster (`ElectionPlatform`): nodes that lose
their leader become pre-candidates, a frozen node answers nothing and keeps its state, and
thawing the voters elects the candidates (both, as a core that votes twice would). The
slow test runs the real store under the fault and checks the run is valid.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from nemesis import elections
from nemesis.faults import Nemesis
from tests.nemesis.test_nemesis_schedule import FakePlatform

REPO = Path(__file__).resolve().parents[2]


class ElectionPlatform(FakePlatform):
    """n1 leads term 1 until killed. A node cut from the leader loses it; once the leader
    is dead every running node pre-campaigns for term 2; thawing every frozen voter elects
    each candidate (`double=True`) or the first only. `campaign=False`: nobody ever
    becomes a pre-candidate (the window never opens)."""

    def __init__(self, nodes: int = 5, *, double: bool = True, campaign: bool = True) -> None:
        super().__init__(nodes)
        self.double, self.campaign = double, campaign
        self.lead, self.term = "n1", 1
        self.roles = {n: "follower" for n in self.node_ids}
        self.roles["n1"] = "leader"
        self.leaders = {n: "n1" for n in self.node_ids}
        self.log: list[str] = []  # pause / resume / kill / start, in order
        self.frozen_voters: set[str] = set()  # the nodes cut from the leader

    def leader(self) -> str | None:
        return self.lead

    def status(self, node_id: str, timeout_s: float = 0.5):  # noqa: ANN201
        if node_id in self.down or node_id in self.paused:
            return None
        return SimpleNamespace(role=self.roles[node_id], term=self.term,
                               leader_id=self.leaders[node_id] or "", commit_index=100,
                               last_index=50)

    def cut(self, src: str, dst: str) -> None:
        super().cut(src, dst)
        if src == self.lead and self.campaign:
            self.frozen_voters.add(dst)  # cut off first: the voters, never elected here
            self.leaders[dst] = ""
            self.roles[dst] = "pre-candidate"

    def kill(self, node_id: str) -> None:
        super().kill(node_id)
        self.log.append(f"kill {node_id}")
        if node_id == self.lead:
            self.lead = None
            for n in self.node_ids:
                if n not in self.down and n not in self.paused and self.campaign:
                    self.roles[n], self.leaders[n] = "pre-candidate", ""

    def kill_nodes(self, node_ids: list[str]) -> None:
        for n in node_ids:
            self.kill(n)

    def start_node(self, node_id: str) -> None:
        super().start_node(node_id)
        self.log.append(f"start {node_id}")
        self.roles[node_id], self.leaders[node_id] = "follower", ""

    def wait_started(self, node_id: str, timeout_s: float) -> int | None:
        return None

    def pause(self, node_id: str) -> None:
        super().pause(node_id)
        self.log.append(f"pause {node_id}")

    def resume(self, node_id: str) -> None:
        was = node_id in self.paused
        super().resume(node_id)
        self.log.append(f"resume {node_id}")
        if was and self.lead is None and not any(
                r == "pre-candidate" and n in self.paused for n, r in self.roles.items()):
            self._elect()

    def _elect(self) -> None:
        """Every frozen pre-candidate is thawed: the running pre-candidates win term 2."""
        candidates = sorted(n for n, r in self.roles.items()
                            if r == "pre-candidate" and n not in self.down and n not in self.paused
                            and self.leaders[n] == "" and n not in self.frozen_voters)
        if len(candidates) < 2:
            return
        self.term = 2
        winners = candidates[:2] if self.double else candidates[:1]
        for n in self.node_ids:
            self.roles[n] = "leader" if n in winners else "follower"
            self.leaders[n] = n if n in winners else winners[0]
        self.lead = winners[0]


def _nemesis(platform: FakePlatform) -> tuple[Nemesis, list[tuple[str, dict[str, Any]]]]:
    events: list[tuple[str, dict[str, Any]]] = []
    nemesis = Nemesis(platform, ["election"], seed=4, interval_s=0.01,
                      record=lambda f, v: events.append((f, v)))
    return nemesis, events


@pytest.fixture(autouse=True)
def _quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(elections, "WATCH_S", 0.05)
    monkeypatch.setattr(elections, "SETTLE_S", 0.0)
    monkeypatch.setattr(elections, "REQUESTS_OUT_S", 0.0)
    monkeypatch.setattr(elections, "OPEN_TIMEOUT_S", 0.3)
    monkeypatch.setattr(elections, "STEP_TIMEOUT_S", 0.3)
    monkeypatch.setattr(elections, "SETTLE_TIMEOUT_S", 0.3)


@pytest.mark.parametrize(("nodes", "voters"), [(5, 2), (7, 3), (9, 4)])
def test_the_voters_frozen_leave_each_candidate_one_short_of_a_majority(nodes: int, voters: int) -> None:
    import random

    names = [f"n{i}" for i in range(1, nodes + 1)]
    frozen, candidates = elections.split(names, "n1", random.Random(1))
    assert len(frozen) == voters and "n1" not in frozen + candidates
    assert sorted(frozen + candidates) == names[1:]
    quorum = nodes // 2 + 1
    assert len(candidates) < quorum <= 1 + len(frozen)  # alone short; self + voters enough


def test_split_vote_strikes_when_every_candidate_waits_on_the_frozen_voters() -> None:
    platform = ElectionPlatform()
    nemesis, events = _nemesis(platform)
    fault = nemesis.begin_next()
    assert fault is not None
    start = events[-1][1]
    assert events[-1][0] == "election" and start["shape"] == "split-vote"
    window = start["window"]
    assert window["old_leader"] == "n1" and window["term"] == 2
    assert start["landed"] is True, start["landed_evidence"]
    assert "pre-candidates for term 2" in start["landed_evidence"]
    # The voters were frozen before the leader was killed, and thawed together at the end.
    voters = window["voters"]
    order = platform.log
    assert max(order.index(f"pause {v}") for v in voters) < order.index("kill n1")
    assert all(order.index(f"resume {v}") > order.index("kill n1") for v in voters)
    assert window["leaders"] == {"2": sorted(window["candidates"])}
    assert window["two_leaders_in_one_term"] is True
    # The candidates stay cut from each other until the heal; then nothing is left.
    a, b = window["candidates"]
    assert {(a, b), (b, a)} <= platform.cut_set and not platform.paused
    nemesis.end(fault)
    assert events[-1][0] == "restart" and events[-1][1]["id"] == start["id"]
    assert not platform.cut_set and not platform.paused and not platform.down
    assert nemesis.election_counts == {"split-vote": {"aimed": 1, "landed": 1}}


def test_a_window_that_never_opens_is_recorded_as_missed_and_undone() -> None:
    platform = ElectionPlatform(campaign=False)
    nemesis, events = _nemesis(platform)
    fault = nemesis.begin_next()
    assert fault is not None
    start = events[-1][1]
    assert start["landed"] is False and "were not all pre-candidates" in start["landed_evidence"]
    nemesis.end(fault)
    assert not platform.cut_set and not platform.paused and not platform.down
    assert nemesis.election_counts == {"split-vote": {"aimed": 1, "landed": 0}}


def test_no_settled_leader_is_a_skip_with_nothing_done() -> None:
    platform = ElectionPlatform()
    platform.leaders["n3"] = "n2"  # n3 follows another leader: an election is going on
    nemesis, events = _nemesis(platform)
    assert nemesis.begin_next() is None
    assert events[-1][0] == "nemesis-skip" and "no leader that every node follows" in \
        events[-1][1]["description"]
    assert platform.log == [] and not platform.cut_set


class DeposedPlatform(ElectionPlatform):
    """The deposed-leader shape's cluster: once n1 (leader of term 1) is cut off and
    frozen, n2 wins term 2 at the next look (`elect=False`: nobody does). Thawed, n1 says
    it leads term 1 and, once a link from a follower of n2 to it is healed, moves to term
    2 (`steps_down=False`: it never does, as a leader deaf to higher terms)."""

    def __init__(self, *, elect: bool = True, steps_down: bool = True) -> None:
        super().__init__(campaign=False)
        self.elect, self.steps_down = elect, steps_down
        self.answered_as_leader = False  # n1 answered once since n2 won term 2

    def status(self, node_id: str, timeout_s: float = 0.5):  # noqa: ANN201
        if self.elect and "n1" in self.paused and self.term == 1 \
                and all(("n1", n) in self.cut_set for n in self.node_ids if n != "n1"):
            self.term, self.lead = 2, "n2"
            for n in self.node_ids[1:]:
                self.roles[n], self.leaders[n] = ("leader" if n == "n2" else "follower"), "n2"
        st = super().status(node_id, timeout_s)
        if st is not None and node_id == "n1":
            heard = self.steps_down and self.answered_as_leader and any(
                (n, "n1") not in self.cut_set for n in self.node_ids if n not in ("n1", "n2"))
            st.role, st.term = ("follower", 2) if heard and self.term == 2 else ("leader", 1)
            self.answered_as_leader = self.term == 2
        return st


def _deposed(platform: DeposedPlatform) -> tuple[Any, Nemesis, dict[str, Any]]:
    nemesis, events = _nemesis(platform)
    nemesis._decks["election-shape"] = ["deposed-leader"]
    fault = nemesis.begin_next()
    assert fault is not None and events[-1][0] == "election"
    return fault, nemesis, events[-1][1]


def test_deposed_leader_thaws_the_old_leader_among_its_successors_followers() -> None:
    platform = DeposedPlatform()
    fault, nemesis, start = _deposed(platform)
    assert start["shape"] == "deposed-leader" and start["landed"] is True, start["landed_evidence"]
    window = start["window"]
    assert (window["old_leader"], window["old_term"]) == ("n1", 1)
    assert (window["successor"], window["new_term"]) == ("n2", 2)
    assert window["first_answer_after_thaw"] == ["leader", 1] and window["learned_new_term"]
    # Frozen after its links were cut, thawed only once n2 led; until the heal it stays
    # cut from n2 alone, so what tells it of term 2 is its followers' answers.
    assert platform.log == ["pause n1", "resume n1"]
    assert platform.cut_set == {("n1", "n2"), ("n2", "n1")}
    assert window["cut_until_heal"] == [["n2", "n1"], ["n1", "n2"]]
    nemesis.end(fault)
    assert not platform.cut_set and not platform.paused and not platform.down
    assert nemesis.election_counts == {"deposed-leader": {"aimed": 1, "landed": 1}}


def test_deposed_leader_deaf_to_the_new_term_still_lands_and_is_said_to_stay() -> None:
    platform = DeposedPlatform(steps_down=False)
    fault, nemesis, start = _deposed(platform)
    assert start["landed"] is True and "stayed at term 1" in start["landed_evidence"]
    assert start["window"]["learned_new_term"] is False
    nemesis.end(fault)
    assert not platform.cut_set and not platform.paused


def test_deposed_leader_without_a_successor_is_a_miss_and_undone() -> None:
    platform = DeposedPlatform(elect=False)
    fault, nemesis, start = _deposed(platform)
    assert start["landed"] is False and "no node of n2 n3 n4 n5 led a term after 1" in \
        start["landed_evidence"]
    assert not platform.paused  # thawed at once; its links healed with the fault
    nemesis.end(fault)
    assert not platform.cut_set and not platform.paused and not platform.down
    assert nemesis.election_counts == {"deposed-leader": {"aimed": 1, "landed": 0}}


class LateGrantPlatform(ElectionPlatform):
    """Holds one peer lane as the local platform does: `lane_held_bytes` is what the held
    voter answered once thawed; the watched candidate asks for the later term (the
    release fires) once every node it was cut from runs again (`asks=False`: never)."""

    def __init__(self, *, asks: bool = True) -> None:
        super().__init__()
        self.asks = asks
        self.held: tuple[str, str] | None = None
        self.held_bytes = 0
        self.watched: tuple[str, list[str]] | None = None
        self.fired: threading.Event | None = None
        self.released = 0

    def hold_lane(self, src: str, dst: str) -> None:
        self.log.append(f"hold {src}->{dst}")
        self.held = (src, dst)

    def resume(self, node_id: str) -> None:
        super().resume(node_id)
        if self.held is not None and node_id == self.held[0]:
            self.held_bytes = 40  # its grant, kept
        if self.watched is not None and self.asks and self.fired is not None:
            first, rest = self.watched
            if not any(n in self.paused or (first, n) in self.cut_set for n in rest):
                self.log.append("vote of the later term seen; held lane released")
                self.fired.set()

    def lane_held_bytes(self, src: str, dst: str) -> int:
        return self.held_bytes if self.held == (src, dst) else 0

    def release_on_vote(self, src: str, dsts: list[str], term: int,
                        held: tuple[str, str]) -> threading.Event:
        self.watched, self.fired = (src, list(dsts)), threading.Event()
        self.log.append(f"watch {src} for term {term}")
        return self.fired

    def stop_watching(self, src: str, dsts: list[str]) -> None:
        self.watched = None

    def release_held(self) -> int:
        self.held, self.released = None, self.released + 1
        return 0


def _late_grant(platform: LateGrantPlatform) -> tuple[Any, Nemesis, dict[str, Any]]:
    nemesis, events = _nemesis(platform)
    nemesis._decks["election-shape"] = ["late-grant"]
    fault = elections.Election(nemesis)
    fault._role_at = lambda node, roles, term: True  # type: ignore[method-assign]
    fault._term_of = lambda node: 2  # type: ignore[method-assign]
    started = fault.begin()
    assert started is not None and events[-1][0] == "election"
    return started, nemesis, events[-1][1]


def test_late_grant_holds_one_voters_grant_until_its_candidate_asks_again() -> None:
    platform = LateGrantPlatform()
    fault, nemesis, start = _late_grant(platform)
    assert start["shape"] == "late-grant" and start["landed"] is True, start["landed_evidence"]
    window = start["window"]
    first, late = window["candidate"], window["late_voter"]
    rest = [n for n in platform.node_ids if n not in (first, late, "n1")]
    order = platform.log
    # Held before the candidate asks; the voter thawed (grants) only after; the others
    # thawed only once it was frozen again, and the lanes released at their ask.
    assert order.index(f"hold {late}->{first}") < order.index(f"resume {first}") \
        < max(i for i, e in enumerate(order) if e == f"resume {late}")
    released = order.index("vote of the later term seen; held lane released")
    assert max(i for i, e in enumerate(order) if e == f"pause {late}") < min(
        order.index(f"resume {n}", order.index(f"resume {first}")) for n in rest) <= released
    assert "vote of the later term seen; held lane released" in order
    assert window["held_bytes"] == 40
    # Nothing of the strike stays: lanes watched or held, nodes frozen; the links the
    # shape cut were healed before the others were thawed.
    assert platform.watched is None and platform.held is None and not platform.paused
    assert not any(a == first for a, _ in platform.cut_set)
    nemesis.end(fault)
    assert not platform.cut_set and not platform.paused and not platform.down
    assert nemesis.election_counts == {"late-grant": {"aimed": 1, "landed": 1}}


def test_late_grant_whose_candidate_never_asks_again_is_a_miss_and_undone() -> None:
    platform = LateGrantPlatform(asks=False)
    fault, nemesis, start = _late_grant(platform)
    assert start["landed"] is False and "did not ask for term 3" in start["landed_evidence"]
    assert platform.watched is None and platform.held is None and platform.released == 1
    nemesis.end(fault)
    assert not platform.cut_set and not platform.paused and not platform.down


def test_a_platform_that_cannot_hold_a_lane_is_never_dealt_late_grant() -> None:
    platform = ElectionPlatform()
    platform.leaders["n3"] = "n2"  # no settled leader: each draw is a skip naming its shape
    nemesis, events = _nemesis(platform)
    for _ in range(3 * len(elections.SHAPES)):
        elections.Election(nemesis).begin()
    dealt = {v["shape"] for f, v in events if f == "nemesis-skip"}
    assert dealt == set(elections.SHAPES) - {"late-grant"}


class RestartPlatform(ElectionPlatform):
    """A voter restarted by the fault answers Status at `restart_term` (2: the contested
    term, where it stood when killed; 3: its election timer fired before it was frozen).
    A pre-candidate thawed after the restarts answers `second_role` at term 2 (it found
    its pre-vote grants; "pre-candidate": its timer fired again before it was frozen)."""

    def __init__(self, restart_term: int, second_role: str = "candidate") -> None:
        super().__init__()
        self.restart_term, self.second_role = restart_term, second_role
        self.restarted: set[str] = set()

    def start_node(self, node_id: str) -> None:
        super().start_node(node_id)
        self.restarted.add(node_id)

    def status(self, node_id: str, timeout_s: float = 0.5):  # noqa: ANN201
        st = super().status(node_id, timeout_s)
        if st is not None and node_id in self.restarted:
            st.term = self.restart_term
        elif st is not None and self.restarted and st.role == "pre-candidate":
            st.role, st.term = self.second_role, 2
        return st


def _vote_then_restart(platform: ElectionPlatform) -> tuple[Any, Nemesis, dict[str, Any]]:
    nemesis, events = _nemesis(platform)
    nemesis._decks["election-shape"] = ["vote-then-restart"]

    def at_term(node: str, roles: tuple[str, ...], term: int) -> bool:
        return True  # the scripted cluster has no per-node roles; the order is the point

    fault = elections.Election(nemesis)
    fault._role_at = at_term  # type: ignore[method-assign]
    fault._term_of = lambda node: 2  # type: ignore[method-assign]
    started = fault.begin()
    assert started is not None
    return started, nemesis, events[-1][1]


def test_vote_then_restart_restarts_the_voters_before_the_second_candidate_thaws() -> None:
    platform = RestartPlatform(restart_term=2)
    started, nemesis, start = _vote_then_restart(platform)
    assert start["shape"] == "vote-then-restart" and start["landed"] is True, start
    assert "frozen at term 2" in start["landed_evidence"]
    window = start["window"]
    voters, (first, second) = window["voters"], window["candidates"]
    assert {v: r[:2] for v, r in window["voters_restarted"].items()} == {v: ["follower", 2] for v in voters}
    order = platform.log
    killed = min(order.index(f"kill {v}") for v in voters)
    # Each voter frozen right after its own start, before the next one starts.
    for a, b in zip(voters, voters[1:], strict=False):
        assert order.index(f"start {a}") < order.index(f"pause {a}", killed) \
            < order.index(f"start {b}")
    refrozen = max(order.index(f"pause {v}", killed) for v in voters)
    asks = order.index(f"resume {second}", refrozen)  # thawed to ask them, then frozen
    rethawed = [order.index(f"resume {v}", asks) for v in voters]
    assert order.index(f"pause {second}") < killed
    assert asks < order.index(f"pause {second}", asks) < min(rethawed)
    assert max(rethawed) < order.index(f"resume {second}", max(rethawed)) \
        < len(order) - 1 - order[::-1].index(f"resume {first}")
    nemesis.end(started)
    assert not platform.cut_set and not platform.paused and not platform.down


def test_vote_then_restart_is_a_miss_when_a_restarted_voter_moved_on_before_its_freeze() -> None:
    """On docker the voters start seconds apart: one whose election timer fired first
    answers at a later term, and the second candidate's request is no longer a request
    in the term the voter forgot its vote of (the runs of issue 21 counted that landed)."""
    platform = RestartPlatform(restart_term=3)
    started, nemesis, start = _vote_then_restart(platform)
    assert start["landed"] is False
    assert "restarted voters not frozen at term 2" in start["landed_evidence"]
    nemesis.end(started)
    assert not platform.cut_set and not platform.paused and not platform.down
    assert nemesis.election_counts == {"vote-then-restart": {"aimed": 1, "landed": 0}}


def test_vote_then_restart_is_a_miss_when_the_second_candidate_left_the_term_before_its_freeze() -> None:
    """Over SSH a freeze takes a round trip: the second candidate's timer fired (it was a
    pre-candidate again) before it froze, and the voters' grants came too late."""
    platform = RestartPlatform(restart_term=2, second_role="pre-candidate")
    started, nemesis, start = _vote_then_restart(platform)
    assert start["landed"] is False
    assert "was not a candidate for term 2 once thawed and until frozen" in \
        start["landed_evidence"]
    nemesis.end(started)
    assert not platform.cut_set and not platform.paused and not platform.down


def test_election_needs_five_nodes_but_on_sim_and_all_leaves_it_out_below(capsys) -> None:  # noqa: ANN001
    from nemesis.cli import _fit_all, main

    assert main(["run", "--faults", "election", "--nodes", "3", "--platform", "local",
                 "--duration", "5"]) == 3
    assert "--faults election needs at least 5 nodes" in capsys.readouterr().err
    kept, note = _fit_all(["partition", "election"], "", 3)
    assert kept == ["partition"] and "election (needs 5 nodes)" in note
    # The simulator's two shapes split no followers into voters and candidates.
    assert _fit_all(["partition", "election"], "", 3, "sim") == (["partition", "election"], "")


@pytest.mark.integration
@pytest.mark.slow
def test_the_real_store_stays_valid_under_election_faults(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "nemesis", "run", "--platform", "local", "--faults", "election",
         "--duration", "30", "--interval", "3", "--seed", "4290", "--store", str(tmp_path / "store")],
        cwd=tmp_path, capture_output=True, text=True, timeout=400,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = (tmp_path / "store" / "latest").resolve()
    events = [json.loads(line) for line in (run_dir / "nemesis.jsonl").read_text().splitlines()]
    starts = [e for e in events if e["f"] == "election"]
    assert starts, events
    for start in starts:  # every strike says what it aimed at and whether it landed
        assert start["shape"] in elections.SHAPES and isinstance(start["landed"], bool)
        window = start["window"]
        if start["shape"] == "deposed-leader":  # no voters: a leader and its successor
            assert window["old_leader"] and (window.get("successor") or not start["landed"])
        else:
            assert window["voters"] and window["candidates"]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["valid"] is True


# ----- the rollback fault (nemesis/rollback.py) ---------------------------------------------


class RollbackPlatform(ElectionPlatform):
    """n1 leads; its commit index grows by 100 at every Status read. After `restore_data`
    the target reports `catch_up_to` above its commit (`told`), and once the leader is
    dead its commit index is `commit_after_strike`."""

    def __init__(self, *, told: bool = True, commit_after_strike: int = 50) -> None:
        super().__init__(5)
        self.told, self.commit_after_strike = told, commit_after_strike
        self.commit = 1000
        self.restored: str | None = None
        self.saved: set[str] = set()

    def status(self, node_id: str, timeout_s: float = 0.5):  # noqa: ANN201
        if node_id in self.down or node_id in self.paused:
            return None
        if node_id == "n1":
            self.commit += 100
        commit, catch_up_to = self.commit, 0
        if node_id == self.restored and self.told:
            commit = self.commit_after_strike if "n1" in self.down else 40
            catch_up_to = 5000
        return SimpleNamespace(role=self.roles[node_id], term=1, leader_id="n1",
                               commit_index=commit, last_index=commit, catch_up_to=catch_up_to)

    def save_data(self, node_id: str) -> None:
        assert node_id in self.down, "copied while running"
        self.log.append(f"save {node_id}")
        self.saved.add(node_id)

    def restore_data(self, node_id: str) -> None:
        assert node_id in self.down and node_id in self.saved
        self.log.append(f"restore {node_id}")
        self.restored = node_id

    def set_loss(self, src: str, dst: str, probability: float) -> None:
        super().set_loss(src, dst, probability)
        self.log.append(f"loss {src}->{dst}")

    def cut(self, src: str, dst: str) -> None:
        self.cut_set.add((src, dst))  # no leader change here


def _rollback(platform: RollbackPlatform) -> tuple[Any, Nemesis, list]:
    from nemesis import rollback

    nemesis, events = _nemesis(platform)
    nemesis.faults = ["rollback"]
    return rollback.rollback(nemesis), nemesis, events


@pytest.mark.parametrize(("nodes", "keepers", "held"), [(3, 0, 1), (5, 1, 2), (7, 2, 3)])
def test_rollback_roles_make_the_target_needed_for_every_commit_while_the_rest_is_away(
        nodes: int, keepers: int, held: int) -> None:
    import random

    from nemesis.rollback import roles

    names = [f"n{i}" for i in range(1, nodes + 1)]
    target, kept, away = roles(names, "n1", random.Random(2))
    assert len(kept) == keepers and len(away) == held
    assert sorted([target, *kept, *away]) == names[1:]
    quorum = nodes // 2 + 1
    assert 2 + len(kept) == quorum  # leader, keepers and target: every commit needs the target
    assert 1 + len(away) >= quorum  # after the strike: the target and the held-away elect


def test_rollback_runs_cap_appends_unless_told_otherwise() -> None:
    from nemesis.rollback import node_args

    assert node_args(["rollback"], []) == ["--max-append-entries", "16"]
    assert node_args(["rollback"], ["--max-append-entries", "8"]) == []
    assert node_args(["kill"], []) == []


def test_rollback_strikes_once_the_target_was_told_and_has_not_caught_up() -> None:
    platform = RollbackPlatform()
    fault, nemesis, events = _rollback(platform)
    assert fault is not None
    start = events[-1][1]
    assert events[-1][0] == "rollback" and start["landed"] is True, start["landed_evidence"]
    window = start["window"]
    target, held, keepers = start["target"], window["held_away"], window["keepers"]
    assert window["catch_up_to"] == 5000 and window["commit_after_strike"] == 50
    assert window["acknowledged_to"] >= window["cut_at_commit"] + 300
    log = platform.log
    # Saved while stopped; the leader frozen across the target's restore, then thawed;
    # the target's answers slowed before it came back; the leader killed last.
    assert log.index(f"save {target}") < log.index(f"restore {target}")
    assert log.index("pause n1") < log.index(f"kill {target}", log.index(f"save {target}") + 1)
    assert log.index(f"restore {target}") < log.index("resume n1") < log.index("kill n1")
    assert log.index(f"loss {target}->n1") < log.index(f"restore {target}")
    # At the strike: the keepers cut off, the held-away nodes reachable again.
    assert all((k, o) in platform.cut_set for k in keepers for o in platform.node_ids if o != k)
    majority = {target, *held}
    assert not any(a in majority and b in majority for a, b in platform.cut_set)
    assert (target, "n1") not in platform.loss
    nemesis.end(fault)
    assert not platform.cut_set and not platform.paused and not platform.down
    assert nemesis.election_counts == {"rollback": {"aimed": 1, "landed": 1}}


def test_rollback_that_caught_up_before_the_strike_is_a_miss() -> None:
    platform = RollbackPlatform(commit_after_strike=6000)
    fault, nemesis, events = _rollback(platform)
    start = events[-1][1]
    assert start["landed"] is False and "had caught up" in start["landed_evidence"]
    nemesis.end(fault)
    assert not platform.cut_set and not platform.down


def test_rollback_never_strikes_a_target_that_was_not_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before a leader told it, a node restored from an older copy cannot know it lost
    anything, and its vote may elect a leader without those entries: the store's design
    cannot prevent that (docs/kv.md), so the fault must not strike there."""
    from nemesis import rollback

    monkeypatch.setattr(rollback, "TOLD_TIMEOUT_S", 0.2)
    platform = RollbackPlatform(told=False)
    fault, nemesis, events = _rollback(platform)
    start = events[-1][1]
    assert start["landed"] is False and "no strike" in start["landed_evidence"]
    assert "kill n1" not in platform.log and not platform.cut_set and not platform.loss
    nemesis.end(fault)
    assert not platform.down and not platform.paused


@pytest.mark.integration
@pytest.mark.slow
def test_the_real_store_stays_valid_under_rollback_faults(tmp_path: Path) -> None:
    """Whether a strike lands depends on timing (how fast the target catches up); that it
    is recorded either way, and that the store loses nothing, does not."""
    proc = subprocess.run(
        [sys.executable, "-m", "nemesis", "run", "--platform", "local", "--faults", "rollback",
         "--duration", "45", "--interval", "3", "--seed", "4291", "--store", str(tmp_path / "store")],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = (tmp_path / "store" / "latest").resolve()
    events = [json.loads(line) for line in (run_dir / "nemesis.jsonl").read_text().splitlines()]
    starts = [e for e in events if e["f"] == "rollback"]
    assert starts, events
    for start in starts:
        assert isinstance(start["landed"], bool) and start["landed_evidence"]
    results = json.loads((run_dir / "results.json").read_text())
    # A fault the run's end cut short is recorded but not counted as aimed.
    assert results["valid"] is True
    assert results.get("elections", {}).get("rollback", {}).get("aimed", 0) <= len(starts)


# ----- the rollback fault on the simulator (SimPlatform.aim_rollback) -------------------------


def _sim_rollback(tmp_path: Path, unsafe: str | None = None) -> tuple[Any, dict[str, Any]]:
    """A 3-node simulated cluster under a rollback aim, one write a tick through the
    leader (the fault needs commits that only the target can acknowledge)."""
    from nemesis.platforms.base import ClusterConfig
    from nemesis.platforms.sim import SimPlatform
    from nemesis.rollback import MAX_APPEND_ENTRIES
    from nemesis.sim_runner import variant_for_run
    from system.sim.history import Function

    # The runs' short APPENDs: a catch-up of many, not one that tells and repairs at once.
    platform = SimPlatform(ClusterConfig(nodes=3, run_id="t", work_dir=tmp_path), seed=5,
                           variant=variant_for_run(unsafe), max_append_entries=MAX_APPEND_ENTRIES)
    for _ in range(1000):
        if platform.ready():
            break
        platform.advance()
    leader = platform.leader()
    target, held = [n for n in platform.node_ids if n != leader]
    platform.aim_rollback(leader, target, [], [held], 60, 0.5)
    for tick in range(3000):
        if platform.rollback_aim["phase"] == "done":
            break
        now = platform.leader()
        if now is not None:
            op = platform.sim.invoke(Function.PUT, "k", f"v{tick}", request_id=f"w{tick}")
            platform.submit(op, now)
        platform.advance()
    aim = platform.rollback_aim
    assert aim["phase"] == "done" and aim["landed"] is True, aim["why"]
    assert aim["acknowledged_to"] >= aim["saved_last_index"] + 60
    assert aim["commit_after_strike"] < aim["catch_up_to"]
    return platform, aim


def test_on_the_simulator_a_rolled_back_voter_that_was_told_elects_no_one(tmp_path: Path) -> None:
    platform, aim = _sim_rollback(tmp_path)
    target, held = aim["target"], aim["held"][0]
    for _ in range(400):  # the old leader down, the keepers none: only target and held
        platform.advance()
        assert platform.leader() is None, "a leader without the entries the target lost"
    platform.end_rollback_aim()
    assert not platform.sim.network.cut_links and aim["leader"] in platform.sim.alive()
    for _ in range(400):
        platform.advance()
    assert platform.leader() is not None and not platform.sim.safety_reports
    assert {target, held} <= set(platform.sim.alive())


def test_on_the_simulator_a_voter_that_votes_after_losing_entries_elects_a_leader_without_them(
        tmp_path: Path) -> None:
    platform, aim = _sim_rollback(tmp_path, unsafe="votes-after-losing-entries")
    for _ in range(400):
        platform.advance()
        leader = platform.leader()
        if leader is not None:
            break
    assert leader in (aim["target"], aim["held"][0])
    assert platform.sim.core(leader).log.last_index() < aim["acknowledged_to"]
