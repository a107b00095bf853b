"""The `restore-majority` fault: a majority of the nodes restarted on backups of their data
taken a moment earlier, in a quiet window.

An operator's maintenance gone wrong: traffic drained, the followers' disks backed up (VM
snapshots), something written that no client waits for, then a majority restored from
those backups. Every file is valid, only older. The restored majority elects a leader
without those entries and writes its own at the same indexes, while the nodes that were
not restored still hold them, committed. No Raft keeps entries a majority lost (its safety
rests on stable storage), and here nothing a client was told is among them; what the store
must do is notice: a node told of an entry that contradicts its committed log says so and
is repaired from a snapshot (docs/raft.md, "A follower whose committed log diverged"),
rather than answer "match" and keep a log the cluster no longer has (the rule watch's
`committed-conflict-unnoticed`; the variant `answers-below-commit-as-match`). Without this
fault no run of the safe store ever has a committed divergence, so that rule is never
exercised: it is the one window no other fault reaches.

The steps, with n nodes and a majority q: the leader L and n - q - 1 others keep their data
(the witnesses W); q followers are restored (R).
1. The workload's clients are held between operations (`workloads.base.ClientGate`): none
   starts, those in flight finish; then the fault waits until every node has applied the
   leader's last entry. From here until step 5 nothing a client sees is written, so the
   entries R loses are only the nemesis's own.
2. Each node of R in turn is killed, its data directory copied, and started again (one at
   a time, so that L keeps a majority and its term).
3. L commits MARKERS writes to a key of the nemesis's own (`MARKER_KEY`, which no workload
   touches), and the fault waits until every node of W has committed them.
4. W is cut from R; R is killed, restored from the copies and started; R elects a leader
   and commits its first entry. R's disks say L's term, so that leader's term is above it
   and its entries differ, by term, from the markers at the same indexes. The fault goes
   no further when the term moved during steps 2-3 (a restored node could then lead again
   in the markers' term, and two logs that differ under equal terms are beyond any
   store's notice).
5. The clients are released. `landed`: R's leader leads a newer term than the markers'
   and has committed past where the markers begin, and every witness committed them.
Healed (after the interval) by healing W's links: R's leader meets logs that contradict
its own at or below their commit index.

The local platform (data directories copied), and the simulator (`sim_restore_majority`:
the same steps in simulated time, on its fake disks and its own clients); our store (its
Status reports commit and last index); a workload that can hold its clients (the kv
workload). 3 nodes or more. Outside Raft's model (faults.py BEYOND_RAFT): `explore` does
not draw it and `nemesis shrink` refuses its runs.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from nemesis import partitions
from nemesis.windows import wait_or_stop

if TYPE_CHECKING:
    from nemesis.faults import ActiveFault, Nemesis

log = logging.getLogger("nemesis")

FAULT = "restore-majority"
MARKER_KEY = "nemesis/restore-majority"  # the workloads' keys are r0, r1, ...
MARKERS = 5  # entries past the backups, each a committed write no client waits for
HOLD_TIMEOUT_S = 15.0  # the clients' operations in flight end within their op timeout
IDLE_TIMEOUT_S = 15.0  # every node applies the leader's last entry
COMMIT_TIMEOUT_S = 15.0  # the markers committed on every witness
ELECT_TIMEOUT_S = 30.0  # the restored majority elects a leader and commits its first entry
MARKER_WRITE_TIMEOUT_S = 2.0


class _Skip(Exception):
    """The fault gives up before anything is restored; the message says why."""


def roles(nodes: list[str], leader: str, rng: Any) -> tuple[list[str], list[str]]:
    """(restored, witnesses): a majority of followers, and the leader with the rest."""
    followers = sorted(n for n in nodes if n != leader)
    restored = sorted(rng.sample(followers, len(nodes) // 2 + 1))
    return restored, sorted(n for n in nodes if n not in restored)


class RestoreMajority:
    def __init__(self, nemesis: Nemesis) -> None:
        self.nemesis = nemesis
        self.platform = nemesis.platform
        self.cut: list[tuple[str, str]] = []
        self.began = time.monotonic()

    def begin(self) -> ActiveFault | None:
        nemesis = self.nemesis
        clients = nemesis.clients
        if clients is None:
            return self._skip("the workload cannot hold its clients")
        leader = self.platform.leader()
        if leader is None:
            return self._skip("no leader")
        restored, witnesses = roles(nemesis.nodes, leader, nemesis.rng)
        window: dict[str, Any] = {"kind": FAULT, "leader": leader, "restored": restored,
                                  "witnesses": witnesses}
        if not clients.hold_clients(HOLD_TIMEOUT_S):
            clients.release_clients()
            return self._skip(f"the clients' operations in flight did not end within "
                              f"{HOLD_TIMEOUT_S:g} s")
        held_at = time.monotonic()
        try:
            landed, why = self._steps(leader, restored, witnesses, window)
        except _Skip as exc:  # nothing restored yet
            return self._skip(str(exc))
        except BaseException:
            self._heal()
            raise
        finally:
            clients.release_clients()
            window["clients_held_s"] = round(time.monotonic() - held_at, 2)
        why = nemesis.count_aimed(FAULT, landed, why)
        text = (f"restore-majority: {' '.join(restored)} restarted on copies of their data "
                f"from before {window.get('markers', 0)} committed writes of the nemesis's "
                f"own; {' '.join(witnesses)} kept them, cut off until the heal "
                f"({'landed' if landed else 'missed'}: {why})")
        return nemesis._register(FAULT, sorted(nemesis.nodes), text, self._heal,
                                 {"window": window, "landed": landed, "landed_evidence": why},
                                 FAULT)

    def _steps(self, leader: str, restored: list[str], witnesses: list[str],
               window: dict[str, Any]) -> tuple[bool, str]:
        platform, nemesis = self.platform, self.nemesis
        idle = self._wait(lambda: self._idle(leader), IDLE_TIMEOUT_S)
        if idle is None:
            raise _Skip(f"the nodes did not all apply the leader's last entry within "
                        f"{IDLE_TIMEOUT_S:g} s")
        term, last = idle
        window.update(term=term, backup_index=last)
        for node in restored:
            nemesis.expected_down.add(node)
            platform.kill(node)
            try:
                platform.save_data(node)
            finally:
                nemesis._bring_back(FAULT, None, [node])
        self._step(f"{' '.join(restored)} backed up at index {last}, term {term}")
        first = self._write_markers(leader)
        if first is None:
            raise _Skip(f"leader {leader} did not take the nemesis's writes")
        marked = self._wait(lambda: self._committed_on(witnesses, first + MARKERS - 1, term),
                            COMMIT_TIMEOUT_S)
        if marked is None:
            raise _Skip(f"the witnesses {' '.join(witnesses)} did not commit the nemesis's "
                        f"writes in term {term} within {COMMIT_TIMEOUT_S:g} s (or the term "
                        f"moved: then nothing is restored)")
        window.update(markers=MARKERS, first_marker=first, witness_commit=marked)
        self._cut(partitions.cuts(partitions.components([witnesses, restored])))
        for node in restored:
            nemesis.expected_down.add(node)
        platform.kill_nodes(restored)
        for node in restored:
            platform.restore_data(node)
        nemesis._bring_back(FAULT, None, restored)
        self._step(f"{' '.join(restored)} restored from the backups; "
                   f"{' '.join(witnesses)} cut off")
        elected = self._wait(lambda: self._new_leader(restored, term, first), ELECT_TIMEOUT_S)
        if elected is None:
            return False, (f"the restored nodes {' '.join(restored)} elected no leader that "
                           f"committed past index {first - 1} within {ELECT_TIMEOUT_S:g} s")
        new_leader, new_term, commit = elected
        window.update(new_leader=new_leader, new_term=new_term, new_leader_commit=commit)
        return True, (f"{new_leader} leads term {new_term} > {term} and committed to {commit} "
                      f"without the writes at {first}..{first + MARKERS - 1}, which "
                      f"{' '.join(witnesses)} committed in term {term}")

    # ----- probes ----------------------------------------------------------------------------

    def _idle(self, leader: str) -> tuple[int, int] | None:
        """(term, last index) once the leader's last entry is applied everywhere."""
        at = self.platform.status(leader, timeout_s=0.5)
        if at is None or at.role != "leader":
            return None
        for node in self.nemesis.nodes:
            st = at if node == leader else self.platform.status(node, timeout_s=0.5)
            if st is None or st.applied_index < at.last_index or st.term != at.term:
                return None
        return at.term, at.last_index

    def _committed_on(self, nodes: list[str], index: int, term: int) -> int | None:
        """The least commit index among `nodes` once each has committed `index` in `term`."""
        commits = []
        for node in nodes:
            st = self.platform.status(node, timeout_s=0.5)
            if st is None or st.term != term or st.commit_index < index:
                return None
            commits.append(st.commit_index)
        return min(commits)

    def _new_leader(self, restored: list[str], term: int,
                    first: int) -> tuple[str, int, int] | None:
        for node in restored:
            st = self.platform.status(node, timeout_s=0.5)
            if st is not None and st.role == "leader" and st.term > term \
                    and st.commit_index >= first:
                return node, st.term, st.commit_index
        return None

    def _write_markers(self, leader: str) -> int | None:
        """Write the markers through `leader`; the log index of the first, or None."""
        platform = self.platform
        before = platform.status(leader, timeout_s=0.5)
        if before is None or before.role != "leader":
            return None
        client = platform.system.kv_client(
            {leader: platform.client_addresses[leader]}, timeout_s=MARKER_WRITE_TIMEOUT_S,
            client_id="nemesis-restore-majority", tls=platform.client_tls)
        try:
            for i in range(MARKERS):
                client.put(MARKER_KEY, f"written after the backups ({i + 1} of {MARKERS})".encode())
        except Exception as exc:  # noqa: BLE001 - any failure: nothing restored, say why
            log.info("restore-majority: a write of the nemesis's own failed: %s", exc)
            return None
        finally:
            client.close()
        return before.last_index + 1

    # ----- helpers ---------------------------------------------------------------------------

    def _skip(self, why: str) -> None:
        self.nemesis.record("nemesis-skip", {"fault": FAULT,
                                             "description": f"restore-majority: {why}"})

    def _cut(self, links: list[tuple[str, str]]) -> None:
        self.platform.cut_links(links)
        self.cut.extend(links)

    def _heal(self) -> dict[str, Any]:
        for a, b in self.cut:
            self.platform.heal_link(a, b)
        self.cut.clear()
        # After a step that failed between a kill and a start (a copy that could not be
        # made, say), what it stopped is started again.
        stopped = [n for n in self.nemesis.nodes if not self.platform.is_running(n)
                   and n in self.nemesis.expected_down]
        if stopped:
            self.nemesis._bring_back(FAULT, None, stopped)
        return {}

    def _step(self, what: str) -> None:
        log.info("restore-majority fault, %.2f s: %s", time.monotonic() - self.began, what)

    def _wait(self, probe, timeout_s: float):  # noqa: ANN001, ANN202
        return wait_or_stop(probe, timeout_s, self.nemesis._stop, 0.02)


def restore_majority(nemesis: Nemesis) -> ActiveFault | None:
    """Start one `restore-majority` fault (nemesis/faults.py dispatches here)."""
    if nemesis.platform.name == "sim":
        return sim_restore_majority(nemesis)
    return RestoreMajority(nemesis).begin()


def sim_restore_majority(nemesis: Nemesis) -> ActiveFault | None:
    """The same steps in simulated time (`SimPlatform.aim_restore_majority`: the platform
    holds the simulated clients and copies the fake disks); whether it landed is known at
    the heal, and recorded there."""
    platform = nemesis.platform
    leader = nemesis._leader_or_skip(FAULT, FAULT)
    if leader is None:
        return None
    restored, witnesses = roles(nemesis.nodes, leader, nemesis.rng)
    platform.aim_restore_majority(leader, restored, witnesses, MARKERS, MARKER_KEY)

    def heal() -> dict[str, Any]:
        aim = platform.end_restore_aim() or {}
        landed, why = bool(aim.get("landed")), str(aim.get("why") or "")
        window = {k: aim.get(k) for k in ("leader", "restored", "witnesses", "term",
                                          "backup_index", "first_marker", "new_leader",
                                          "new_term")}
        return {"landed": landed, "landed_evidence": nemesis.count_aimed(FAULT, landed, why),
                "window": window}

    text = (f"restore-majority: clients held; {' '.join(restored)} backed up, "
            f"{MARKERS} writes of the nemesis's own, then restarted on the copies with "
            f"{' '.join(witnesses)} cut off")
    return nemesis._register(FAULT, sorted(nemesis.nodes), text, heal,
                             {"window": {"kind": FAULT, "leader": leader, "restored": restored,
                                         "witnesses": witnesses}}, FAULT)
