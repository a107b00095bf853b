"""SSH connections to the hosts of `--platform ssh`, one per host, reused for every command,
file copy and port forward of a run (asyncssh, on one event loop in a thread of its own, so
the harness's threads call it as plain blocking functions).

Host keys are always checked: against the `known_hosts` file the user gives (default
~/.ssh/known_hosts), or, with `accept_new=True` (`--accept-new-host-keys`), a host that file
does not know yet is trusted on first sight and added to it, as ssh's
`StrictHostKeyChecking=accept-new` does; a known host whose key differs is refused either
way. Every failure to connect is one line naming the host and what to do
(`SshError`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from nemesis.platforms.base import PlatformError
from nemesis.platforms.ssh_hosts import Host

T = TypeVar("T")
CONNECT_TIMEOUT_S = 15.0
SSH_CONFIG = Path("~/.ssh/config").expanduser()
DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts").expanduser()


class SshError(PlatformError):
    """A host cannot be reached or used; one line naming it."""


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] or type(exc).__name__


# asyncssh logs every channel and command at INFO: thousands of lines in harness.log per
# run (each node status check is a command). Its warnings and errors still get through.
logging.getLogger("asyncssh").setLevel(logging.WARNING)


class _Loop:
    """An asyncio loop in a daemon thread; `call` runs a coroutine on it and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="ssh-loop",
                                       daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s)
        except BaseException:
            future.cancel()
            raise

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.thread.is_alive():
            self.loop.close()


class SshHosts:
    """Connections to `hosts`, made by `connect()`; `run`, `put`, `get`, `forward` by host
    index. Use as a context manager or call `close()` (idempotent)."""

    def __init__(self, hosts: list[Host], *, known_hosts: Path | None = None,
                 accept_new: bool = False) -> None:
        self.hosts = hosts
        self.known_hosts = (known_hosts or DEFAULT_KNOWN_HOSTS).expanduser()
        self.accept_new = accept_new
        self._loop = _Loop()
        self._conns: dict[int, Any] = {}
        self._sudo: dict[int, str] = {}  # "sudo -n " for a host where we log in as non-root
        self._listeners: list[Any] = []
        self._known_lock = threading.Lock()
        self._closed = False

    def __enter__(self) -> SshHosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- connecting ------------------------------------------------------------------

    def connect(self) -> None:
        """Connect to every host at once; SshError naming the first that failed."""
        if not self.accept_new and not self.known_hosts.is_file():
            raise SshError(f"no known_hosts file at {self.known_hosts}: give one with "
                           f"--known-hosts FILE, or trust each host's key on first sight with "
                           f"--accept-new-host-keys")

        async def all_hosts() -> list[BaseException | None]:
            return await asyncio.gather(*(self._connect(i) for i in range(len(self.hosts))),
                                        return_exceptions=True)

        for outcome in self._loop.call(all_hosts()):
            if isinstance(outcome, BaseException):
                raise outcome

    def _options(self, host: Host) -> dict[str, Any]:
        import asyncssh

        options: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT_S,
                                   "keepalive_interval": 10, "keepalive_count_max": 3}
        if SSH_CONFIG.is_file():
            options["config"] = [str(SSH_CONFIG)]
        if host.port is not None:
            options["port"] = host.port
        options["username"] = host.user or ("root" if not SSH_CONFIG.is_file() else None)
        if options["username"] is None:
            del options["username"]
        if host.key is not None:
            try:
                options["client_keys"] = [asyncssh.read_private_key(str(host.key))]
            except (OSError, asyncssh.KeyImportError) as exc:
                raise SshError(f"{host.label()}: cannot read the key {host.key}: "
                               f"{_one_line(exc)}") from None
        if self.accept_new:
            options["known_hosts"] = None  # checked by hand in _check_host_key
        else:
            options["known_hosts"] = str(self.known_hosts)
        return options

    async def _connect(self, index: int) -> None:
        import asyncssh

        host = self.hosts[index]
        options = self._options(host)
        where = host.label()
        try:
            conn = await asyncssh.connect(host.address, **options)
        except asyncssh.HostKeyNotVerifiable as exc:
            raise SshError(f"{where}: its host key is not the one {self.known_hosts} holds, "
                           f"or that file does not know it ({_one_line(exc)}); if the host was "
                           f"reinstalled, remove its old line (ssh-keygen -R) — or pass "
                           f"--accept-new-host-keys to trust hosts seen for the first "
                           f"time") from None
        except asyncssh.PermissionDenied:
            key = f"the key {host.key}" if host.key else "every key offered"
            raise SshError(f"{where}: the host refused {key} for user "
                           f"{options.get('username', 'the configured user')}; put the public "
                           f"key in that user's ~/.ssh/authorized_keys") from None
        except (TimeoutError, OSError, asyncssh.Error) as exc:
            raise SshError(f"{where}: unreachable: {_one_line(exc)} (is sshd running there, "
                           f"and the address and port right?)") from None
        if self.accept_new:
            try:
                self._check_host_key(host, conn)
            except BaseException:
                conn.close()
                raise
        self._conns[index] = conn
        await self._check_root(index, conn)

    async def _check_root(self, index: int, conn: Any) -> None:  # noqa: ANN401
        """The harness kills processes and writes iptables rules: it needs root, directly
        or through sudo without a password."""
        uid = await conn.run("id -u", check=False)
        if str(uid.stdout or "").strip() == "0":
            self._sudo[index] = ""
            return
        sudo = await conn.run("sudo -n true", check=False)
        if sudo.exit_status == 0:
            self._sudo[index] = "sudo -n "
            return
        raise SshError(f"{self.hosts[index].label()}: the user is not root and cannot use "
                       f"sudo without a password; the harness needs root there (iptables, "
                       f"signals): log in as root or allow passwordless sudo")

    def _check_host_key(self, host: Host, conn: Any) -> None:  # noqa: ANN401
        """accept-new: refuse a key that differs from a known one; remember a new one."""
        import asyncssh

        key = conn.get_server_host_key()
        port = conn.get_extra_info("peername")[1]
        name = host.address if port == 22 else f"[{host.address}]:{port}"
        with self._known_lock:
            if self.known_hosts.is_file():
                known = asyncssh.read_known_hosts(str(self.known_hosts))
                trusted = known.match(host.address, "", port)[0]
                if trusted:
                    if any(k.public_data == key.public_data for k in trusted):
                        return
                    raise SshError(f"{host.label()}: its host key does not match the one in "
                                   f"{self.known_hosts} — the host changed or someone is in "
                                   f"between; if it was reinstalled, remove its old line "
                                   f"(ssh-keygen -R '{name}')")
            self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
            line = f"{name} {key.export_public_key().decode().strip()}\n"
            fd = os.open(self.known_hosts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a") as f:
                f.write(line)

    def _conn(self, index: int) -> Any:  # noqa: ANN401
        conn = self._conns.get(index)
        if conn is None:
            raise SshError(f"{self.hosts[index].label()}: not connected"
                           + (" (the platform is closed)" if self._closed else ""))
        return conn

    # ----- using -----------------------------------------------------------------------

    def _command(self, index: int, script: str) -> str:
        return f"{self._sudo.get(index, '')}sh -c {shlex.quote(script)} 2>&1"

    def run(self, index: int, script: str, *, timeout_s: float = 60.0,
            input_text: str | None = None) -> tuple[int, str]:
        """`sh -c script` on host `index`: (exit code, stdout and stderr together)."""
        import asyncssh

        async def go() -> tuple[int, str]:
            result = await self._conn(index).run(self._command(index, script),
                                                 input=input_text, check=False)
            code = result.exit_status if result.exit_status is not None else 255
            return code, str(result.stdout or "")

        try:
            return self._loop.call(go(), timeout_s)
        except TimeoutError:
            raise SshError(f"{self.hosts[index].label()}: a command took longer than "
                           f"{timeout_s:g} s: {script[:120]}") from None
        except (OSError, asyncssh.Error) as exc:
            raise SshError(f"{self.hosts[index].label()}: the connection failed: "
                           f"{_one_line(exc)}") from None

    def run_all(self, script_of: dict[int, str], *, timeout_s: float = 300.0
                ) -> dict[int, tuple[int, str]]:
        """Several hosts' commands at once (an install, a clean-up)."""
        async def one(index: int, script: str) -> tuple[int, str]:
            result = await self._conn(index).run(self._command(index, script), check=False)
            code = result.exit_status if result.exit_status is not None else 255
            return code, str(result.stdout or "")

        async def every() -> list[Any]:
            return await asyncio.gather(*(one(i, s) for i, s in script_of.items()),
                                        return_exceptions=True)

        outcomes = self._loop.call(every(), timeout_s)
        answers: dict[int, tuple[int, str]] = {}
        for index, outcome in zip(script_of, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                raise SshError(f"{self.hosts[index].label()}: the connection failed: "
                               f"{_one_line(outcome)}")
            answers[index] = outcome
        return answers

    def put(self, index: int, local: list[Path], remote_dir: str,
            timeout_s: float = 300.0) -> None:
        """Copy files into `remote_dir` (which must exist) over SFTP."""
        async def go() -> None:
            async with self._conn(index).start_sftp_client() as sftp:
                await sftp.put([str(p) for p in local], remote_dir)

        try:
            self._loop.call(go(), timeout_s)
        except Exception as exc:  # noqa: BLE001 - asyncssh.SFTPError, OSError, timeout
            raise SshError(f"{self.hosts[index].label()}: copying {len(local)} file(s) to "
                           f"{remote_dir} failed: {_one_line(exc)}") from None

    def get(self, index: int, remote: str, local: Path, timeout_s: float = 120.0) -> bool:
        """Copy one file back; False when it does not exist there."""
        import asyncssh

        async def go() -> bool:
            async with self._conn(index).start_sftp_client() as sftp:
                try:
                    await sftp.get(remote, str(local))
                    return True
                except asyncssh.SFTPNoSuchFile:
                    return False

        return self._loop.call(go(), timeout_s)

    def forward(self, index: int, remote_host: str, remote_port: int) -> int:
        """A port on 127.0.0.1 here whose connections reach remote_host:remote_port as seen
        from host `index` (the clients' way to a node); kept until `close()`."""
        async def go() -> Any:  # noqa: ANN401
            return await self._conn(index).forward_local_port("127.0.0.1", 0, remote_host,
                                                              remote_port)

        listener = self._loop.call(go(), 30)
        self._listeners.append(listener)
        return int(listener.get_port())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        async def shut() -> None:
            for listener in self._listeners:
                listener.close()
            for conn in self._conns.values():
                conn.close()
            for conn in self._conns.values():
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conn.wait_closed(), 5)

        with contextlib.suppress(Exception):
            self._loop.call(shut(), 15)
        self._conns.clear()
        self._loop.stop()
