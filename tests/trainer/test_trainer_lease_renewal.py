"""The lease is renewed independently of the training work (issue 22: leases lapsed with no
fault under load). A coordinator's step loop, its gRPC handlers and its event draining all
hold `Coordinator.cond`; the renewer must not wait for it. The test holds the lock the whole
time — a step loop blocked as long as you like — and waits for renewals to reach the store.
No timing assumption: it waits on the lease key's version, with a generous deadline."""

from __future__ import annotations

import threading
import time

import pytest

import system.trainer  # noqa: F401
from system.kv.client import KVClient
from system.trainer import data
from system.trainer.config import TrainConfig
from system.trainer.coordinator import Coordinator, CoordinatorOptions
from system.trainer.lease import read_lease

pytestmark = pytest.mark.integration


def test_the_lease_is_renewed_while_the_step_loop_holds_the_coordinator_lock(kv_cluster, job) -> None:
    config = TrainConfig(dataset="breast_cancer", workers=1, steps=10, batch_size=8, job=job)
    # A long lease: a slow machine must not lose it while the test waits for renewals.
    coordinator = Coordinator(config, CoordinatorOptions(coordinator_id=f"{job}-c1",
                                                         kv_addresses=kv_cluster.addresses, lease_s=10.0))
    coordinator.shard_rows = [data.n_train_rows(config)]
    renewer = threading.Thread(target=coordinator._renew_loop, daemon=True)  # noqa: SLF001
    try:
        assert coordinator.stand_by()  # no lease key yet: taken at once
        assert coordinator.resume(data.load(config))
        core = coordinator.core
        assert core is not None
        with KVClient(kv_cluster.addresses) as kv:
            _, taken = read_lease(kv, job)
            renewed = taken
            with coordinator.cond:  # the step loop, blocked for as long as the test runs
                renewer.start()
                deadline = time.monotonic() + 60
                while renewed < taken + 2 and time.monotonic() < deadline:
                    time.sleep(0.05)  # polling the store for the renewer's writes
                    _, renewed = read_lease(kv, job)
                held = coordinator.lease.valid()
        assert renewed >= taken + 2, "no lease renewal reached the store while the lock was held"
        assert held and not core.deposed
    finally:
        if coordinator.core is not None:
            with coordinator.cond:
                coordinator.core.step_down("test over")
        renewer.join(timeout=30) if renewer.is_alive() else None
        coordinator.server.stop(grace=None)
        coordinator.kv.close()
