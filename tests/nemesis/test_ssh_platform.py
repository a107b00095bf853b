"""--platform ssh against five containers running sshd (`ssh_testbed`), as Jepsen tests
itself: a faulted run is valid and leaves nothing on the hosts, a canary is caught, Ctrl-C
leaves nothing, each fault works on one platform, and each way a host cannot be used is one
line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemesis.platforms.base import ClusterConfig, PlatformError
from nemesis.platforms.docker import docker_available
from nemesis.platforms.ssh import SshPlatform, chain_name
from nemesis.platforms.ssh_conn import SshError, SshHosts
from nemesis.platforms.ssh_hosts import Host, read_hosts
from nemesis.platforms.ssh_testbed import SshTestbed
from tests.nemesis.waiting import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
AVAILABLE, REASON = docker_available()
if not AVAILABLE:
    pytest.skip(f"needs a Docker engine ({REASON})", allow_module_level=True)

LEFT = ("echo procs=$(ps -eo args | grep -c '^python3 -m system.kv serve') "
        "dirs=$(ls /var/tmp | grep -c '^mao-') "
        "rules=$( (iptables -S; iptables-legacy -S) 2>/dev/null | grep -c 'MAO-')")


@pytest.fixture(scope="module")
def bed() -> Iterator[SshTestbed]:
    with SshTestbed(5, log=lambda line: None) as testbed:
        yield testbed


def _left_on_hosts(bed: SshTestbed) -> dict[int, str]:
    """What is on each host of ours: node processes, run folders, iptables rules."""
    with SshHosts(read_hosts(bed.hosts_file), known_hosts=bed.known_hosts) as ssh:
        ssh.connect()
        return {i: out.strip() for i, (_, out) in
                ssh.run_all({i: LEFT for i in range(bed.count)}).items()}


NOTHING = "procs=0 dirs=0 rules=0"


def _nemesis(tmp_path: Path, bed: SshTestbed, *args: str,
             env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "nemesis", "run", "--platform", "ssh", "--hosts",
         str(bed.hosts_file), "--known-hosts", str(bed.known_hosts), "--store",
         str(tmp_path / "store"), *args],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def _finish(proc: subprocess.Popen, timeout_s: float) -> str:
    try:
        return proc.communicate(timeout=timeout_s)[0]
    finally:
        if proc.poll() is None:  # timed out: the run must not outlive the test
            proc.kill()
            proc.wait()


def test_a_faulted_run_on_five_hosts_is_valid_and_leaves_nothing(tmp_path: Path,
                                                                 bed: SshTestbed) -> None:
    proc = _nemesis(tmp_path, bed, "--faults", "partition,kill", "--duration", "30",
                    "--interval", "5", "--seed", "26")
    out = _finish(proc, 1200)
    assert proc.returncode == 0, out
    run_dir = (tmp_path / "store" / "latest").resolve()
    results = json.loads((run_dir / "results.json").read_text())
    assert results["valid"] is True and results["platform"] == "ssh"
    # How many faults fit in 30 s depends on the machine's load (each is SSH round trips).
    assert sum(results["faults"].values()) >= 1, results["faults"]
    assert "nemesis errors" not in out, out
    for node in ("n1", "n5"):
        assert (run_dir / "nodes" / f"{node}.log").stat().st_size > 0
    assert set(_left_on_hosts(bed).values()) == {NOTHING}


def test_a_canary_is_caught_through_ssh(tmp_path: Path, bed: SshTestbed) -> None:
    proc = _nemesis(tmp_path, bed, "--unsafe", "ack-before-commit", "--faults", "partition",
                    "--duration", "40", "--interval", "5", "--seed", "7",
                    env={"MAO_ALLOW_UNSAFE": "1"})
    out = _finish(proc, 1200)
    assert proc.returncode == 1, out
    assert "INVALID" in out
    assert set(_left_on_hosts(bed).values()) == {NOTHING}


def _wait_for_line(proc: subprocess.Popen, text: str, deadline: float) -> None:
    assert proc.stdout is not None
    while text not in proc.stdout.readline():
        assert time.monotonic() < deadline and proc.poll() is None, f"never printed {text!r}"


def _long_run(tmp_path: Path, bed: SshTestbed) -> subprocess.Popen:
    """Three nodes, partitions every 2 s, for longer than any test waits."""
    return _nemesis(tmp_path, bed, "--faults", "partition", "--duration", "600",
                    "--interval", "2", "--nodes", "3")


def test_ctrl_c_leaves_no_process_rule_or_file_on_the_hosts(tmp_path: Path,
                                                            bed: SshTestbed) -> None:
    proc = _long_run(tmp_path, bed)
    try:
        deadline = time.monotonic() + 900
        _wait_for_line(proc, "running the kv workload", deadline)
        # Interrupt inside a partition: nodes, folders and cut links are all on the hosts.
        _wait_for_line(proc, "faults: partition(", deadline)
        before = _left_on_hosts(bed)
        assert all(before[i].startswith("procs=1 dirs=1 rules=") for i in range(3)), before
        assert all(not before[i].endswith("rules=0") for i in range(3)), before
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:  # a failed check above: the run must not outlive the test
            proc.kill()
            proc.wait()
    assert proc.returncode == 3, out
    assert set(_left_on_hosts(bed).values()) == {NOTHING}, out


def test_clean_removes_what_a_killed_harness_left_on_the_hosts(tmp_path: Path,
                                                                bed: SshTestbed) -> None:
    proc = _long_run(tmp_path, bed)
    try:
        _wait_for_line(proc, "running the kv workload", time.monotonic() + 900)
    finally:
        proc.kill()  # SIGKILL: no tear-down at all
        proc.wait()
    left = _left_on_hosts(bed)
    assert all(left[i].startswith("procs=1 dirs=1") for i in range(3)), left
    clean = subprocess.run(
        [sys.executable, "-m", "nemesis", "clean", "--run", "no-such-run", "--hosts",
         str(bed.hosts_file), "--known-hosts", str(bed.known_hosts)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert _left_on_hosts(bed) == left, "--run names another run: nothing of this one goes"
    clean = subprocess.run(
        [sys.executable, "-m", "nemesis", "clean", "--hosts", str(bed.hosts_file),
         "--known-hosts", str(bed.known_hosts)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert clean.returncode == 0, clean.stderr
    assert clean.stdout.count("/var/tmp/mao-kv-") == 3, clean.stdout
    assert set(_left_on_hosts(bed).values()) == {NOTHING}


PTH = "/usr/lib/python3/dist-packages/mao-deps.pth"  # the test image's dependencies


def test_every_fault_of_the_platform_on_three_hosts(tmp_path: Path, bed: SshTestbed) -> None:
    """Also: a host without the node's dependencies (n3's: the image's are hidden) gets
    them shipped as wheels and runs its node on them."""
    config = ClusterConfig(nodes=3, run_id=f"ssh-faults-{os.getpid()}", work_dir=tmp_path)
    platform = SshPlatform(config, read_hosts(bed.hosts_file), known_hosts=bed.known_hosts,
                           log=lambda line: None)
    bare = bed.containers[2]
    assert bare.exec_run(["mv", PTH, "/root/mao-deps.pth"]).exit_code == 0
    try:
        platform.start()
        shipped = platform._must("n3", f"ls {platform.dir}/lib", "listing")
        assert "grpc" in shipped.split() and "numpy" in shipped.split(), shipped
        assert "grpc" not in platform._must("n2", f"ls {platform.dir}/lib", "listing").split()
        wait_until(platform.ready, 120, "a leader", platform.describe)
        platform.pause("n1")
        assert platform._state("n1") == "T" and platform.is_running("n1")
        platform.resume("n1")
        assert platform._state("n1") not in ("T", "gone"), platform.exit_reason("n1")
        platform.cut("n2", "n3")
        with SshHosts(read_hosts(bed.hosts_file)[:3], known_hosts=bed.known_hosts) as ssh:
            ssh.connect()
            rules = ssh.run(2, f"iptables -S {chain_name(config.run_id)}")[1]
            assert f"-s {bed.peer_ips[1]}/32" in rules and "DROP" in rules, rules
        platform.heal_all()
        platform.kill("n1")
        assert platform.exit_code("n1") == 137, platform.exit_reason("n1")
        assert not platform.is_running("n1")
        files = platform.data_files(["n1"])["n1"]
        wal = sorted(name for name in files if name.startswith("wal/"))
        assert wal, files
        damaged = platform.damage_files({"n1": [{"kind": "truncate", "file": wal[0],
                                                 "size": 0}]})
        assert damaged["n1"][0]["size_after"] == 0, damaged
        platform.wipe("n1")
        assert platform.data_files(["n1"])["n1"] == {}
        platform.start_node("n1")
        assert platform.wait_started("n1", 120) is None
        logs = platform.collect_logs()
        assert {"n1.log", "n1.stderr", "n3.log"} <= set(logs)
    finally:
        platform.close()
        bare.exec_run(["mv", "/root/mao-deps.pth", PTH])
    assert set(_left_on_hosts(bed).values()) == {NOTHING}


def _host(bed: SshTestbed, i: int, **change: object) -> Host:
    host = read_hosts(bed.hosts_file)[i]
    return Host(**{**host.__dict__, **change})


def _connect(hosts: list[Host], known_hosts: Path, accept_new: bool = False) -> str:
    with SshHosts(hosts, known_hosts=known_hosts, accept_new=accept_new) as ssh, \
            pytest.raises(SshError) as caught:
        ssh.connect()
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_each_way_a_host_cannot_be_used_is_one_line(tmp_path: Path, bed: SshTestbed) -> None:
    import asyncssh

    other_key = tmp_path / "other"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(other_key))
    label = f"root@127.0.0.1:{bed.ports[0]}"
    message = _connect([_host(bed, 0, key=other_key)], bed.known_hosts)
    assert message.startswith(f"{label}: the host refused the key {other_key} for user root")

    wrong = tmp_path / "known_hosts"
    key_of_h2 = bed.known_hosts.read_text().splitlines()[1].split(" ", 1)[1]
    wrong.write_text(f"[127.0.0.1]:{bed.ports[0]} {key_of_h2}\n")
    message = _connect([_host(bed, 0)], wrong)
    assert message.startswith(f"{label}: its host key is not the one {wrong} holds")
    message = _connect([_host(bed, 0)], wrong, accept_new=True)
    assert message.startswith(f"{label}: its host key does not match the one in {wrong}")

    fresh = tmp_path / "fresh_known_hosts"
    with SshHosts([_host(bed, 0)], known_hosts=fresh, accept_new=True) as ssh:
        ssh.connect()
    assert fresh.read_text().startswith(f"[127.0.0.1]:{bed.ports[0]} ssh-")
    with SshHosts([_host(bed, 0)], known_hosts=fresh) as ssh:
        ssh.connect()  # now known: no flag needed

    container = bed.containers[1]
    assert container.exec_run(["sh", "-c", "useradd -m bob && mkdir -p ~bob/.ssh && "
                               "cp /root/.ssh/authorized_keys ~bob/.ssh/ && "
                               "chown -R bob ~bob/.ssh"]).exit_code == 0
    message = _connect([_host(bed, 1, user="bob")], bed.known_hosts)
    assert message == (f"bob@127.0.0.1:{bed.ports[1]}: the user is not root and cannot use "
                       f"sudo without a password; the harness needs root there (iptables, "
                       f"signals): log in as root or allow passwordless sudo")

    hide = "for f in /usr/sbin/iptables /usr/sbin/iptables-legacy; do mv $f $f.off; done"
    assert container.exec_run(["sh", "-c", hide]).exit_code == 0
    try:
        config = ClusterConfig(nodes=3, run_id=f"ssh-noipt-{os.getpid()}", work_dir=tmp_path)
        platform = SshPlatform(config, read_hosts(bed.hosts_file), known_hosts=bed.known_hosts,
                               log=lambda line: None)
        with pytest.raises(PlatformError) as caught:
            try:
                platform.start()
            finally:
                platform.close()
        assert str(caught.value) == (f"root@127.0.0.1:{bed.ports[1]} has no iptables, which "
                                     f"partitions need: install it (Debian: apt-get install "
                                     f"iptables)")
    finally:
        container.exec_run(["sh", "-c", hide.replace("mv $f $f.off", "mv $f.off $f")])
    assert set(_left_on_hosts(bed).values()) == {NOTHING}
