"""A 64 MiB value (a model checkpoint) is written, replicated and read back whole.

Python copies a 64 MiB value several times per hop (about a second of event-loop time on
a busy 2-core machine), so this cluster runs with election timeouts of 1-2 s
(--election-timeout-ticks 50): with the default 0.5-1 s a busy leader may lose its
leadership mid-write; the client's retry (same request id) still gets it through.
"""

from __future__ import annotations

import pytest

from nemesis.platforms.local_cluster import LocalCluster
from system.kv.client import KVClient

pytestmark = [pytest.mark.integration, pytest.mark.slow]

VALUE_BYTES = 64 * 1024 * 1024


def test_64_mib_value_round_trips_and_reaches_every_replica(tmp_path) -> None:
    value = bytes(range(256)) * (VALUE_BYTES // 256)
    with LocalCluster(3, tmp_path, node_args=["--election-timeout-ticks", "50"]) as cluster:
        cluster.start()
        cluster.wait_for_leader(timeout_s=20)
        with cluster.client(timeout_s=120) as kv:
            written = kv.put("model/checkpoint", value)
            got = kv.get("model/checkpoint", timeout_s=60)
            assert got.version == written.version
            assert got.value == value
        for node_id in cluster.ids:
            cluster.wait_for_applied(node_id, written.applied_index, timeout_s=60)
            with KVClient([cluster.specs[node_id].address], timeout_s=60) as direct:
                assert direct.get("model/checkpoint", consistency="stale").value == value
