"""`python -m system.trainer run --hosts FILE` on five sshd containers (`ssh_testbed`): the
store on three of them, coordinators and workers spread over all five, the active
coordinator SIGKILLed mid-run — the run ends bit-for-bit equal to the one-process
reference, and nothing of it is left on the hosts."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from nemesis.platforms.docker import docker_available
from nemesis.platforms.ssh_conn import SshHosts
from nemesis.platforms.ssh_hosts import read_hosts
from nemesis.platforms.ssh_testbed import SshTestbed
from system.trainer.procs import REPO_ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow]
AVAILABLE, REASON = docker_available()
if not AVAILABLE:
    pytest.skip(f"needs a Docker engine ({REASON})", allow_module_level=True)

LEFT = ("echo procs=$(ps -eo args | grep -c '^python3 -m system\\.') "
        "dirs=$(ls /var/tmp | grep -c '^mao-')")


@pytest.fixture(scope="module")
def bed() -> Iterator[SshTestbed]:
    with SshTestbed(5, log=lambda line: None) as testbed:
        yield testbed


def _left_on_hosts(bed: SshTestbed) -> set[str]:
    with SshHosts(read_hosts(bed.hosts_file), known_hosts=bed.known_hosts) as ssh:
        ssh.connect()
        return {out.strip() for _, out in ssh.run_all({i: LEFT for i in range(bed.count)}).values()}


def test_a_run_across_five_hosts_with_a_coordinator_kill_ends_bit_for_bit_equal(
        bed: SshTestbed) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "system.trainer", "run", "--hosts", str(bed.hosts_file),
         "--known-hosts", str(bed.known_hosts), "--dataset", "digits", "--workers", "4",
         "--standbys", "1", "--steps", "300", "--checkpoint-every", "25", "--lease-s", "1.5",
         "--kill-coordinator-at-step", "100", "--timeout-s", "900"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=1200,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    rows = dict(re.split(r"\s{2,}", line.strip(), maxsplit=1)
                for line in proc.stdout.splitlines() if re.search(r"\S\s{2,}\S", line))
    assert rows["vs one-process reference"] == "bit-for-bit equal", out[-3000:]
    assert int(rows["steps"]) == 300
    assert int(rows["coordinator takeovers"]) >= 1, out[-3000:]
    assert "killed the active coordinator" in proc.stderr
    assert _left_on_hosts(bed) == {"procs=0 dirs=0"}


def test_ctrl_c_mid_run_leaves_nothing_on_the_hosts(bed: SshTestbed, tmp_path) -> None:  # noqa: ANN001
    err = tmp_path / "stderr"
    with open(err, "w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "system.trainer", "run", "--hosts", str(bed.hosts_file),
             "--known-hosts", str(bed.known_hosts), "--dataset", "digits", "--workers", "4",
             "--steps", "1000000"],
            cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=sink, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        deadline = time.monotonic() + 600
        while "step " not in err.read_text():  # training has begun on the hosts
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text()[-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) == 130, err.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _left_on_hosts(bed) == {"procs=0 dirs=0"}
