"""checker/trainer_protocol.py on hand-written histories: the lease and fencing properties
(`lease`, `head-cas`, `resume-after-lease`, `unique-request-ids`). A clean takeover passes
every property; each canary's characteristic history (system/trainer/unsafe.py) breaks the
property written for it, and only the properties it should."""

from __future__ import annotations

from pathlib import Path

from checker.trainer import check_trainer
from histories.read import read_history
from histories.write import HistoryWriter

HEAD, LEASE = "trainer/nemesis/checkpoint", "trainer/nemesis/lease"
C1, C2 = "c1-aaaaaa", "c2-aaaaaa"
NEW = ("lease", "head-cas", "resume-after-lease", "unique-request-ids")


class P:
    """The coordinators' operations as workloads/trainer.py records them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.w = HistoryWriter(path)
        self.chain: list[dict] = []
        self.lease_version = 0
        self.head_version = 0

    @staticmethod
    def _p(cid: str, base: int) -> int:
        return base + int(cid[1])

    def lease_read(self, cid: str) -> None:
        i = self.w.invoke(self._p(cid, 4100), "lease-read", LEASE, None, coordinator=cid)
        self.w.complete(i, "ok", None, version=self.lease_version, coordinator=cid)

    def lease_write(self, cid: str, op: str, expected: int | None, term: int | None = None,
                    outcome: str = "ok", rid: str | None = None) -> int:
        """A take (term = the version it produces) or a renewal; the store's version moves
        by one per applied write. Returns the term."""
        rid = rid or f"{cid}:{op}-{self.lease_version}"
        version = self.lease_version + 1
        term = version if term is None and op == "take" else term
        fields = {"coordinator": cid, "op": op, "request_id": rid, "lease_version": term}
        i = self.w.invoke(self._p(cid, 2100), "lease-write", LEASE, term, expected_version=expected,
                          **fields)
        if outcome == "ok":
            self.lease_version = version
            self.w.complete(i, "ok", term, version=version, **fields)
        else:
            self.w.complete(i, outcome, term, error="cas-mismatch", **fields)
        return term  # type: ignore[return-value]

    def head_read(self, cid: str) -> int:
        step = self.chain[-1]["step"] if self.chain else None
        i = self.w.invoke(self._p(cid, 4100), "head-read", HEAD, None, coordinator=cid)
        self.w.complete(i, "ok", step, version=self.head_version, coordinator=cid)
        return self.head_version

    def _head_write(self, f: str, base: int, cid: str, step: int, lease: int, expected: int | None,
                    rid: str, outcome: str) -> None:
        common = {"step": step, "request_id": rid, "lease_version": lease, "coordinator": cid}
        extra = {"from_step": step} if f == "resume" else {}
        i = self.w.invoke(self._p(cid, base), f, HEAD, step, expected_version=expected, **common, **extra)
        if outcome == "ok":
            self.head_version += 1
            self.w.complete(i, "ok", step, version=self.head_version, **common)
            self.chain.append({"version": self.head_version, "request_id": rid, "step": step,
                               "lease_version": lease, "coordinator_id": cid})
            if f == "resume":
                self.w.event("trainer", "resume", {
                    "coordinator_id": cid, "step": step, "version": self.head_version,
                    "lease_version": lease, "request_id": rid, "outcome": "ok",
                    "from_request_id": ""})
        elif outcome == "fail":
            self.w.complete(i, "fail", step, error="cas-mismatch", **common)
        elif outcome == "info":
            self.w.complete(i, "info", step, error="indeterminate", **common)

    def ckpt(self, cid: str, step: int, lease: int, expected: int | None, outcome: str = "ok",
             rid: str | None = None) -> None:
        self._head_write("checkpoint", 100, cid, step, lease, expected, rid or f"{cid}:step-{step}",
                         outcome)

    def resume(self, cid: str, step: int, lease: int, expected: int, rid: str | None = None) -> None:
        self._head_write("resume", 3100, cid, step, lease, expected, rid or f"{cid}:resume-{step}", "ok")

    def event(self, f: str, **value: object) -> None:
        self.w.event("trainer", f, value)

    def take_and_resume(self, cid: str) -> int:
        """What a safe standby does: read the lease, take it by CAS, read the head, resume."""
        self.lease_read(cid)
        term = self.lease_write(cid, "take", self.lease_version)
        self.event("lease-acquired", coordinator_id=cid, lease_version=term, outcome="ok")
        version = self.head_read(cid)
        self.resume(cid, self.chain[-1]["step"] if self.chain else 0, term, version)
        return term

    def renew(self, cid: str, term: int) -> None:
        self.lease_write(cid, "renew", self.lease_version, term)

    def final(self) -> list:
        head = self.chain[-1]
        i = self.w.invoke(100, "read-checkpoint", HEAD, None, consistency="linearizable")
        self.w.complete(i, "ok", {"step": head["step"], "request_id": head["request_id"],
                                  "params_sha256": "sha256:good", "chain": self.chain},
                        version=head["version"])
        self.w.close()
        return read_history(self.path)


def verdicts(records: list) -> dict[str, object]:
    out = check_trainer(records, lambda step: "sha256:good")
    return {k.removeprefix("trainer-"): v["valid"] for k, v in out.items() if k.startswith("trainer-")}


def kinds(records: list, prop: str) -> set[str]:
    out = check_trainer(records, lambda step: "sha256:good")
    return {a["kind"] for a in out[f"trainer-{prop}"]["anomalies"]}


def broken(records: list) -> set[str]:
    return {p for p, v in verdicts(records).items() if v is False}


def clean(tmp_path: Path) -> tuple[P, int]:
    """c1 takes the lease, resumes from nothing, renews, checkpoints steps 20 and 40."""
    p = P(tmp_path / "history.jsonl")
    t1 = p.take_and_resume(C1)
    p.renew(C1, t1)
    p.ckpt(C1, 20, t1, p.head_version)
    p.renew(C1, t1)
    p.ckpt(C1, 40, t1, p.head_version)
    return p, t1


def test_a_clean_takeover_passes_every_property(tmp_path: Path) -> None:
    p, t1 = clean(tmp_path)
    p.lease_read(C2)  # c1 dies; c2 sees the lease stand still
    t2 = p.take_and_resume(C2)
    p.renew(C2, t2)
    p.ckpt(C2, 60, t2, p.head_version)
    records = p.final()
    assert set(verdicts(records).values()) == {True}
    assert check_trainer(records)["trainer_summary"]["counts"]["lease_writes"]["ok"] == 5


# ----- (i) lease ------------------------------------------------------------------------


def test_a_lease_taken_by_a_plain_put_breaks_lease(tmp_path: Path) -> None:
    """lease-by-put: c2 read version v, c1 renewed (v+1), c2's put lands on top (v+2)."""
    p, t1 = clean(tmp_path)
    p.lease_read(C2)
    p.renew(C1, t1)  # c1 still holds it and renews after c2's read
    t2 = p.lease_write(C2, "take", None)  # the put: no expected version
    records = p.final()
    assert broken(records) == {"lease"}
    assert kinds(records, "lease") == {"blind-lease-write", "lease-overwritten"}
    out = check_trainer(records)["trainer-lease"]["anomalies"]
    overwritten = next(a for a in out if a["kind"] == "lease-overwritten")
    assert f"version {t2 - 1} by {C1}" in overwritten["text"]


def test_a_put_on_an_unchanged_lease_is_still_a_blind_write(tmp_path: Path) -> None:
    p, t1 = clean(tmp_path)
    p.lease_read(C2)
    p.lease_write(C2, "take", None)
    assert kinds(p.final(), "lease") == {"blind-lease-write"}


def test_a_lease_cas_on_a_version_its_writer_never_read_breaks_lease(tmp_path: Path) -> None:
    p, t1 = clean(tmp_path)
    p.lease_read(C2)
    p.lease_write(C2, "take", p.lease_version - 1)  # a store that let a stale CAS through
    assert kinds(p.final(), "lease") == {"lease-cas-not-on-read"}


def test_a_failed_take_is_no_violation(tmp_path: Path) -> None:
    p, t1 = clean(tmp_path)
    p.lease_read(C2)
    p.renew(C1, t1)
    p.lease_write(C2, "take", p.lease_version - 1, term=p.lease_version, outcome="fail")
    assert broken(p.final()) == set()


# ----- (ii) head-cas --------------------------------------------------------------------


def test_a_checkpoint_head_written_without_cas_breaks_head_cas(tmp_path: Path) -> None:
    """no-fencing: the checkpoint's head is a plain put."""
    p, t1 = clean(tmp_path)
    p.ckpt(C1, 60, t1, None)
    records = p.final()
    assert broken(records) == {"head-cas"}
    assert kinds(records, "head-cas") == {"blind-head-write"}


def test_a_write_after_the_writers_lease_was_lost_breaks_head_cas(tmp_path: Path) -> None:
    """write-after-lease-loss: c1's renewal fails (c2 took over), then c1 re-reads the head
    and writes by CAS on what it read: a CAS, but not under a lease."""
    p, t1 = clean(tmp_path)
    p.lease_read(C2)
    t2 = p.take_and_resume(C2)
    p.lease_write(C1, "renew", p.lease_version - 1, t1, outcome="fail")
    p.event("lease-lost", coordinator_id=C1, lease_version=t1, outcome="fail")
    p.ckpt(C1, 60, t1, p.head_read(C1))
    p.ckpt(C2, 60, t2, p.head_version - 1, outcome="fail")
    records = p.final()
    assert "head-cas" in broken(records)
    assert kinds(records, "head-cas") == {"head-write-without-lease"}


def test_a_head_cas_on_a_version_the_writer_did_not_read_breaks_head_cas(tmp_path: Path) -> None:
    p, t1 = clean(tmp_path)
    p.ckpt(C1, 60, t1, p.head_version - 1)  # expects an older version than it wrote last
    assert kinds(p.final(), "head-cas") == {"head-cas-not-on-read"}


def test_a_head_version_read_before_the_lease_does_not_count(tmp_path: Path) -> None:
    p, t1 = clean(tmp_path)
    p.lease_read(C2)
    early = p.head_read(C2)  # a standby's read, before it holds anything
    p.lease_write(C2, "take", p.lease_version)
    p.resume(C2, 40, p.lease_version, early)  # no read under its lease
    records = p.final()
    assert kinds(records, "head-cas") == {"head-cas-not-on-read"}
    assert kinds(records, "resume-after-lease") == {"resume-without-lease-read"}


def test_a_failed_or_unsent_head_write_is_no_violation(tmp_path: Path) -> None:
    p, t1 = clean(tmp_path)
    p.lease_write(C1, "renew", p.lease_version, t1, outcome="fail")
    p.ckpt(C1, 60, t1, p.head_version, outcome="fail")  # abandoned: not sent
    assert broken(p.final()) == set()


# ----- (iii) resume-after-lease ---------------------------------------------------------


def test_a_resume_from_the_head_read_before_the_lease_breaks_resume_after_lease(tmp_path: Path) -> None:
    """stale-resume: c2 reads the head (step 40) while standing by; c1 commits step 60; c2
    takes the lease, reads the head again for its fence CAS, and resumes from step 40."""
    p, t1 = clean(tmp_path)
    p.head_read(C2)
    p.ckpt(C1, 60, t1, p.head_version)
    p.lease_read(C2)
    t2 = p.lease_write(C2, "take", p.lease_version)
    fresh = p.head_read(C2)
    p.resume(C2, 40, t2, fresh)
    records = p.final()
    assert kinds(records, "resume-after-lease") == {"resume-older-than-acknowledged",
                                                    "resume-not-from-lease-read"}
    assert verdicts(records)["head-cas"] is True  # its CAS was on what it read under the lease


def test_a_checkpoint_acknowledged_after_the_take_is_not_required(tmp_path: Path) -> None:
    """c1's write was acknowledged after c2 took the lease (and before c2's read): c2 read it,
    resumed from it — and had it resumed from step 40, that is the old `resume` property's
    business, not this one's (nothing was acknowledged before the take)."""
    p, t1 = clean(tmp_path)
    p.lease_read(C2)
    t2 = p.lease_write(C2, "take", p.lease_version)
    p.ckpt(C1, 60, t1, p.head_version)
    p.resume(C2, 60, t2, p.head_read(C2))
    assert verdicts(p.final())["resume-after-lease"] is True


# ----- (iv) unique-request-ids ----------------------------------------------------------


def test_request_ids_shared_by_two_coordinators_break_unique_request_ids(tmp_path: Path) -> None:
    """shared-request-ids: c1 was killed inside its step-60 write; c2 resumes from 40 and
    writes step 60 under the same id `step-60`."""
    p, t1 = clean(tmp_path)
    p.ckpt(C1, 60, t1, p.head_version, outcome="info", rid="step-60")
    p.lease_read(C2)
    t2 = p.take_and_resume(C2)
    p.ckpt(C2, 60, t2, p.head_version, rid="step-60")
    records = p.final()
    assert broken(records) == {"unique-request-ids"}
    assert kinds(records, "unique-request-ids") == {"request-id-collision"}


def test_histories_without_lease_operations_keep_the_new_properties_valid(tmp_path: Path) -> None:
    p = P(tmp_path / "history.jsonl")
    p.ckpt(C1, 20, 1, 0)
    p.ckpt(C1, 40, 1, 1)
    assert {k: v for k, v in verdicts(p.final()).items() if k in NEW} == dict.fromkeys(NEW, True)
