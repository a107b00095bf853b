"""checker/trainer.py on hand-written histories: a clean failover passes every property, and
each broken history breaks exactly the property it is written to break."""

from __future__ import annotations

from pathlib import Path

import pytest

from checker.trainer import check_trainer
from histories.read import read_history
from histories.write import HistoryWriter

KEY = "trainer/nemesis/checkpoint"
C1, C2 = "c1-aaaaaa", "c2-aaaaaa"


class H:
    """A tiny DSL over HistoryWriter for trainer histories."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.w = HistoryWriter(path)
        self.chain: list[dict] = []

    def ckpt(self, cid: str, step: int, lease: int, expected: int, outcome: str = "ok",
             version: int | None = None, rid: str | None = None, chain: bool = True) -> None:
        rid = rid or f"{cid}:step-{step}"
        process = 100 + int(cid[1])
        common = {"step": step, "request_id": rid, "lease_version": lease, "coordinator": cid}
        i = self.w.invoke(process, "checkpoint", KEY, step, expected_version=expected, **common)
        if outcome == "ok":
            self.w.complete(i, "ok", step, version=version, applied=True, **common)
            if chain:
                self.chain.append({"version": version, "request_id": rid, "step": step,
                                   "lease_version": lease, "coordinator_id": cid})
        else:
            self.w.complete(i, outcome, step, error="cas-mismatch", **common)

    def event(self, f: str, **value: object) -> None:
        self.w.event("trainer", f, value)

    def takeover(self, cid: str, lease: int, step: int, version: int, from_rid: str) -> None:
        self.event("lease-acquired", coordinator_id=cid, lease_version=lease, outcome="ok")
        rid = f"{cid}:resume-{step}"
        self.event("resume", coordinator_id=cid, step=step, version=version, lease_version=lease,
                   request_id=rid, outcome="ok", from_request_id=from_rid)
        self.chain.append({"version": version, "request_id": rid, "step": step,
                           "lease_version": lease, "coordinator_id": cid})

    def final(self, digest: str = "sha256:good", chain: list[dict] | None = None) -> list:
        chain = self.chain if chain is None else chain
        head = chain[-1]
        i = self.w.invoke(100, "read-checkpoint", KEY, None, consistency="linearizable")
        self.w.complete(i, "ok", {"step": head["step"], "request_id": head["request_id"],
                                  "params_sha256": digest, "chain": chain},
                        version=head["version"])
        self.w.close()
        return read_history(self.path)


def reference(step: int) -> str:
    return "sha256:good"


def verdicts(records: list) -> dict[str, object]:
    out = check_trainer(records, reference)
    return {k.removeprefix("trainer-"): v["valid"] for k, v in out.items() if k.startswith("trainer-")}


def clean(tmp_path: Path) -> H:
    """c1 writes steps 20, 40; is killed; c2 takes over from 40 and writes 60."""
    h = H(tmp_path / "history.jsonl")
    h.event("lease-acquired", coordinator_id=C1, lease_version=1, outcome="ok")
    h.event("resume", coordinator_id=C1, step=0, version=1, lease_version=1,
            request_id=f"{C1}:resume-0", outcome="ok", from_request_id="")
    h.chain.append({"version": 1, "request_id": f"{C1}:resume-0", "step": 0, "lease_version": 1})
    h.ckpt(C1, 20, 1, 1, version=2)
    h.ckpt(C1, 40, 1, 2, version=3)
    return h


def test_a_clean_failover_passes_every_property(tmp_path: Path) -> None:
    h = clean(tmp_path)
    h.takeover(C2, 9, 40, 4, f"{C1}:step-40")
    h.ckpt(C2, 60, 9, 4, version=5)
    assert set(verdicts(h.final()).values()) == {True}


def test_a_lost_acknowledged_checkpoint_breaks_durable(tmp_path: Path) -> None:
    h = clean(tmp_path)
    chain = h.chain[:-1]  # the head went back to version 2: step 40 is gone
    v = verdicts(h.final(chain=chain))
    assert v["durable"] is False and v["fencing"] is True and v["request-ids"] is True


def test_a_resume_from_an_older_checkpoint_breaks_resume(tmp_path: Path) -> None:
    h = clean(tmp_path)
    h.takeover(C2, 9, 20, 4, f"{C1}:step-20")  # step 40 was acknowledged before
    h.ckpt(C2, 40, 9, 4, version=5, rid=f"{C2}:step-40")
    v = verdicts(h.final())
    assert v["resume"] is False
    assert v["fencing"] is True and v["durable"] is True


def test_a_write_after_the_successor_resumed_breaks_fencing(tmp_path: Path) -> None:
    h = clean(tmp_path)
    h.takeover(C2, 9, 40, 4, f"{C1}:step-40")
    h.ckpt(C1, 60, 1, 4, version=5)  # the deposed c1 (lease 1) writes after c2's fence
    out = check_trainer(h.final(), reference)
    assert out["trainer-fencing"]["valid"] is False
    assert out["trainer-fencing"]["anomalies"][0]["kind"] == "write-after-fence"


def test_two_coordinators_under_one_lease_version_break_fencing(tmp_path: Path) -> None:
    h = clean(tmp_path)
    h.ckpt(C2, 60, 1, 3, version=4)  # c2 claims c1's lease version
    out = check_trainer(h.final(), reference)
    assert out["trainer-fencing"]["valid"] is False
    assert out["trainer-fencing"]["anomalies"][0]["kind"] == "shared-lease-version"


def test_a_request_id_applied_twice_breaks_request_ids(tmp_path: Path) -> None:
    h = clean(tmp_path)
    h.ckpt(C1, 40, 1, 3, version=4)  # the same request id c1:step-40 again, a new version
    v = verdicts(h.final())
    assert v["request-ids"] is False


def test_a_failed_write_that_took_effect_breaks_request_ids(tmp_path: Path) -> None:
    h = clean(tmp_path)
    h.ckpt(C1, 60, 1, 3, outcome="fail")  # recorded as certainly not applied ...
    h.chain.append({"version": 4, "request_id": f"{C1}:step-60", "step": 60, "lease_version": 1})
    h.takeover(C2, 9, 60, 5, f"{C1}:step-60")  # ... but c2 resumes from it
    out = check_trainer(h.final(), reference)
    assert out["trainer-request-ids"]["valid"] is False
    assert out["trainer-request-ids"]["anomalies"][0]["kind"] == "failed-write-applied"
    assert out["trainer-fencing"]["valid"] is True


def test_final_parameters_must_equal_the_reference_unless_a_worker_was_skipped(tmp_path: Path) -> None:
    h = clean(tmp_path)
    assert verdicts(h.final(digest="sha256:other"))["reference"] is False
    h2 = H(tmp_path / "h2.jsonl")
    h2.event("skip", coordinator_id=C1, step=3, worker=1, outcome="missing")
    h2.event("lease-acquired", coordinator_id=C1, lease_version=1, outcome="ok")
    h2.ckpt(C1, 20, 1, 0, version=1)
    out = check_trainer(h2.final(digest="sha256:other"), reference)
    assert out["trainer-reference"]["valid"] is True
    assert "not applicable" in out["trainer-reference"]["note"]


def test_no_final_read_leaves_durability_unknown(tmp_path: Path) -> None:
    h = clean(tmp_path)
    h.w.close()
    v = verdicts(read_history(h.path))
    assert v["durable"] == "unknown" and v["reference"] == "unknown"


@pytest.mark.parametrize("steps", [[20, 40, 30]])
def test_steps_going_backwards_along_versions_break_resume(tmp_path: Path, steps: list[int]) -> None:
    h = H(tmp_path / "history.jsonl")
    for version, step in enumerate(steps, start=1):
        h.ckpt(C1, step, 1, version - 1, version=version)
    assert verdicts(h.final())["resume"] is False
