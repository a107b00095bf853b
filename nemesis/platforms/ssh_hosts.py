"""The hosts file of `--platform ssh --hosts FILE`: one host per line.

    # comments and blank lines are skipped
    ADDRESS [PORT [USER [KEY]]] [peer=PEER_ADDRESS]
    NAME                      # a Host of ~/.ssh/config: its HostName, Port, User, IdentityFile

ADDRESS is where the harness reaches the host's sshd; PORT defaults to 22 (or what the SSH
config says), USER to root (or the config's), KEY to the config's IdentityFile or ssh's
default keys. `peer=` is the address the other hosts reach this one at, when it is not
ADDRESS — a host reached through a forwarded port on 127.0.0.1 (the test hosts of
`ssh_testbed`) or through a bastion. The nodes listen on it and partitions cut by it.

Every bad line is one error naming the file and the line (`HostsFileError`).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path


class HostsFileError(ValueError):
    """A hosts file that cannot be used; the message is one line naming file and line."""


@dataclass(frozen=True)
class Host:
    """One line of the hosts file. `port`, `user`, `key` are None when the line leaves
    them to the SSH config (or ssh's defaults)."""

    address: str
    port: int | None = None
    user: str | None = None
    key: Path | None = None
    peer: str = ""
    line: int = 0

    @property
    def peer_address(self) -> str:
        return self.peer or self.address

    def label(self) -> str:
        """How messages name the host: `root@127.0.0.1:2201`."""
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"{user}{self.address}{port}"


def _is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def parse_line(text: str, line: int, where: str) -> Host | None:
    """The host of one line, None for a blank or comment line; HostsFileError otherwise."""
    text = text.split("#", 1)[0].strip()
    if not text:
        return None
    fields = text.split()
    peer = ""
    plain = []
    for item in fields:
        if "=" in item:
            name, _, value = item.partition("=")
            if name != "peer":
                raise HostsFileError(f"{where} line {line}: unknown option {name!r} (the "
                                     f"only one is peer=ADDRESS)")
            if not value:
                raise HostsFileError(f"{where} line {line}: peer= needs an address")
            peer = value
        else:
            plain.append(item)
    if not plain:
        raise HostsFileError(f"{where} line {line}: no host address before {fields[0]!r}")
    if len(plain) > 4:
        raise HostsFileError(f"{where} line {line}: {len(plain)} fields, expected at most 4: "
                             f"ADDRESS [PORT [USER [KEY]]] [peer=ADDRESS]")
    address, rest = plain[0], plain[1:]
    port = None
    if rest:
        if not rest[0].isdigit() or not 0 < int(rest[0]) < 65536:
            raise HostsFileError(f"{where} line {line}: port {rest[0]!r} is not a number "
                                 f"from 1 to 65535")
        port = int(rest[0])
    user = rest[1] if len(rest) > 1 else None
    key = None
    if len(rest) > 2:
        key = Path(rest[2]).expanduser()
        if not key.is_file():
            raise HostsFileError(f"{where} line {line}: key file {key} does not exist")
    if _is_loopback(peer or address) and peer == "":
        raise HostsFileError(f"{where} line {line}: {address} is this machine's loopback "
                             f"address, which the other hosts cannot reach; add "
                             f"peer=ADDRESS (where they reach this host)")
    if peer and _is_loopback(peer):
        raise HostsFileError(f"{where} line {line}: peer={peer} is a loopback address; give "
                             f"the address the other hosts reach this one at")
    return Host(address, port, user, key, peer, line)


def parse_hosts(text: str, where: str = "hosts file") -> list[Host]:
    hosts: list[Host] = []
    seen: dict[tuple[str, int | None], int] = {}
    peers: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        host = parse_line(raw, number, where)
        if host is None:
            continue
        key = (host.address, host.port)
        if key in seen:
            raise HostsFileError(f"{where} line {number}: {host.label()} is already on line "
                                 f"{seen[key]}; each node needs a host of its own")
        if host.peer_address in peers:
            raise HostsFileError(f"{where} line {number}: peer address {host.peer_address} "
                                 f"is already that of line {peers[host.peer_address]}; each "
                                 f"node needs a host of its own")
        seen[key] = number
        peers[host.peer_address] = number
        hosts.append(host)
    if not hosts:
        raise HostsFileError(f"{where} names no host (one per line: ADDRESS [PORT [USER "
                             f"[KEY]]] [peer=ADDRESS], or an SSH config host name)")
    return hosts


def read_hosts(path: Path) -> list[Host]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise HostsFileError(f"cannot read the hosts file {path}: {exc.strerror}") from None
    return parse_hosts(text, str(path))
