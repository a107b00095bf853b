"""SourceAwareProxy with real processes: each "member" is a Python subprocess that opens
connections to the proxy and echoes through them on command; the proxy places each
connection by its pid (nemesis/platforms/source_proxy.py)."""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from nemesis.platforms.source_proxy import UNKNOWN, ProxyMode, SourceAwareProxy, find_owner

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# A member: reads commands on stdin, answers one line each. "open" connects to the proxy;
# "echo <i> <word> [timeout]" sends word on connection i and prints what comes back (EOF
# if the connection was closed, an error's name if it was reset or nothing came back).
MEMBER = """
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
conns = []
print("ready", flush=True)
for line in sys.stdin:
    cmd, *args = line.split()
    try:
        if cmd == "open":
            conns.append(socket.create_connection((host, port), timeout=5))
            print("opened", len(conns) - 1, flush=True)
        elif cmd == "echo":
            c = conns[int(args[0])]
            c.settimeout(float(args[2]) if len(args) > 2 else 5)
            c.sendall(args[1].encode())
            data = c.recv(100)
            print("got", data.decode() if data else "EOF", flush=True)
    except OSError as e:
        print("error", type(e).__name__, flush=True)
"""

# A member whose socket is also held by a forked child (registered as another member):
# it creates the socket, forks, prints the child's pid, and connects on "go".
FORKED = """
import os, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
s = socket.socket()
r, w = os.pipe()
child = os.fork()
if child == 0:
    os.close(w)
    os.read(r, 1)  # until the parent exits
    os._exit(0)
os.close(r)
print("child", child, flush=True)
sys.stdin.readline()
s.connect((host, port))
s.sendall(b"shared")
print("got", s.recv(100).decode() or "EOF", flush=True)
sys.stdin.readline()
"""

TIMEOUT_S = 10
SERVER: list[EchoServer] = []  # the running test's echo server


class Member:
    """A member subprocess and a line-at-a-time conversation with it (answers with a
    deadline, never a fixed sleep)."""

    def __init__(self, proxy: SourceAwareProxy, script: str = MEMBER, shell: bool = False):
        host, _, port = proxy.address.rpartition(":")
        argv = [sys.executable, "-c", script, host, port]
        if shell:  # `sh -c '...; true'`: sh stays the parent, python is its child
            argv = ["sh", "-c", " ".join(f"'{a}'" for a in argv) + "; true"]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        self.pid = self.proc.pid
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.strip())

    def answer(self) -> str:
        try:
            return self._lines.get(timeout=TIMEOUT_S)
        except queue.Empty:
            raise AssertionError(f"member {self.pid} did not answer in {TIMEOUT_S} s") from None

    def ask(self, line: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.answer()

    def open(self) -> int:
        reply = self.ask("open")
        assert reply.startswith("opened"), reply
        return int(reply.split()[1])

    def echo(self, conn: int, word: str, timeout_s: float = 5) -> str:
        return self.ask(f"echo {conn} {word} {timeout_s}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=TIMEOUT_S)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


class EchoServer:
    """The destination: echoes whatever arrives, one thread per connection."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.received: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(4096):
                    self.received.append(data)
                    conn.sendall(data)
            except OSError:
                pass

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept (close does not)
        self.sock.close()
        self._thread.join(timeout=TIMEOUT_S)


@pytest.fixture
def setup() -> Iterator[tuple[SourceAwareProxy, dict[int, str], list[Member]]]:
    """An echo server, a proxy in front of it whose members are `members` (pid -> node),
    and a list the test appends its Member processes to (all stopped afterwards)."""
    server = EchoServer()
    SERVER[:] = [server]
    members: dict[int, str] = {}
    proxy = SourceAwareProxy(server.address, lambda: dict(members))
    started: list[Member] = []
    try:
        yield proxy, members, started
    finally:
        for m in started:
            m.stop()
        proxy.close()
        server.close()


def start(setup_, node: str, **kwargs: object) -> Member:
    proxy, members, started = setup_
    m = Member(proxy, **kwargs)  # type: ignore[arg-type]
    started.append(m)
    if m.answer() != "ready":
        raise AssertionError("member did not start")
    members[m.pid] = node
    return m


def test_it_listens_on_loopback_only(setup) -> None:
    proxy, _, _ = setup
    assert proxy._listener.getsockname()[0] == "127.0.0.1"  # bound there, not 0.0.0.0


def test_cutting_a_closes_its_open_connection_and_leaves_b_flowing(setup) -> None:
    proxy, _, _ = setup
    a, b = start(setup, "a"), start(setup, "b")
    a0, b0 = a.open(), b.open()
    assert a.echo(a0, "hello") == "got hello"
    assert b.echo(b0, "hello") == "got hello"
    assert proxy.connections() == {"a": 1, "b": 1}  # each placed by its pid

    proxy.set_mode("a", ProxyMode.CUT)
    assert a.echo(a0, "again") in ("got EOF", "error ConnectionResetError",
                                   "error BrokenPipeError")  # closed at once, not later
    assert b.echo(b0, "again") == "got again"  # the same connection of b: untouched
    a1 = a.open()  # the kernel completes the handshake; the proxy closes it
    assert a.echo(a1, "new") in ("got EOF", "error ConnectionResetError")
    b1 = b.open()
    assert b.echo(b1, "new") == "got new"
    assert proxy.connections() == {"b": 2}
    assert proxy.unplaced == 0


def test_heal_restores_a(setup) -> None:
    proxy, _, _ = setup
    a = start(setup, "a")
    proxy.set_mode("a", ProxyMode.CUT)
    assert a.echo(a.open(), "cut") in ("got EOF", "error ConnectionResetError")
    proxy.heal_all()
    assert proxy.mode("a") is ProxyMode.FORWARD
    assert a.echo(a.open(), "healed") == "got healed"


def test_drop_replies_applies_to_one_source(setup) -> None:
    proxy, _, _ = setup
    a, b = start(setup, "a"), start(setup, "b")
    a0, b0 = a.open(), b.open()
    proxy.set_mode("a", ProxyMode.DROP_REPLIES)
    # a's word arrives (the server echoes it) but its answer is dropped: a hears nothing
    # within a second (the one wait here is for an absence).
    assert a.echo(a0, "lost", timeout_s=1) == "error TimeoutError"
    assert b"lost" in SERVER[0].received
    assert b.echo(b0, "kept") == "got kept"  # b still hears its answers
    proxy.set_loss("b", 0.5)
    assert proxy.loss("b") == 0.5 and proxy.loss("a") == 0.0
    with pytest.raises(ValueError):
        proxy.set_loss("a", 1.0)


def test_a_restarted_member_with_a_new_pid_is_still_placed(setup) -> None:
    proxy, members, started = setup
    a = start(setup, "a")
    old_pid = a.pid
    assert a.echo(a.open(), "first") == "got first"
    assert proxy.connections() == {"a": 1}
    proxy.set_mode("a", ProxyMode.CUT)
    a.stop()
    del members[old_pid]
    a2 = start(setup, "a")
    assert a2.pid != old_pid
    assert a2.echo(a2.open(), "restarted") in ("got EOF", "error ConnectionResetError")
    proxy.heal_all()
    a2.echo(a2.open(), "x")
    assert proxy.connections() == {"a": 1}


def test_a_member_run_by_sh_is_placed_through_its_descendants(setup) -> None:
    proxy, _, _ = setup
    a = start(setup, "a", shell=True)  # a.pid is sh's; python is its child
    a0 = a.open()
    assert a.echo(a0, "via-sh") == "got via-sh"
    assert proxy.connections() == {"a": 1}
    proxy.set_mode("a", ProxyMode.CUT)
    assert a.echo(a0, "cut") in ("got EOF", "error ConnectionResetError",
                                 "error BrokenPipeError")


def test_a_non_member_is_unknown_forwarded_by_default_and_cut_only_when_asked(setup) -> None:
    proxy, _, _ = setup
    b = start(setup, "b")
    b0 = b.open()
    proxy.set_mode("a", ProxyMode.CUT)  # a cut member says nothing about non-members
    port = int(proxy.address.rpartition(":")[2])
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as s:
        s.sendall(b"test")  # this process is no member
        assert s.recv(100) == b"test"
        assert proxy.connections() == {UNKNOWN: 1, "b": 1}
        assert proxy.non_members == 1 and proxy.unplaced == 0
        proxy.set_mode(UNKNOWN, ProxyMode.CUT)
        assert s.recv(100) == b""  # closed
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as s:
        assert s.recv(100) == b""  # refused
    assert b.echo(b0, "member") == "got member"  # members untouched


def test_a_socket_two_members_hold_is_not_placed(setup, caplog) -> None:
    """A member forks a child (registered as another member) that inherits the socket:
    the proxy cannot tell whose the connection is, so it says so and places it nowhere."""
    proxy, members, started = setup
    host, _, port = proxy.address.rpartition(":")
    m = Member(proxy, script=FORKED)
    started.append(m)
    child = int(m.answer().split()[1])
    members[m.pid] = "a"
    members[child] = "b"
    proxy.set_mode("a", ProxyMode.CUT)
    proxy.set_mode("b", ProxyMode.CUT)
    with caplog.at_level("WARNING", logger="nemesis.platforms.source_proxy"):
        assert m.ask("go") == "got shared"  # unknown: forwarded, though a and b are cut
    assert proxy.unplaced == 1 and proxy.placed == 0
    assert "more than one member" in caplog.text
    assert proxy.connections() == {UNKNOWN: 1}


def test_the_search_is_bounded(setup) -> None:
    """A member tree bigger than the budget is not searched to the end: not placed."""
    proxy, _, _ = setup
    a = start(setup, "a", shell=True)
    assert a.echo(a.open(), "x") == "got x"  # the proxy has the connection now
    # find_owner with room for one process: sh is searched, its python child is not.
    inode = _inode_of_members_connection(proxy)
    assert find_owner(inode, {a.pid: "a"}, deadline=float("inf"), max_pids=1)[0] is None
    assert find_owner(inode, {a.pid: "a"}, deadline=float("inf"))[0] == "a"


def _inode_of_members_connection(proxy: SourceAwareProxy) -> int:
    from nemesis.platforms.source_proxy import socket_inode

    with proxy._lock:
        (pair,) = proxy._pairs
        peer = pair.client.getpeername()
    host, _, port = proxy.address.rpartition(":")
    inode = socket_inode(peer, (host, int(port)))
    assert inode is not None
    return inode


def _proxy_sockets(proxy: SourceAwareProxy, server: EchoServer) -> list[str]:
    """This process's descriptors that are the proxy's sockets: its listener, what it
    accepted (local address the proxy's) and its connections to the server (remote the
    server's)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        with s:
            local = "{}:{}".format(*s.getsockname()[:2])
            try:
                remote = "{}:{}".format(*s.getpeername()[:2])
            except OSError:  # a listener
                remote = ""
            if local == proxy.address or remote == server.address:
                found.append(f"{fd}: {local} -> {remote}")
    return found


def _proxy_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate()
            if t.is_alive() and (t.name.startswith("proxy-") or "_pump" in t.name)]


def test_close_leaves_no_threads_or_sockets() -> None:
    # Only this proxy's threads count: a proxy another test left open is that test's leak.
    others = set(_proxy_threads())
    server = EchoServer()
    members: dict[int, str] = {}
    proxy = SourceAwareProxy(server.address, lambda: dict(members))
    m = Member(proxy)
    try:
        assert m.answer() == "ready"
        members[m.pid] = "a"
        m0, m1 = m.open(), m.open()
        assert m.echo(m0, "x") == "got x" and m.echo(m1, "y") == "got y"
        assert len(_proxy_sockets(proxy, server)) == 5  # listener + 2 pairs
        assert len(set(_proxy_threads()) - others) == 5  # acceptor + 2 pumps per connection
        proxy.close()
        assert _proxy_sockets(proxy, server) == []
        assert set(_proxy_threads()) - others == set()
        assert m.echo(m0, "after") in ("got EOF", "error ConnectionResetError",
                                       "error BrokenPipeError")
    finally:
        m.stop()
        proxy.close()
        server.close()


def test_a_member_whose_descriptors_cannot_be_read_is_not_called_a_non_member(monkeypatch) -> None:
    """Another user's process (hidepid, no ptrace right): the search cannot say the
    socket is not there, so it is unplaced, not a non-member (nor a member)."""
    from nemesis.platforms import source_proxy

    monkeypatch.setattr(source_proxy, "_holds", lambda pid, target: None)
    monkeypatch.setattr(source_proxy, "_children", lambda pid: [])
    node, reason = find_owner(12345, {os.getpid(): "a"}, deadline=float("inf"))
    assert node is None and reason.startswith("cannot read"), reason


# --- etcd: three members, each advertising its SourceAwareProxy as its peer URL ---------


def _etcd_call(address: str, path: str, body: dict, timeout_s: float) -> dict:
    """One call to etcd's JSON gateway (v3 API over HTTP), so no gRPC stubs are needed."""
    import json
    import urllib.request

    req = urllib.request.Request(f"http://{address}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.loads(r.read())


def _etcd_put(address: str, key: str, timeout_s: float) -> bool:
    import base64

    try:
        _etcd_call(address, "/v3/kv/put", {"key": base64.b64encode(key.encode()).decode(),
                                           "value": base64.b64encode(b"v").decode()}, timeout_s)
        return True
    except OSError:  # URLError, timeouts, refused: all OSError
        return False


def _etcd_leader(clients: dict[str, str], among: list[str]) -> str | None:
    """The member every one of `among` names as leader, or None."""
    ids, leaders = {}, set()
    for name in among:
        try:
            s = _etcd_call(clients[name], "/v3/maintenance/status", {}, timeout_s=1)
        except OSError:
            return None
        ids[s["header"]["member_id"]] = name
        leaders.add(s.get("leader"))
    if len(leaders) == 1 and (leader := leaders.pop()) in ids:
        return ids[leader]
    return None


def test_etcd_isolating_the_leader_through_source_proxies(tmp_path) -> None:
    from nemesis.systems.etcd.node import SETUP_HINT, EtcdMember, etcd_binary
    from system.ports import free_ports
    from tests.nemesis.waiting import wait_until

    binary = etcd_binary()
    if binary is None:
        pytest.skip(SETUP_HINT)
    names = ["e1", "e2", "e3"]
    ports = free_ports(6)
    clients = {n: f"127.0.0.1:{p}" for n, p in zip(names, ports[:3], strict=True)}
    peers = {n: f"127.0.0.1:{p}" for n, p in zip(names, ports[3:], strict=True)}
    pids: dict[int, str] = {}
    proxies = {n: SourceAwareProxy(peers[n], lambda: dict(pids)) for n in names}
    procs: list[subprocess.Popen] = []
    try:
        cluster = {n: proxies[n].address for n in names}  # advertised: the proxies
        for n in names:
            member = EtcdMember(name=n, data_dir=tmp_path / n, client=clients[n],
                                peer=proxies[n].address, listen_peer=peers[n], cluster=cluster)
            log = open(tmp_path / f"{n}.log", "wb")  # noqa: SIM115 - closed with the process
            procs.append(subprocess.Popen(member.command(binary), stdout=log, stderr=log))
            log.close()
            pids[procs[-1].pid] = n
        leader = wait_until(lambda: _etcd_leader(clients, names), 30, "a leader")
        assert _etcd_put(clients[leader], "before", timeout_s=5)
        others = [n for n in names if n != leader]
        for other in others:  # both ways: see the module docstring on etcd's streams
            proxies[other].set_mode(leader, ProxyMode.CUT)
            proxies[leader].set_mode(other, ProxyMode.CUT)
        new = wait_until(lambda: (n := _etcd_leader(clients, others)) != leader and n, 20,
                         "the majority's own leader")
        assert _etcd_put(clients[new], "majority", timeout_s=5)
        assert not _etcd_put(clients[leader], "minority", timeout_s=3)  # no quorum
        assert proxies[leader].connections() == {}
        for proxy in proxies.values():
            proxy.heal_all()
        wait_until(lambda: _etcd_put(clients[leader], "healed", timeout_s=1), 20,
                   "a write through the healed member")
        assert all(p.unplaced == 0 and p.placed > 0 for p in proxies.values()), \
            [(p.placed, p.non_members, p.unplaced) for p in proxies.values()]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for proxy in proxies.values():
            proxy.close()
