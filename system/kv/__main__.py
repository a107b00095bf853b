"""Command line of the KV store: `serve` runs one node, `cluster` runs a local cluster for a person.

    python -m system.kv serve --id n1 --listen 127.0.0.1:7001 \\
        --peers n2=127.0.0.1:7002,n3=127.0.0.1:7003 --data-dir /tmp/kv/n1
    python -m system.kv cluster --nodes 3 [--base-port 7001] [--data-dir DIR] [--tls-dir DIR]
    python -m system.kv member list|add|promote|remove --cluster HOST:PORT[,...] [--id N]
        [--address HOST:PORT]      membership, one server at a time (add = as a learner)
    python -m system.kv serve --id n4 --listen ... --peers n1=...,n2=... --join ...
        a new member (added with `member add`) joining an existing cluster
    python -m system.kv certs --out DIR --nodes n1,n2,n3 [--clients NAME ...] [--admins NAME ...]
        a CA and a key and certificate per node, client and admin, for mutual TLS
        (serve --cert-file DIR/n1.crt --key-file DIR/n1.key --trusted-ca-file DIR/ca.crt)

Exit codes of `serve`: 0 after a graceful stop (SIGTERM / Ctrl-C), 2 for a bad command line
or refused unsafe mode, 3 when the data directory is corrupt (the message names the file
and offset; the node never serves corrupt data), 70 on a fatal storage error while running.
What it must never do: start an unsafe mode without MAO_ALLOW_UNSAFE=1, or leave child
processes behind (`cluster`).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import gc
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path

from system.child_processes import die_with_parent
from system.kv.logs import configure_logging

log = logging.getLogger("kv.main")


def _parse_peers(text: str) -> dict[str, str]:
    peers: dict[str, str] = {}
    if not text:
        return peers
    for item in text.split(","):
        node_id, sep, address = item.strip().partition("=")
        if not sep or not node_id or ":" not in address:
            raise argparse.ArgumentTypeError(
                f"bad peer {item!r}: expected ID=HOST:PORT, e.g. n2=127.0.0.1:7002")
        peers[node_id] = address
    return peers


def _parse_listen(text: str) -> str:
    try:
        parse_listen_address(text, flag="")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def parse_listen_address(text: str, flag: str = "--listen") -> tuple[str, int]:
    """HOST:PORT (IPv6 hosts in brackets) -> (host, port); ValueError says what is wrong,
    naming `flag` (argparse names it itself: pass "")."""
    host, sep, port_text = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(
            f"{flag + ' ' if flag else ''}{text!r} is not HOST:PORT with a port in 1..65535, "
            "e.g. 127.0.0.1:7001")
    return host, int(port_text)


def check_port_free(text: str) -> None:
    """Bind HOST:PORT alone for a moment (no SO_REUSEPORT, as the node's gRPC server) so
    that a port in use, or a host that is not ours, is refused before anything else
    happens -- before the data directory is created. OSError says what is wrong."""
    host, port = parse_listen_address(text)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise OSError(f"cannot listen on {text}: unknown host {host!r} ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does
        try:
            probe.bind(address)
        except OSError as exc:
            reason = ("the port is in use (another node or cluster listens there?)"
                      if exc.errno == errno.EADDRINUSE else exc.strerror)
            raise OSError(f"cannot listen on {text}: {reason}; choose a free port") from None


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _parse_cert_nodes(text: str) -> dict[str, list[str]]:
    """`n1=10.0.0.1+db1.example,n2,n3` -> {"n1": ["10.0.0.1", "db1.example"], "n2": [], ...}
    ('+' joins a node's extra names: ',' separates nodes, ':' is in IPv6 and HOST:PORT)."""
    nodes: dict[str, list[str]] = {}
    for item in text.split(","):
        node_id, _, extra = item.strip().partition("=")
        if not node_id or node_id in nodes:
            raise argparse.ArgumentTypeError(
                f"bad node {item!r}: expected ID or ID=ADDR+ADDR, each id once, e.g. "
                f"n1=10.0.0.1+db1.example,n2,n3")
        nodes[node_id] = [a for a in extra.split("+") if a]
    return nodes


def _names(values: list[str]) -> list[str]:
    """`--clients a b` and `--clients a,b` alike."""
    return [name for value in values for name in value.split(",") if name]


def _client_tls_flags(parser: argparse.ArgumentParser, note: str) -> None:
    group = parser.add_argument_group("TLS", f"for a cluster started with certificates; {note}")
    group.add_argument("--cert-file", "--cert", dest="cert_file", type=Path, default=None,
                       help="this client's certificate")
    group.add_argument("--key-file", "--key", dest="key_file", type=Path, default=None,
                       help="its private key")
    group.add_argument("--trusted-ca-file", "--cacert", dest="trusted_ca_file", type=Path,
                       default=None, help="the cluster's CA (ca.crt)")


def client_tls_from_args(args: argparse.Namespace):  # noqa: ANN201 - TlsFiles | None
    """The client's TlsFiles from --cert-file/--key-file/--trusted-ca-file, None without
    them; ValueError names what is missing, TlsError what is wrong with a file."""
    from system.kv.tls import TlsFiles

    given = {"--cert-file": args.cert_file, "--key-file": args.key_file,
             "--trusted-ca-file": args.trusted_ca_file}
    if not any(given.values()):
        return None
    missing = [flag for flag, value in given.items() if value is None]
    if missing:
        raise ValueError(f"TLS needs --cert-file, --key-file and --trusted-ca-file; "
                         f"missing {', '.join(missing)}")
    files = TlsFiles(args.cert_file, args.key_file, args.trusted_ca_file)
    files.read()
    return files


def node_tls_from_args(args: argparse.Namespace):  # noqa: ANN201 - NodeTls | None
    """`serve`'s TLS settings, every file read and checked (certificate and key belong
    together, the certificate is this node's); None without TLS flags. ValueError or
    TlsError says what is wrong, in one line."""
    from system.kv import tls

    client_flags = {"--cert-file": args.cert_file, "--key-file": args.key_file,
                    "--trusted-ca-file": args.trusted_ca_file}
    peer_flags = {"--peer-cert-file": args.peer_cert_file, "--peer-key-file": args.peer_key_file,
                  "--peer-trusted-ca-file": args.peer_trusted_ca_file}
    if not any(client_flags.values()):
        given = [flag for flag, value in peer_flags.items() if value is not None]
        if given or args.client_cert_auth:
            raise ValueError(f"{', '.join(given) or '--client-cert-auth'} needs TLS on the "
                             f"client port too: give --cert-file, --key-file and "
                             f"--trusted-ca-file (nodes also talk there)")
        return None
    missing = [flag for flag, value in client_flags.items() if value is None]
    if missing:
        raise ValueError(f"TLS needs --cert-file, --key-file and --trusted-ca-file; "
                         f"missing {', '.join(missing)}")
    if (args.peer_cert_file is None) != (args.peer_key_file is None):
        raise ValueError("--peer-cert-file and --peer-key-file go together (or leave both "
                         "out to use --cert-file and --key-file)")
    client = tls.TlsFiles(args.cert_file, args.key_file, args.trusted_ca_file)
    peer = tls.TlsFiles(args.peer_cert_file or args.cert_file,
                        args.peer_key_file or args.key_file,
                        args.peer_trusted_ca_file or args.trusted_ca_file)
    for files, flag in ((client, "--cert-file"), (peer, "--peer-cert-file")):
        tls.server_ssl_context(files)  # readable, parses, key matches certificate
        holder = tls.identity_of_pem(files.read()[0])
        if holder != tls.Identity(args.id, "node"):
            raise ValueError(f"{flag} {files.cert} names {holder}, not node {args.id!r}: give "
                             f"this node its own certificate (python -m system.kv certs)")
    return tls.NodeTls(client=client, peer=peer)


def certs(args: argparse.Namespace) -> int:
    """`certs`: write the CA and every certificate and key; print what was written."""
    from system.kv import tls

    clients, admins = _names(args.clients), _names(args.admins)
    try:
        out = tls.generate(args.out, args.nodes, clients=clients, admins=admins,
                           days=args.days)
    except (tls.TlsError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{out / 'ca.crt'}  CA certificate: give it to every node and client "
          f"(--trusted-ca-file)")
    print(f"{out / 'ca.key'}  CA key (0600): only `certs` needs it; keep it off the nodes")
    wanted = ([(n, "node", tls.node_sans(n, a)) for n, a in args.nodes.items()]
              + [(n, "client", []) for n in clients] + [(n, "admin", []) for n in admins])
    for name, role, sans in wanted:
        names = f"; names {', '.join(sans)}" if sans else ""
        print(f"{out / (name + '.crt')}  {role} {name}{names}, valid {args.days} days")
        print(f"{out / (name + '.key')}  its key (0600)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m system.kv", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run one node")
    serve.add_argument("--id", required=True, help="this node's id, e.g. n1")
    serve.add_argument("--listen", required=True, help="HOST:PORT for clients and peers")
    serve.add_argument("--peers", type=_parse_peers, default={},
                       help="the other members: ID=HOST:PORT,ID=HOST:PORT")
    serve.add_argument("--peer-listen", type=_parse_listen, default=None,
                       help="HOST:PORT where this node also takes Raft traffic from peers over "
                            "plain TCP (like etcd's peer URL; cheaper than gRPC). Without it, "
                            "peers reach it over gRPC on --listen")
    serve.add_argument("--peer-links", type=_parse_peers, default={},
                       help="ID=HOST:PORT,...: send Raft traffic to these peers over plain TCP "
                            "at their --peer-listen address (or a proxy in front of it); peers "
                            "not listed are reached over gRPC at their --peers address. A link "
                            "may name a node that is not a member yet: it is used once it is")
    serve.add_argument("--data-dir", type=Path, required=True)
    serve.add_argument("--tick-ms", type=_positive_int, default=20)
    serve.add_argument("--election-timeout-ticks", type=_positive_int, default=25,
                       help="T: each election timeout is drawn from [T, 2T) ticks (default 25 "
                            "ticks of 20 ms = 0.5-1 s); raise it for 64 MiB values on a busy machine")
    serve.add_argument("--heartbeat-ticks", type=_positive_int, default=1)
    serve.add_argument("--snapshot-entries", type=_positive_int, default=10_000)
    serve.add_argument("--snapshot-bytes", type=_positive_int, default=64 * 1024 * 1024)
    serve.add_argument("--snapshot-chunk-bytes", type=_positive_int, default=1024 * 1024)
    serve.add_argument("--max-append-entries", type=_positive_int, default=512,
                       help="at most this many log entries per APPEND to a follower")
    serve.add_argument("--max-value-bytes", type=_positive_int, default=16 * 1024 * 1024,
                       help="largest value accepted (default 16 MiB: what the default timing "
                            "carries on a loaded 2-core machine without elections; larger "
                            "values need a larger --election-timeout-ticks, docs/kv-node.md)")
    serve.add_argument("--max-key-bytes", type=_positive_int, default=1024)
    serve.add_argument("--max-requests-per-s", type=float, default=0.0,
                       help="client requests per second before RESOURCE_EXHAUSTED; 0 = unlimited")
    serve.add_argument("--log-file", type=Path, default=None,
                       help="JSON-lines log file (default: stderr)")
    serve.add_argument("--cluster-id", default="",
                       help="the cluster's id (default: derived from the member ids of the "
                            "first start; learned from the peers with --join)")
    serve.add_argument("--join", action="store_true",
                       help="join an existing cluster as a new member: run `member add` first; "
                            "--peers lists members to reach")
    serve.add_argument("--no-forward", action="store_true",
                       help="a follower answers writes and linearizable reads with the leader's "
                            "address (UNAVAILABLE) instead of forwarding them to the leader")
    serve.add_argument("--eager-commit", action="store_true",
                       help="the leader sends each new commit index to the followers at once "
                            "(an empty APPEND, as etcd does) instead of with the next APPEND or "
                            "heartbeat (one tick later at most): followers apply sooner, at the "
                            "price of a second round of messages per write at low load")
    serve.add_argument("--unsafe", default=None,
                       help="TEST ONLY: run a deliberately broken canary (needs MAO_ALLOW_UNSAFE=1)")
    tls_flags = serve.add_argument_group(
        "TLS", "mutual TLS on the client port and for Raft traffic (files from `certs`); "
               "all three of a kind or none. With them every caller must present a "
               "certificate from the CA: KV calls take any, ChangeMembership an admin's, "
               "Introduce and Raft traffic the certificate of the node they speak for")
    tls_flags.add_argument("--cert-file", type=Path, default=None,
                           help="this node's certificate (names its id), for the client port")
    tls_flags.add_argument("--key-file", type=Path, default=None, help="its private key")
    tls_flags.add_argument("--trusted-ca-file", type=Path, default=None,
                           help="the CA whose certificates callers must present")
    tls_flags.add_argument("--client-cert-auth", action="store_true",
                           help="require client certificates: always so with TLS (accepted "
                                "as etcd operators write it)")
    tls_flags.add_argument("--peer-cert-file", type=Path, default=None,
                           help="certificate for Raft traffic, both ways (default --cert-file)")
    tls_flags.add_argument("--peer-key-file", type=Path, default=None,
                           help="its private key (default --key-file)")
    tls_flags.add_argument("--peer-trusted-ca-file", type=Path, default=None,
                           help="the CA of the peers' certificates (default --trusted-ca-file)")

    member = sub.add_parser("member", help="list or change the membership of a running cluster")
    member.add_argument("action", choices=("list", "add", "promote", "remove"),
                        help="add = a new learner; promote = a caught-up learner becomes a "
                             "voter; remove = a voter or a learner leaves")
    member.add_argument("--cluster", required=True,
                        help="addresses of one or more members: HOST:PORT[,HOST:PORT...]")
    member.add_argument("--id", default="", help="the member to add, promote or remove")
    member.add_argument("--address", default="", help="add: HOST:PORT the new member listens on")
    member.add_argument("--peer-address", default="",
                        help="add: HOST:PORT of the new member's --peer-listen; the members "
                             "then send it Raft traffic over plain TCP (else over gRPC)")
    member.add_argument("--timeout-s", type=float, default=30.0,
                        help="how long to keep trying (promote waits for the learner to catch up)")
    _client_tls_flags(member, "changes need an admin certificate (`certs --admins`)")

    certs = sub.add_parser(
        "certs", help="make a CA and the keys and certificates of nodes, clients and admins",
        description="Writes DIR/ca.crt and ca.key (keep ca.key to yourself) and NAME.crt and "
                    "NAME.key per node, client and admin. Every key file is 0600. A node's "
                    "certificate names its id, localhost and 127.0.0.1; give more names or "
                    "addresses as ID=ADDR+ADDR (a host, an IP or HOST:PORT), e.g. "
                    "--nodes n1=10.0.0.1+db1.example,n2=10.0.0.2,n3")
    certs.add_argument("--out", type=Path, required=True, help="directory to write into")
    certs.add_argument("--nodes", type=_parse_cert_nodes, required=True,
                       help="ID[=ADDR+ADDR...],...: the nodes, each with extra names")
    certs.add_argument("--clients", nargs="*", default=[], metavar="NAME",
                       help="client certificates (role client: KV operations)")
    certs.add_argument("--admins", nargs="*", default=["admin"], metavar="NAME",
                       help="admin certificates (role admin: membership changes too); "
                            "default: one named admin")
    certs.add_argument("--days", type=_positive_int, default=365, help="validity in days")

    cluster = sub.add_parser("cluster", help="run a local cluster of nodes until Ctrl-C")
    cluster.add_argument("--nodes", type=_positive_int, default=3)
    cluster.add_argument("--base-port", type=int, default=7001,
                         help="node i listens on BASE+i-1 for clients and BASE+1000+i-1 for peers; 0 = any free ports")
    cluster.add_argument("--data-dir", type=Path, default=None,
                         help="where node data and logs go (default: a temporary directory, removed at exit)")
    cluster.add_argument("--node-arg", action="append", default=[],
                         help="extra argument passed to every `serve` (repeatable)")
    cluster.add_argument("--tls-dir", type=Path, default=None,
                         help="run the nodes with mutual TLS, certificates in this directory "
                              "(made there, with a client `client` and an admin `admin`, "
                              "unless it holds a ca.crt already)")
    return parser


def serve(args: argparse.Namespace) -> int:
    from system.kv.unsafe import UnsafeRefused, unsafe_mode

    die_with_parent("KV_PARENT_PID")  # LocalCluster, `cluster` (system/child_processes.py)
    configure_logging(args.log_file)
    try:
        unsafe = unsafe_mode(args.unsafe)
    except (UnsafeRefused, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        log.error("refused to start", extra={"reason": str(exc)})
        return 2
    if args.id in args.peers:
        print(f"error: --peers lists this node's own id {args.id!r}; list only the others",
              file=sys.stderr)
        return 2
    from system.kv.tls import TlsError

    try:
        node_tls = node_tls_from_args(args)
    except (ValueError, TlsError) as exc:
        print(f"error: node {args.id} refuses to start: {exc}", file=sys.stderr)
        log.error("refused to start", extra={"reason": str(exc)})
        return 2

    try:
        check_port_free(args.listen)
        if args.peer_listen:
            if args.peer_listen == args.listen:
                raise ValueError("--peer-listen must differ from --listen (gRPC owns that port)")
            try:
                check_port_free(args.peer_listen)
            except OSError as exc:
                raise OSError(f"--peer-listen: {exc}") from None
    except (OSError, ValueError) as exc:
        print(f"error: node {args.id} refuses to start: {exc}", file=sys.stderr)
        log.error("refused to start", extra={"reason": str(exc)})
        return 2

    from system.kv.node import Node, NodeConfig
    from system.kv.storage import CorruptStorage, DurableStorage, StorageLocked

    config = NodeConfig(
        node_id=args.id,
        listen_address=args.listen,
        peers=args.peers,
        data_dir=args.data_dir,
        tick_ms=args.tick_ms,
        election_timeout_ticks=args.election_timeout_ticks,
        heartbeat_interval_ticks=args.heartbeat_ticks,
        snapshot_entries=args.snapshot_entries,
        snapshot_bytes=args.snapshot_bytes,
        snapshot_chunk_bytes=args.snapshot_chunk_bytes,
        max_append_entries=args.max_append_entries,
        max_key_bytes=args.max_key_bytes,
        max_value_bytes=args.max_value_bytes,
        max_requests_per_s=args.max_requests_per_s,
        unsafe_mode=unsafe.name if unsafe is not None else None,
        join=args.join,
        forward_to_leader=not args.no_forward,
        eager_commit=args.eager_commit,
        peer_listen_address=args.peer_listen or "",
        peer_links=args.peer_links,
        tls=node_tls,
    )
    try:
        # Whose directory it is comes first: another node's directory is a wrong command
        # line (exit 2), whatever state its files are in.
        _check_owner(args)
        storage = DurableStorage.open(config.data_dir)
    except ValueError as exc:
        print(f"error: node {args.id} refuses to start: {exc}", file=sys.stderr)
        return 2
    except CorruptStorage as exc:
        message = (f"error: node {args.id} refuses to start: corrupt data in {args.data_dir}: "
                   f"{exc}. Nothing was served. {rejoin_advice(args)}")
        print(message, file=sys.stderr)
        log.critical("corrupt storage; refusing to start",
                     extra={"path": str(exc.path), "offset": exc.offset, "problem": exc.problem})
        return 3
    except StorageLocked as exc:
        print(f"error: node {args.id} refuses to start: {exc}. Is another node process "
              f"using {args.data_dir}? Stop it first.", file=sys.stderr)
        return 2
    except OSError as exc:
        return _unusable_data_dir(args, exc)
    try:
        identity = _identity_for(args, storage)
    except CorruptStorage as exc:
        storage.close()
        print(f"error: node {args.id} refuses to start: corrupt data in {args.data_dir}: "
              f"{exc}. Nothing was served. {rejoin_advice(args)}",
              file=sys.stderr)
        return 3
    except ValueError as exc:
        storage.close()
        print(f"error: node {args.id} refuses to start: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # writing the new IDENTITY (a full disk, a read-only directory)
        storage.close()
        return _unusable_data_dir(args, exc)
    try:
        node = Node(config, storage, unsafe, identity)
    except CorruptStorage as exc:  # e.g. a damaged MEMBERS file
        storage.close()
        print(f"error: node {args.id} refuses to start: corrupt data in {args.data_dir}: "
              f"{exc}. Nothing was served.", file=sys.stderr)
        return 3
    except ValueError as exc:
        # The core refuses durable state that contradicts itself (e.g. a term below the
        # snapshot's: the newest WAL records are gone).
        storage.close()
        print(f"error: node {args.id} refuses to start: inconsistent data in "
              f"{args.data_dir}: {exc}. Nothing was served.", file=sys.stderr)
        return 3
    return asyncio.run(_serve_until_signal(node))


def _unusable_data_dir(args: argparse.Namespace, exc: OSError) -> int:
    """A data directory that cannot be used at all (a path under a file, read-only, a full
    disk at start): one line and exit 2, the operator's to fix; nothing was served."""
    print(f"error: node {args.id} refuses to start: cannot use the data directory "
          f"{args.data_dir}: {exc.filename or args.data_dir}: {exc.strerror or exc}",
          file=sys.stderr)
    return 2


def rejoin_advice(args: argparse.Namespace) -> str:
    """The procedure for a node whose durable state cannot be trusted: it comes back as a
    new member (docs/kv.md, "Identity and rejoining"), never as itself on an emptied
    directory. One line, steps in the order to follow them."""
    return (
        f"Do not start it on an emptied directory as the same member: a node that lost "
        f"its data may have lost entries it acknowledged. To bring it back as a new member: "
        f"1) python -m system.kv member remove --cluster HOST:PORT --id {args.id}; "
        f"2) wipe its data directory {args.data_dir} (move it aside to keep it for "
        f"analysis); 3) python -m system.kv member add --cluster HOST:PORT --id {args.id} "
        f"--address {args.listen}; 4) start it again with its usual command line; "
        f"5) once it has caught up, python -m system.kv member promote --cluster HOST:PORT "
        f"--id {args.id} (HOST:PORT: any other member's address)"
    )


def _identity_for(args: argparse.Namespace, storage):  # noqa: ANN001, ANN202
    """The data directory's identity, created on first use. ValueError for a directory
    that belongs to another node id or cluster."""
    from system.kv.identity import (
        STATE_MEMBER,
        STATE_NEW,
        Identity,
        derive_cluster_id,
        new_member_id,
        save_identity,
    )

    identity = _check_owner(args)
    empty = (storage.hard_state.term == 0 and storage.last_index == 0
             and storage.snapshot_meta is None)
    if identity is None:
        if args.cluster_id:
            cluster_id = args.cluster_id
        elif args.join:
            cluster_id = ""  # learned from the peers
        else:
            cluster_id = derive_cluster_id([args.id, *args.peers])
        # A directory that already holds Raft state (written before identities existed)
        # is that member; an empty one is a new incarnation that must introduce itself.
        identity = Identity(cluster_id, args.id, new_member_id(),
                            STATE_NEW if empty else STATE_MEMBER)
        save_identity(args.data_dir, identity)
    return identity


def _check_owner(args: argparse.Namespace):  # noqa: ANN202
    """The directory's identity (None if it has none yet). ValueError if it belongs to
    another node id or cluster; CorruptStorage if the file is damaged."""
    from system.kv.identity import load_identity

    identity = load_identity(args.data_dir)
    if identity is None:
        return None
    if identity.node_id != args.id:
        raise ValueError(
            f"{args.data_dir} belongs to node {identity.node_id}, not {args.id}; give each node "
            f"its own data directory")
    if args.cluster_id and identity.cluster_id and identity.cluster_id != args.cluster_id:
        raise ValueError(
            f"{args.data_dir} belongs to cluster {identity.cluster_id}, not {args.cluster_id}; "
            f"{rejoin_advice(args)}")
    return identity


def member(args: argparse.Namespace) -> int:
    """`member list|add|promote|remove`: one change, sent to the leader (followed through
    the "leader-id" hint), answered once committed; exit 0 done, 1 refused, 2 bad input,
    3 no answer in time."""
    # gRPC's own log lines (a failed handshake: "I... Handshake failed ...") would come
    # before our one line that says what to fix; an operator may still ask for them.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    from system.kv import member_client

    addresses = [a.strip() for a in args.cluster.split(",") if a.strip()]
    for address in addresses:
        try:
            parse_listen_address(address)
        except ValueError as exc:
            print(f"error: --cluster: {str(exc).replace('--listen ', '')}", file=sys.stderr)
            return 2
    if args.action != "list" and not args.id:
        print(f"error: member {args.action} needs --id", file=sys.stderr)
        return 2
    if args.action == "add" and not args.address:
        print("error: member add needs --address HOST:PORT of the new member", file=sys.stderr)
        return 2
    if args.peer_address and args.action != "add":
        print(f"error: --peer-address is for member add, not member {args.action}",
              file=sys.stderr)
        return 2
    from system.kv.tls import TlsError

    try:
        files = client_tls_from_args(args)
    except (ValueError, TlsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if args.action == "list":
            st = member_client.status_with_leader(addresses, timeout_s=args.timeout_s,
                                                  tls=files)
            for node_id, node_address in sorted(st.member_addresses.items()):
                kind = "voter" if node_id in st.voters else (
                    "learner" if node_id in st.learners else "not a member")
                # How the answering node sends it Raft traffic: an operator checks here
                # that a member added with --peer-address is reached on its peer port.
                raft = st.peer_transports.get(node_id, "")
                print(f"{node_id} {node_address} {kind}"
                      f"{' leader' if node_id == st.leader_id else ''}"
                      f"{f' ({st.node_id} sends it raft over {raft})' if raft else ''}")
            return 0
        answer = member_client.change(addresses, args.action, args.id, args.address,
                                      peer_address=args.peer_address, timeout_s=args.timeout_s,
                                      tls=files)
    except member_client.MembershipInvalid as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except member_client.MembershipRefused as exc:
        print(f"error: refused: {exc}", file=sys.stderr)
        return 1
    except member_client.MembershipDenied as exc:
        print(f"error: permission denied: {exc}", file=sys.stderr)
        return 1
    except member_client.MembershipTls as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except member_client.MembershipTimeout as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    print(f"{args.action} {args.id}: committed at index {answer.index}; voters "
          f"{','.join(answer.voters)}; learners {','.join(answer.learners) or '-'}")
    return 0


async def _serve_until_signal(node) -> int:  # noqa: ANN001 - a Node
    from system.kv.server import build_server

    try:
        server = build_server(node)
    except OSError as exc:  # the port was taken between the check and the bind
        print(f"error: node {node.config.node_id} refuses to start: {exc}", file=sys.stderr)
        await node.stop()
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, node.log_debug_state)
    if node.trace is not None:  # KV_STAGE_TRACE set: SIGUSR2 writes the stage summary
        loop.add_signal_handler(signal.SIGUSR2, node.trace.dump_and_reset)
    await server.start()
    try:
        await node.start()
    except OSError as exc:  # the peer port was taken between the check and the bind
        print(f"error: node {node.config.node_id} refuses to start: {exc}", file=sys.stderr)
        await server.stop(grace=None)
        await node.stop()
        return 2
    # Everything alive now (modules, classes, gRPC's and protobuf's tables, the state
    # restored from disk) lives as long as the process or is freed by reference counting:
    # keep it out of every full cyclic-GC pass (those pauses stop the event loop, and they
    # made the 64-client p99).
    gc.freeze()
    log.info("serving", extra={"node": node.config.node_id, "listen": node.config.listen_address,
                               "peers": ",".join(f"{k}={v}" for k, v in node.config.peers.items()),
                               "peer_listen": node.config.peer_listen_address,
                               "peer_links": ",".join(f"{k}={v}" for k, v in node.config.peer_links.items()),
                               "unsafe": node.config.unsafe_mode or "",
                               # what an operator checks first when a peer or client is refused
                               "tls": (f"mutual, certificate {node.config.tls.client.cert}, "
                                       f"CA {node.config.tls.client.ca}"
                                       if node.config.tls else "off (plaintext)")})
    await stop.wait()
    log.info("stopping: refusing new requests, finishing in-flight ones",
             extra={"node": node.config.node_id})
    # Requests in flight get a short grace to finish (their entries may still commit);
    # then waiting writes are answered "outcome unknown" and storage is closed.
    await server.stop(grace=1.0)
    await node.stop()
    return 0


def cluster(args: argparse.Namespace) -> int:
    from system.kv.local_cluster import LocalCluster

    cluster_ = LocalCluster(
        args.nodes, args.data_dir, base_port=args.base_port or None, node_args=list(args.node_arg),
        tls_dir=args.tls_dir,
    )
    # A signal sets a flag the loop looks at, instead of raising KeyboardInterrupt
    # wherever the main thread happens to be: inside gRPC's channel code or a lock, an
    # exception there can leave the command hanging (the likely cause of a Ctrl-C test
    # that timed out twice under load and never alone).
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)
    try:
        cluster_.start()
        print(f"data and logs in {cluster_.base_dir}", flush=True)
        if args.tls_dir is not None:
            admin = cluster_.tls_files("admin")
            print(f"mutual TLS: certificates in {args.tls_dir}; e.g. member list "
                  f"--cert-file {admin.cert} --key-file {admin.key} --trusted-ca-file "
                  f"{admin.ca}", flush=True)
        for spec in cluster_.specs.values():
            print(f"{spec.node_id} {spec.address}  (peers on {spec.peer_address}; "
                  f"log {spec.log_file})", flush=True)
        leader = None
        while not stop.is_set():
            current = cluster_.wait_for_leader_change(leader, timeout_s=0.5)
            if current != leader:
                leader = current
                address = cluster_.specs[leader].address if leader else "-"
                print(f"leader: {leader or 'none'} {address}", flush=True)
            for node_id in cluster_.exited_nodes():
                print(f"{node_id} exited with code {cluster_.exit_code(node_id)}; "
                      f"see {cluster_.specs[node_id].log_file}", flush=True)
        print("stopping the cluster...", flush=True)
    finally:
        cluster_.close()
        print("all nodes stopped", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return serve(args)
    if args.command == "member":
        return member(args)
    if args.command == "certs":
        return certs(args)
    return cluster(args)


if __name__ == "__main__":
    sys.exit(main())
