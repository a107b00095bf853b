"""Hosts for trying `--platform ssh` on one machine, as Jepsen tests itself: N containers
running sshd on a network of their own, each reached over SSH on a port published on
127.0.0.1 only.

    python -m nemesis.platforms.ssh_testbed [--hosts 5] [--dir DIR]

writes DIR/hosts (the `--hosts` file), DIR/known_hosts and DIR/id_ed25519 (a key pair made
for this set-up alone), prints the run command, and keeps the hosts until Ctrl-C (or
SIGTERM), then removes them. Tests use `SshTestbed` as a context manager.

The image `mao-sshd:<hash>` is the node image's dependency level (`image.ensure_deps`: the
offline Debian base with the node's Python dependencies) plus openssh-server from the same
Debian mirror the base came from; nothing is pulled from a registry. The project itself is
NOT in it: the ssh platform installs it, as it would on a real machine. Each container gets
NET_ADMIN (iptables) and the labels of the project, of this set-up's id and of its owner,
so `python -m nemesis clean --run ID` finds what a killed set-up left.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import signal
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from pathlib import Path

from nemesis.platforms.base import PlatformError
from nemesis.platforms.docker import LABEL_OWNER, LABEL_RUN, engine, owner_label
from nemesis.platforms.image import (
    LABEL_KIND,
    LABEL_PROJECT,
    PROJECT,
    _build,
    _build_lock,
    _hash,
    _image_exists,
    ensure_deps,
)

LAYOUT = "2"  # bump when the Dockerfile below changes
SSHD_COMMAND = ["sh", "-c", "ssh-keygen -A >/dev/null && mkdir -p /run/sshd && "
                            "exec /usr/sbin/sshd -D -e"]


def ensure_sshd_image(client, log=print) -> str:  # noqa: ANN001
    deps = ensure_deps(client, log)
    tag = "mao-sshd:" + _hash({"deps": deps, "layout": LAYOUT})
    if _image_exists(client, tag):
        return tag
    with _build_lock(), tempfile.TemporaryDirectory(prefix="mao-sshd-ctx-") as tmp:
        if _image_exists(client, tag):
            return tag
        # The deps level sets PYTHONPATH for containers; an SSH login does not see a
        # container's environment, so a .pth file puts the dependencies on python3's path.
        Path(tmp, "Dockerfile").write_text(
            f"FROM {deps}\n"
            "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "
            "--no-install-recommends openssh-server && rm -rf /var/lib/apt/lists/* && "
            # The package made host keys at build time: every host would share them.
            "rm -f /etc/ssh/ssh_host_*_key* && "
            "echo /opt/mao/deps > /usr/lib/python3/dist-packages/mao-deps.pth && "
            "mkdir -p /root/.ssh && chmod 700 /root/.ssh\n"
            "ENV PYTHONPATH=\n")
        _build(client, Path(tmp), tag, "sshd", deps, log)
    return tag


class SshTestbed:
    """N sshd containers; `hosts_file`, `known_hosts`, `key` once started."""

    def __init__(self, hosts: int = 5, directory: Path | None = None, log=print) -> None:  # noqa: ANN001
        self.count = hosts
        self.id = f"sshbed-{uuid.uuid4().hex[:8]}"
        self._tmp = None if directory else tempfile.TemporaryDirectory(prefix="mao-sshbed-")
        self.dir = Path(directory or self._tmp.name)  # type: ignore[union-attr]
        self.hosts_file = self.dir / "hosts"
        self.known_hosts = self.dir / "known_hosts"
        self.key = self.dir / "id_ed25519"
        self._log = log
        self.client = None
        self.containers: list = []
        self.peer_ips: list[str] = []
        self.ports: list[int] = []

    def _labels(self, kind: str) -> dict[str, str]:
        return {LABEL_PROJECT: PROJECT, LABEL_RUN: self.id, LABEL_KIND: kind,
                LABEL_OWNER: owner_label()}

    def __enter__(self) -> SshTestbed:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        import asyncssh

        self.client = engine()
        image = ensure_sshd_image(self.client, self._log)
        self.dir.mkdir(parents=True, exist_ok=True)
        key = asyncssh.generate_private_key("ssh-ed25519")
        key.write_private_key(str(self.key))
        self.key.chmod(0o600)
        public = key.export_public_key().decode()
        network = self.client.networks.create(f"mao-{self.id}", driver="bridge",
                                              labels=self._labels("network"))
        for i in range(1, self.count + 1):
            container = self.client.containers.create(
                image, SSHD_COMMAND, name=f"mao-{self.id}-h{i}", hostname=f"h{i}",
                labels=self._labels("sshd-host"), cap_add=["NET_ADMIN"], init=True,
                ports={"22/tcp": ("127.0.0.1", None)}, network=network.name, detach=True)
            self.containers.append(container)
            container.put_archive("/root/.ssh", _tar({"authorized_keys": public}))
            container.start()
        lines, known = [], []
        for container in self.containers:
            container.reload()
            port = int(container.attrs["NetworkSettings"]["Ports"]["22/tcp"][0]["HostPort"])
            ip = container.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
            self.ports.append(port)
            self.peer_ips.append(ip)
            host_key = self._wait_host_key(container)
            known.append(f"[127.0.0.1]:{port} {host_key}")
            lines.append(f"127.0.0.1 {port} root {self.key} peer={ip}")
        self.known_hosts.write_text("\n".join(known) + "\n")
        self.hosts_file.write_text("\n".join(lines) + "\n")
        self._wait_sshd()

    def _wait_host_key(self, container, timeout_s: float = 60.0) -> str:  # noqa: ANN001
        deadline = time.monotonic() + timeout_s
        while True:
            code, out = container.exec_run(["cat", "/etc/ssh/ssh_host_ed25519_key.pub"])
            fields = out.decode(errors="replace").split()
            # The file may exist before ssh-keygen has written it: wait for a whole key.
            if code == 0 and len(fields) >= 2 and fields[0] == "ssh-ed25519":
                return " ".join(fields[:2])
            if time.monotonic() > deadline:
                raise PlatformError(f"{container.name} made no host key within "
                                    f"{timeout_s:g} s: {out.decode()[-200:]}")
            time.sleep(0.2)

    def _wait_sshd(self, timeout_s: float = 60.0) -> None:
        """Until every sshd answers a login with the set-up's key."""
        from nemesis.platforms.ssh_conn import SshHosts
        from nemesis.platforms.ssh_hosts import read_hosts

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with SshHosts(read_hosts(self.hosts_file), known_hosts=self.known_hosts) as ssh:
                    ssh.connect()
                return
            except PlatformError as exc:
                if time.monotonic() > deadline:
                    raise PlatformError(f"the test hosts' sshd did not answer within "
                                        f"{timeout_s:g} s: {exc}") from None
                time.sleep(0.3)

    def close(self) -> None:
        """Remove the containers and the network (everything labelled with this id)."""
        if self.client is not None:
            from nemesis.platforms.docker import _remove_labelled

            with contextlib.suppress(PlatformError):
                _remove_labelled(self.client, self.id)
            self.containers = []
            with contextlib.suppress(Exception):
                self.client.close()
            self.client = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        else:  # a folder the person named: remove what we wrote there (the key above all)
            for path in (self.hosts_file, self.known_hosts, self.key):
                path.unlink(missing_ok=True)


def _tar(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o600
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nemesis.platforms.ssh_testbed",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=5, help="how many (default 5)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where to write hosts, known_hosts and the key (default: a "
                             "temporary folder); they are removed at the end")
    args = parser.parse_args(argv)
    if args.hosts < 1:
        print("error: --hosts must be at least 1", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        with SshTestbed(args.hosts, args.dir) as bed:
            print(f"{args.hosts} sshd hosts up (set-up {bed.id}); hosts file: {bed.hosts_file}")
            print(f"try: python -m nemesis run --platform ssh --hosts {bed.hosts_file} "
                  f"--known-hosts {bed.known_hosts} --faults partition,kill --duration 60")
            print("Ctrl-C removes them", flush=True)
            while not stop.wait(1.0):
                pass
    except KeyboardInterrupt:
        pass
    except PlatformError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("removed the sshd hosts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
