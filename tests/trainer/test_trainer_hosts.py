"""`run --hosts FILE` without hosts: its placement, each argument error as one line and
exit 2 before anything is contacted, an unreachable host as one line, and the bit-for-bit
comparison with the one-process reference catching a planted difference. The run across
real sshd hosts is tests/trainer/test_trainer_hosts_ssh.py (slow)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from nemesis.trainer_hosts import placement
from system.trainer.__main__ import main
from system.trainer.cli import reference_row
from system.trainer.config import TrainConfig
from system.trainer.local import train_local


def test_processes_go_round_robin_over_the_hosts_in_start_order() -> None:
    assert placement(["c1", "c2", "w0", "w1", "w2", "w3"], 5) == [0, 1, 2, 3, 4, 0]
    assert placement(["c3"], 5, start=6) == [1]  # a replacement takes the next host


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _hosts(tmp_path: Path, lines: list[str], name: str = "hosts") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def _one_line_error(capsys, argv: list[str], code: int = 2) -> str:  # noqa: ANN001
    assert main(["run", "--dataset", "breast_cancer", "--workers", "2", "--steps", "50",
                 *argv]) == code
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


THREE = [f"127.0.0.1 {2201 + i} root peer=10.9.9.{i + 1}" for i in range(3)]


@pytest.mark.parametrize("case,message", [
    ("missing-file", "cannot read the hosts file"),
    ("bad-port", "line 1: port '22x' is not a number"),
    ("two-hosts", "names 2 host(s): the store this run starts needs 3"),
    ("object-store", "with --hosts use inline or s3://"),
    ("tls", "--hosts runs without TLS"),
    ("kill-no-standby", "--kill-coordinator-at-step needs a standby"),
    ("kill-past-end", "--kill-coordinator-at-step must be from 1 to 49"),
    ("known-hosts-alone", "--known-hosts and --accept-new-host-keys are for --hosts"),
    ("known-hosts-missing", "does not exist"),
])
def test_argument_errors_are_one_line_before_any_host_is_contacted(
        tmp_path: Path, capsys, case: str, message: str) -> None:  # noqa: ANN001
    hosts = _hosts(tmp_path, THREE)
    argv = {
        "missing-file": ["--hosts", str(tmp_path / "nope")],
        "bad-port": ["--hosts", str(_hosts(tmp_path, ["10.0.0.1 22x root"], "bad"))],
        "two-hosts": ["--hosts", str(_hosts(tmp_path, THREE[:2], "two"))],
        "object-store": ["--hosts", str(hosts), "--checkpoint-store", "object"],
        "tls": ["--hosts", str(hosts), "--tls"],
        "kill-no-standby": ["--hosts", str(hosts), "--standbys", "0",
                            "--kill-coordinator-at-step", "10"],
        "kill-past-end": ["--kill-coordinator-at-step", "50"],
        "known-hosts-alone": ["--known-hosts", str(hosts)],
        "known-hosts-missing": ["--hosts", str(hosts), "--known-hosts", str(tmp_path / "kh")],
    }[case]
    assert message in _one_line_error(capsys, argv)


def test_an_unreachable_host_is_one_line_naming_it(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    port = _closed_port()
    hosts = _hosts(tmp_path, [f"127.0.0.1 {port} root peer=10.9.9.{i}" for i in (1, 2, 3)][:1]
                   + THREE[1:])
    known = tmp_path / "known_hosts"
    known.write_text("")
    line = _one_line_error(capsys, ["--hosts", str(hosts), "--known-hosts", str(known)], code=1)
    assert "unreachable" in line and "127.0.0.1:" in line, line


def test_the_reference_comparison_catches_a_planted_difference() -> None:
    config = TrainConfig(dataset="breast_cancer", workers=2, steps=20, batch_size=16,
                         learning_rate=0.05, checkpoint_every=10)
    same = train_local(config).params
    assert reference_row(config, same)[1] == "bit-for-bit equal"
    other_seed = train_local(TrainConfig(**{**config.__dict__, "seed": 1})).params
    assert reference_row(config, other_seed)[1].startswith("DIFFERS (")
    one_bit = same.copy()
    one_bit.view("uint8")[0] ^= 1  # the last bit of one value
    assert reference_row(config, one_bit)[1] == f"DIFFERS (1 of {same.size} values)"
