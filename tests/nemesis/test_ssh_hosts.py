"""The ssh platform's fast parts: the hosts file and its one-line errors, the flags that go
with --platform ssh, an unreachable host, and the names the platform leaves on a host."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from nemesis.cli import EXIT_HARNESS, main
from nemesis.platforms.ssh import chain_name, remote_dir, remove_script
from nemesis.platforms.ssh_conn import SshError, SshHosts
from nemesis.platforms.ssh_hosts import Host, HostsFileError, parse_hosts, read_hosts


def test_full_lines_comments_and_config_names(tmp_path: Path) -> None:
    key = tmp_path / "id"
    key.write_text("not read here")
    hosts = parse_hosts(f"# five hosts\n\n10.0.0.1 2222 admin {key}\n"
                        f"127.0.0.1 2201 root {key} peer=172.18.0.2  # forwarded\n"
                        "db3\n")
    assert hosts[0] == Host("10.0.0.1", 2222, "admin", key, "", 3)
    assert hosts[0].peer_address == "10.0.0.1"
    assert hosts[1].peer_address == "172.18.0.2" and hosts[1].port == 2201
    assert hosts[2] == Host("db3", None, None, None, "", 5)  # left to ~/.ssh/config
    assert hosts[1].label() == "root@127.0.0.1:2201"


@pytest.mark.parametrize(("text", "message"), [
    ("h1 22x", "line 1: port '22x' is not a number from 1 to 65535"),
    ("h1 0", "line 1: port '0' is not a number"),
    ("h1 22 root /no/such/key", "line 1: key file /no/such/key does not exist"),
    ("h1 22 root k extra", "line 1: 5 fields, expected at most 4"),
    ("h1 port=22", "line 1: unknown option 'port' (the only one is peer=ADDRESS)"),
    ("h1 peer=", "line 1: peer= needs an address"),
    ("peer=10.0.0.1", "line 1: no host address before 'peer=10.0.0.1'"),
    ("127.0.0.1 2201", "line 1: 127.0.0.1 is this machine's loopback address"),
    ("localhost", "line 1: localhost is this machine's loopback address"),
    ("h1 peer=127.0.0.2", "line 1: peer=127.0.0.2 is a loopback address"),
    ("h1\n# x\nh1", "line 3: h1 is already on line 1"),
    ("h1\nh2 peer=h1", "line 2: peer address h1 is already that of line 1"),
    ("# nothing\n", "names no host"),
])
def test_each_bad_line_is_one_line_naming_it(text: str, message: str) -> None:
    with pytest.raises(HostsFileError) as caught:
        parse_hosts(text, "hosts.txt")
    assert message in str(caught.value)
    assert str(caught.value).startswith("hosts.txt")
    assert "\n" not in str(caught.value)


def test_an_unreadable_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(HostsFileError, match=r"cannot read the hosts file .*missing"):
        read_hosts(tmp_path / "missing")


def _run(argv: list[str], capsys) -> tuple[int, str]:  # noqa: ANN001
    code = main(argv)
    return code, capsys.readouterr().err.strip()


def test_the_ssh_flags_are_checked_before_anything_starts(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    code, err = _run(["run", "--platform", "ssh", "--duration", "5"], capsys)
    assert code == EXIT_HARNESS and err == ("error: --platform ssh needs --hosts FILE (one host per line; "
                                 "docs/nemesis.md, 'Real machines')")
    hosts = tmp_path / "hosts"
    hosts.write_text("10.0.0.1\n10.0.0.2\n10.0.0.3\n")
    code, err = _run(["run", "--platform", "ssh", "--hosts", str(hosts)], capsys)
    assert code == EXIT_HARNESS and err == (f"error: --nodes 5 needs 5 hosts, one per node; {hosts} "
                                 f"names 3")
    code, err = _run(["run", "--platform", "ssh", "--hosts", str(hosts), "--workload",
                      "trainer"], capsys)
    assert code == EXIT_HARNESS and err == ("error: --platform ssh runs the kv workload only for "
                                            "now; --workload trainer across hosts is not built "
                                            "yet (issue 26)")
    code, err = _run(["run", "--platform", "local", "--hosts", str(hosts)], capsys)
    assert code == EXIT_HARNESS and "are for --platform ssh" in err
    hosts.write_text("10.0.0.1 ssh\n")
    code, err = _run(["run", "--platform", "ssh", "--hosts", str(hosts), "--nodes", "1",
                      "--faults", "kill"], capsys)
    assert code == EXIT_HARNESS and err == f"error: {hosts} line 1: port 'ssh' is not a number from 1 to 65535"
    hosts.write_text("10.0.0.1\n10.0.0.2\n10.0.0.3\n")
    code, err = _run(["run", "--platform", "ssh", "--hosts", str(hosts), "--nodes", "3",
                      "--faults", "lose-unsynced"], capsys)
    assert code == EXIT_HARNESS and err == ("error: --faults lose-unsynced does not run on "
                                            "--platform ssh (it has no lazy disk to hold "
                                            "unsynced writes); use --platform local or docker "
                                            "or sim")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_host_is_one_line(tmp_path: Path) -> None:
    port = _closed_port()
    host = Host("127.0.0.1", port, "root", None, "10.1.2.3", 1)
    with SshHosts([host], known_hosts=tmp_path / "kh", accept_new=True) as ssh, \
            pytest.raises(SshError) as caught:
        ssh.connect()
    message = str(caught.value)
    assert message.startswith(f"root@127.0.0.1:{port}: unreachable:")
    assert "is sshd running there" in message and "\n" not in message


def test_no_known_hosts_file_and_no_flag_is_refused(tmp_path: Path) -> None:
    host = Host("10.1.2.3", 22, "root", None, "", 1)
    with SshHosts([host], known_hosts=tmp_path / "none") as ssh, \
            pytest.raises(SshError, match="--accept-new-host-keys"):
        ssh.connect()


def test_what_a_run_leaves_on_a_host_is_named_by_its_id() -> None:
    run_id = "kv-20261203T120000-" + "9" * 80
    assert len(chain_name(run_id)) <= 28  # iptables' limit
    assert chain_name(run_id) != chain_name(run_id + "x")
    assert remote_dir("kv-2026/../x 1").startswith("/var/tmp/mao-kv-2026")
    # one folder under /var/tmp whatever the id holds: rm -rf of it removes nothing else
    assert "/" not in remote_dir("kv-2026/../x 1")[len("/var/tmp/"):]
    assert " " not in remote_dir("a b")
    script = remove_script("/var/tmp/mao-r1", "MAO-abc", "mao-run:r1")
    assert "kill -KILL -" in script and "-X MAO-abc" in script and "rm -rf \"$R\"" in script
    assert "/var/tmp/mao-r1" not in script  # pkill -f "$R" must not match its own shell
