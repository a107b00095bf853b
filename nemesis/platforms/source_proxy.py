"""A loopback TCP proxy per destination that knows which member each connection comes from.

Why: the local platform partitions its processes with one `TcpProxy` per directed link
(node i reaches node j at proxy (i, j)), which needs every node to be told its own
address for each peer. Our store allows that; etcd does not. An etcd member dials a peer
at the one peer URL that peer advertises (`--initial-advertise-peer-urls`, also the
member's identity: etcd derives member ids from those URLs), so there is one address per
destination and every sender comes through the same proxy. To cut i -> j only, that one
proxy must know whose each connection is.

How it tells: on Linux, an accepted connection's peer address (127.0.0.1, sport) is the
sender socket's local address; /proc/net/tcp (and tcp6, for v4-mapped sockets) gives that
socket's inode, the entry whose local address is the peer address and whose remote is
this proxy's listen address (never the proxy's own accepted socket, which is the reverse);
the process holding it has `socket:[inode]` among /proc/<pid>/fd. Only the pids the caller
names as members (`members()`: pid -> node id, asked per connection, since a restarted
node has a new pid) and their descendants (a member may be `sh -c` running the real
server; threads share their process's descriptor table) are looked at, never the whole
of /proc. The work per connection is bounded: at most `MAX_PIDS` processes, and the
lookup gives up after `budget_s`.

Senders it does not place: a connection from a process that is no member (a harness
client, a test, a probe) and one it cannot place (the socket is gone already, two
members hold it, the pid walk ran out of budget, `members()` failed) both get the mode of
`UNKNOWN`, which is FORWARD unless set. Forwarded, not refused, because what goes wrong
either way is not alike: refusing would inject a fault nobody scheduled into a healthy
cluster (and turn away harness probes), while forwarding a connection of a cut member
only makes that partition leak, which weakens the test and cannot make a checker report
an anomaly that did not happen. A connection it cannot place is logged (a warning naming
the address and the reason) and counted (`unplaced`), so a run can say its partitions
leaked. It never guesses: a socket held by two members is not placed.

How the local platform should use it: one `SourceAwareProxy` per node, in front of that
node's peer port (the node listens on a private port, `listen_peer`, and advertises the
proxy's address as its peer URL), with `members` the platform's current node pids ->
node ids. Cutting src -> dst is `proxies[dst].set_mode(src, ProxyMode.CUT)`; isolating n
is that for every dst != n, plus `proxies[n].set_mode(m, CUT)` for every m != n; heal is
`heal_all()` on each. A cut closes that sender's open connections at once and refuses its
new ones; other senders' connections are untouched. Reply traffic of a connection goes
back through the same proxy, so cutting src -> dst also cuts dst's answers on src's
connections (as TcpProxy does); dst's own connections to src go through src's proxy.

A cut is of the connections src opens to dst, which for etcd is not a one-way cut of
messages: a member receives a peer's raft messages on the stream it dials to that peer
(rafthttp's stream reader), and sends its own on the streams the peer dialed to it, or by
POSTing to the peer (pipeline) when no stream works. So cutting only the connections the
leader opens to the others, or only those the others open to the leader, changed nothing
(tried by hand, 3 members: no election in 6 s, writes through the leader still
committed); cutting both ways isolates (the other two elected a leader in 1.1-1.4 s,
writes through the old leader timed out; tests/nemesis/test_source_proxy.py). For etcd
the platform should offer symmetric cuts (both `proxies[dst].set_mode(src, CUT)` and
`proxies[src].set_mode(dst, CUT)`), or say that a directed cut there means "src cannot
connect to dst".

A connection is placed once, when accepted, and keeps its source: the platform must add
a restarted node's pid to `members()` as soon as it has spawned it (before the node can
dial), or that node's first connections are UNKNOWN for as long as they last.

What it must never do: listen anywhere but loopback, outlive `close()`, block on /proc
(bounded work per connection), or attribute a connection to a member it cannot prove
holds the socket. Linux only (it reads /proc), and the members must be processes this
user may inspect (else their connections are not placed, and say so). What it trusts the
caller for: `members()` is current; a dead member's pid reused by an unrelated process
before the caller drops it would be taken for that member.

Cost (measured on the 2-core dev machine, busy): placing a connection takes a median of
1-5 ms (one read of /proc/net/tcp, ~360 lines, about 0.9 ms; then each member's
descriptors), at most ~50 ms under load; the budget is 0.2 s. It is paid once per
connection, in the acceptor: etcd's peers hold a few long-lived streams each.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Hashable, Mapping

from nemesis.platforms.tcp_proxy import ALL, Forwarder, ProxyMode, check_loss

log = logging.getLogger(__name__)

# The source of connections from non-members and from senders it cannot place.
UNKNOWN = None
# At most this many processes (members and their descendants) are looked at per connection.
MAX_PIDS = 64


def _proc_hex(ip: str, port: int) -> tuple[str, str]:
    """How /proc/net/tcp and tcp6 print an IPv4 address and port: the address's 32-bit
    words in host byte order as hex, then the port; tcp6 shows it v4-mapped."""
    (word,) = struct.unpack("=I", socket.inet_aton(ip))
    v4 = f"{word:08X}:{port:04X}"
    (mapped,) = struct.unpack("=I", b"\x00\x00\xff\xff")
    v6 = f"{0:08X}{0:08X}{mapped:08X}{word:08X}:{port:04X}"
    return v4, v6


def socket_inode(local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """The inode of the TCP socket whose local address is `local` and remote `remote`
    (in this network namespace), or None."""
    local_v4, local_v6 = _proc_hex(*local)
    remote_v4, remote_v6 = _proc_hex(*remote)
    for table, needle in (("/proc/net/tcp", f" {local_v4} {remote_v4} "),
                          ("/proc/net/tcp6", f" {local_v6} {remote_v6} ")):
        try:
            with open(table) as f:
                for line in f:
                    if needle in line:
                        # sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
                        inode = int(line.split()[9])
                        return inode or None  # 0: no longer owned by a process
        except OSError:
            continue
    return None


def _children(pid: int) -> list[int]:
    """pid's child processes, from every thread's children list (a child is listed under
    the thread that forked it). Empty if pid is gone."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return out


def _holds(pid: int, target: str) -> bool | None:
    """Whether process pid has a descriptor on `target` ("socket:[inode]"); None if its
    descriptors cannot be read (another user's process): then nobody can say it does not."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except PermissionError:
        return None
    except OSError:  # gone: it holds nothing
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                return True
        except OSError:
            continue
    return False


def find_owner(inode: int, members: Mapping[int, str], deadline: float,
               max_pids: int = MAX_PIDS) -> tuple[str | None, str]:
    """(node id, "") of the one member whose process tree holds socket `inode`;
    (None, "not a member") if the whole trees were searched and none does; (None, reason)
    when it cannot tell (two members hold it, out of budget)."""
    target = f"socket:[{inode}]"
    owners: set[str] = set()
    seen: set[int] = set()
    queue = [(pid, node) for pid, node in members.items()]
    complete = True
    unreadable: list[int] = []
    while queue:
        pid, node = queue.pop(0)
        if pid in seen:
            continue
        if len(seen) >= max_pids or time.monotonic() > deadline:
            complete = False
            break
        seen.add(pid)
        holds = _holds(pid, target)
        if holds:
            owners.add(node)
        elif holds is None:
            unreadable.append(pid)
        queue += [(child, node) for child in _children(pid)]
    if len(owners) > 1:
        return None, f"held by more than one member: {sorted(owners)}"
    if unreadable:
        complete = False
    if owners and complete:
        return owners.pop(), ""
    if owners:  # another member's tree was not searched to the end: it may hold it too
        return None, f"found in {sorted(owners)} but the search ran out of budget"
    if unreadable:
        return None, f"cannot read the descriptors of pids {unreadable}"
    if not complete:
        return None, f"not found within {max_pids} processes / the time budget"
    return None, "not a member"


class SourceAwareProxy(Forwarder):
    """Listens on 127.0.0.1:<port>, forwards each connection to `target`, and applies the
    mode and loss of the member the connection comes from (see the module docstring).
    `members()` is called once per accepted connection: pid -> node id."""

    def __init__(self, target: str, members: Callable[[], Mapping[int, str]],
                 listen_port: int = 0, *, seed: int | None = None,
                 budget_s: float = 0.2) -> None:
        self._members = members
        self._budget_s = budget_s
        self._modes: dict[Hashable, ProxyMode] = {}
        self._losses: dict[Hashable, float] = {}
        self._stats_lock = threading.Lock()
        self.placed = 0  # connections attributed to a member
        self.non_members = 0  # searched every member's tree: none holds it
        self.unplaced = 0  # could not tell (logged): treated as UNKNOWN
        self.identify_s: list[float] = []  # time spent placing each connection (last 1000)
        super().__init__(target, listen_port, seed=seed)

    def mode(self, source: Hashable) -> ProxyMode:
        return self._modes.get(source, ProxyMode.FORWARD)

    def set_mode(self, source: Hashable, mode: ProxyMode) -> None:
        """Apply `mode` to connections from `source` (a node id, or UNKNOWN); CUT closes
        that source's open connections now and refuses its new ones."""
        with self._lock:
            self._modes[source] = mode
            if mode is ProxyMode.CUT:
                self._close_connections(source)

    def loss(self, source: Hashable) -> float:
        return self._losses.get(source, 0.0)

    def set_loss(self, source: Hashable, probability: float) -> None:
        """Hold each of `source`'s chunks, with this probability, for one retransmission
        timeout (0 = off); see tcp_proxy."""
        self._losses[source] = check_loss(probability)

    def heal_all(self) -> None:
        """Every source back to FORWARD, no loss."""
        with self._lock:
            self._modes.clear()
            self._losses.clear()

    def connections(self) -> dict[Hashable, int]:
        """Open connections per source."""
        with self._lock:
            counts: dict[Hashable, int] = {}
            for pair in self._pairs:
                counts[pair.source] = counts.get(pair.source, 0) + 1
            return counts

    def _mode_for(self, source: Hashable) -> ProxyMode:
        return self._modes.get(source, ProxyMode.FORWARD)

    def _loss_for(self, source: Hashable) -> float:
        return self._losses.get(source, 0.0)

    def _source_of(self, client: socket.socket, peer: tuple[str, int]) -> Hashable:
        start = time.monotonic()
        try:
            node, reason = self._identify(peer, start + self._budget_s)
        except Exception as e:  # noqa: BLE001 - an odd /proc line must not kill the acceptor
            node, reason = None, f"identification failed: {e!r}"
        elapsed = time.monotonic() - start
        with self._stats_lock:
            self.identify_s = self.identify_s[-999:] + [elapsed]
            if node is not None:
                self.placed += 1
            elif reason == "not a member":
                self.non_members += 1
            else:
                self.unplaced += 1
                log.warning("proxy %s cannot tell whose connection from %s:%d is (%s); "
                            "treating it as unknown (%s)", self.address, peer[0], peer[1],
                            reason, self._mode_for(UNKNOWN).value)
        return node if node is not None else UNKNOWN

    def _identify(self, peer: tuple[str, int], deadline: float) -> tuple[str | None, str]:
        listen_host, _, listen_port = self.address.rpartition(":")
        inode = socket_inode((peer[0], peer[1]), (listen_host, int(listen_port)))
        if inode is None:
            return None, "its socket is not in /proc/net/tcp (closed already?)"
        try:
            members = dict(self._members())
        except Exception as e:  # noqa: BLE001 - the caller's callback; never kill the acceptor
            return None, f"members() failed: {e!r}"
        return find_owner(inode, members, deadline)


__all__ = ["ALL", "MAX_PIDS", "UNKNOWN", "ProxyMode", "SourceAwareProxy", "find_owner",
           "socket_inode"]
