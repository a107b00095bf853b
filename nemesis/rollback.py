"""The `rollback` fault: a voter restarted on an older, consistent copy of its own data.

What a VM restored from a backup, or a disk that lost its recent writes at a record
boundary, looks like: every file valid, only older, so the node cannot tell (docs/kv.md,
"What it cannot detect"). The store's answer is the leader's: it finds the follower's log
shorter than what it acknowledged and tells it, and a node told so neither votes nor
campaigns until it has committed that far again (docs/raft.md, "A follower whose log went
backwards"). Before a leader has told it, the node does not know, and its vote can elect
a leader without entries it had acknowledged: no store can close that gap by itself, so
this fault never strikes there. It strikes only once the node says it was told (Status
`catch_up_to`) and has not caught up: the window where the rule is the only thing that
keeps its vote from losing acknowledged writes.

The steps, with n nodes and a majority q (the leader L, the target T, K = q - 2 keepers,
H = n - q held away):
1. T is killed, its data directory copied (the backup), and T is started again.
2. H is cut from every node: from now on each commit needs T (L, K and T are a majority),
   so T acknowledges every entry committed while H is away; the fault waits until the
   leader has committed LOST_MIN entries past T's log at the backup.
3. L is frozen (so that it stays the leader: with T down it has no majority, and
   check-quorum would depose it; only a leader that saw T acknowledge those entries can
   notice they are gone, a new one just sends them again), T is killed, its directory
   replaced by the backup, T started again, and L thawed. T's answers to L are slowed
   (each chunk held 200 ms with probability ANSWER_LOSS, the packet fault's loss): its
   rejections still reach L, which tells it, but its acknowledgements of the catch-up come
   late, so the catch-up takes several round trips of that.
4. As soon as T reports `catch_up_to` above its commit index, the strike: L is killed, K
   cut from every node, and H's links to T and to each other healed. T and H are a
   majority, all without the entries T lost: only T's vote can elect one of them.
   `landed`: T's commit index was still below `catch_up_to` after the strike (it only
   grows, so a late answer never says "inside" wrongly).
Healed (after the interval) by restarting L and healing K's links.

The runs start the nodes with `--max-append-entries 16` (unless given), so the catch-up of
a few hundred entries is many APPENDs, not one that tells and repairs in the same step.
Needs 3 nodes or more; with an even number the strike leaves T and H one short of a
majority, so the fault does nothing a broken vote could use.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from nemesis import partitions
from nemesis.platforms.base import PlatformError
from nemesis.windows import wait_or_stop

if TYPE_CHECKING:
    from nemesis.faults import ActiveFault, Nemesis

log = logging.getLogger("nemesis")

# 16: once the leader confirms a loss within a round trip (docs/raft-bugs-found.md, 5), a
# catch-up of 64-entry APPENDs could end before the restarted node answered its first
# Status, and the strike missed its window (1 of 3 runs).
MAX_APPEND_ENTRIES = 16
LOST_MIN = 300  # entries committed past T's backup while H is away (> a few APPENDs)
LOST_TIMEOUT_S = 30.0  # at the default 100 ops/s, 300 entries take 4-5 s
TOLD_TIMEOUT_S = 40.0  # T restarts, and the leader must confirm the loss through the slowed link
ANSWER_LOSS = 0.5  # share of T's answers to L held (each a retransmission timeout)
POLL_S = 0.005
START_TIMEOUT_S = 60.0  # a restarted node answers Status (a loaded machine)


def node_args(faults: list[str], given: list[str]) -> list[str]:
    """The node flags a run with the rollback fault adds to `given`."""
    if "rollback" not in faults or "--max-append-entries" in given:
        return []
    return ["--max-append-entries", str(MAX_APPEND_ENTRIES)]


def roles(nodes: list[str], leader: str, rng: Any) -> tuple[str, list[str], list[str]]:
    """(target, keepers, held away) among the followers of `leader`."""
    followers = sorted(n for n in nodes if n != leader)
    quorum = len(nodes) // 2 + 1
    target = rng.choice(followers)
    rest = [n for n in followers if n != target]
    held = sorted(rng.sample(rest, len(nodes) - quorum))
    return target, [n for n in rest if n not in held], held


class Rollback:
    def __init__(self, nemesis: Nemesis) -> None:
        self.nemesis = nemesis
        self.platform = nemesis.platform
        self.cut: set[tuple[str, str]] = set()
        self.killed: set[str] = set()
        self.frozen: str | None = None
        self.began = time.monotonic()

    def begin(self) -> ActiveFault | None:
        nemesis, platform = self.nemesis, self.platform
        leader = platform.leader()
        if leader is None:
            nemesis.record("nemesis-skip", {"fault": "rollback",
                                            "description": "rollback: no leader"})
            return None
        target, keepers, held = roles(nemesis.nodes, leader, nemesis.rng)
        window: dict[str, Any] = {"kind": "rollback", "leader": leader, "target": target,
                                  "keepers": keepers, "held_away": held}
        try:
            landed, why = self._steps(leader, target, keepers, held, window)
        except Exception:
            self._undo()
            raise
        # The record is written once the strike is made; its first step was this long before.
        window["seconds_since_first_step"] = round(time.monotonic() - self.began, 2)
        why = nemesis.count_aimed("rollback", landed, why)
        text = (f"rollback: {target} restarted on a copy of its data from before "
                f"{window.get('lost', '?')} entries it acknowledged; leader {leader}"
                f"{' killed' if landed else ''}, held away {' '.join(held) or '-'}, keepers "
                f"{' '.join(keepers) or '-'} ({'landed' if landed else 'missed'}: {why})")
        return nemesis._register("rollback", sorted({target, leader, *held, *keepers}), text,
                                 self._heal, {"target": target, "window": window,
                                              "landed": landed, "landed_evidence": why},
                                 "rollback")

    def _steps(self, leader: str, target: str, keepers: list[str], held: list[str],
               window: dict[str, Any]) -> tuple[bool, str]:
        nemesis, platform = self.nemesis, self.platform
        before = platform.status(target)
        saved_last = before.last_index if before is not None else 0
        self._restart(target, lambda: platform.save_data(target))
        self._step(f"{target} saved at about index {saved_last} and restarted")
        self._cut(partitions.cut_off(nemesis.nodes, held))
        # From here every commit needs the target's acknowledgement.
        cut_at = platform.status(leader, timeout_s=2.0)
        base = max(saved_last, cut_at.commit_index if cut_at is not None else 0)
        done = self._wait(lambda: (st := platform.status(leader, timeout_s=0.3)) is not None
                          and st.commit_index >= base + LOST_MIN and st, LOST_TIMEOUT_S)
        if done is None:
            self._heal_cut()
            return False, (f"leader {leader} did not commit {LOST_MIN} entries with "
                           f"{target}'s acknowledgement within {LOST_TIMEOUT_S:g} s")
        lost_to = done.commit_index
        window.update(saved_last_index=saved_last, cut_at_commit=base,
                      acknowledged_to=lost_to, lost=lost_to - saved_last)
        self._step(f"leader committed to {lost_to} (from {base} with {target}); rolling "
                   f"{target} back, the leader frozen meanwhile")
        # Frozen, the leader cannot step down for want of a majority (check-quorum) while
        # the target restarts: only a leader that saw the target acknowledge those entries
        # can notice that its log went backwards; a new one would just send them again.
        platform.set_loss(target, leader, ANSWER_LOSS)
        platform.pause(leader)
        self.frozen = leader
        try:
            self.nemesis.expected_down.add(target)
            platform.kill(target)
            platform.restore_data(target)
            platform.start_node(target)
            code = platform.wait_started(target, START_TIMEOUT_S)
            if code is None:
                self.nemesis.expected_down.discard(target)
        finally:
            platform.resume(leader)
            self.frozen = None
        if code is not None:
            raise PlatformError(f"{target} exited with code {code} on its restored data: "
                                f"{platform.exit_reason(target)}")
        told = self._wait(lambda: (st := platform.status(target, timeout_s=0.3)) is not None
                          and 0 < st.commit_index < st.catch_up_to and st, TOLD_TIMEOUT_S,
                          POLL_S)
        if told is None:
            st = platform.status(target)
            self._heal_cut()
            platform.heal_link(target, leader)
            return False, (f"{target} did not report a lost-entries catch-up it had not "
                           f"finished within {TOLD_TIMEOUT_S:g} s (catch_up_to "
                           f"{st.catch_up_to if st else '?'}, commit "
                           f"{st.commit_index if st else '?'}): no strike")
        # The strike: the leader dies, the keepers go, the held-away nodes come back.
        nemesis.expected_down.add(leader)
        self.killed.add(leader)
        platform.kill(leader)
        self._heal_cut()
        platform.heal_link(target, leader)
        self._cut(partitions.cut_off(nemesis.nodes, keepers))
        window.update(catch_up_to=told.catch_up_to, commit_when_seen=told.commit_index)
        self._step(f"{target} told (catch_up_to {told.catch_up_to}, commit "
                   f"{told.commit_index}); leader killed, keepers cut, held away healed")
        after = platform.status(target, timeout_s=2.0)
        if after is None:
            return False, f"{target} did not answer Status after the strike"
        window["commit_after_strike"] = after.commit_index
        if after.commit_index >= told.catch_up_to:
            return False, (f"{target} had caught up (commit {after.commit_index} >= "
                           f"{told.catch_up_to}) by the time the leader was dead")
        return True, (f"{target} had been told it lost entries up to {told.catch_up_to} and "
                      f"had committed only to {after.commit_index} when the leader was "
                      f"killed; {' '.join(held)} and {target} then made a majority without "
                      f"those entries")

    # ----- helpers -------------------------------------------------------------------------

    def _restart(self, node: str, while_down) -> None:  # noqa: ANN001
        """Kill `node`, run `while_down`, start it again and wait until it answers (a node
        that refuses its data rejoins as a new member: `_bring_back`)."""
        self.nemesis.expected_down.add(node)
        self.platform.kill(node)
        try:
            while_down()
        finally:
            self.nemesis._bring_back("rollback", None, [node])

    def _cut(self, links: list[tuple[str, str]]) -> None:
        self.platform.cut_links(links)
        self.cut.update(links)

    def _heal_cut(self) -> None:
        for a, b in sorted(self.cut):
            self.platform.heal_link(a, b)
        self.cut.clear()

    def _heal(self) -> dict[str, Any]:
        if self.frozen is not None:
            self.platform.resume(self.frozen)
        self._heal_cut()
        for node in sorted(self.killed):
            if not self.platform.is_running(node):
                self.platform.start_node(node)
            self.nemesis.expected_down.discard(node)
        return {}

    def _undo(self) -> None:
        """A step failed: nothing of this fault may stay in place."""
        self._heal()

    def _step(self, what: str) -> None:
        log.info("rollback fault, %.2f s: %s", time.monotonic() - self.began, what)

    def _wait(self, probe, timeout_s: float, poll_s: float = 0.05):  # noqa: ANN001, ANN202
        return wait_or_stop(probe, timeout_s, self.nemesis._stop, poll_s)


def rollback(nemesis: Nemesis) -> ActiveFault | None:
    """Start one `rollback` fault (nemesis/faults.py dispatches here)."""
    if nemesis.platform.name == "sim":
        return sim_rollback(nemesis)
    return Rollback(nemesis).begin()


def sim_rollback(nemesis: Nemesis) -> ActiveFault | None:
    """The same steps in simulated time (`SimPlatform.aim_rollback`, the target's fake disk
    copied and put back); whether it landed is known at the heal, and recorded there."""
    platform = nemesis.platform
    leader = nemesis._leader_or_skip("rollback", "rollback")
    if leader is None:
        return None
    target, keepers, held = roles(nemesis.nodes, leader, nemesis.rng)
    platform.aim_rollback(leader, target, keepers, held, LOST_MIN, ANSWER_LOSS)

    def heal() -> dict[str, Any]:
        aim = platform.end_rollback_aim() or {}
        landed, why = bool(aim.get("landed")), str(aim.get("why") or "")
        window = {k: aim.get(k) for k in (
            "leader", "target", "keepers", "held", "saved_last_index", "cut_at_commit",
            "acknowledged_to", "catch_up_to", "commit_when_seen", "commit_after_strike")}
        return {"landed": landed, "landed_evidence": nemesis.count_aimed("rollback", landed, why),
                "window": window}

    text = (f"rollback: {target} to be restarted on a copy of its disk once {leader} has "
            f"committed {LOST_MIN} entries with it, held away {' '.join(held) or '-'}, "
            f"keepers {' '.join(keepers) or '-'}")
    return nemesis._register("rollback", sorted(nemesis.nodes), text, heal,
                             {"target": target, "window": {"kind": "rollback", "leader": leader,
                                                           "target": target, "keepers": keepers,
                                                           "held_away": held}}, "rollback")
