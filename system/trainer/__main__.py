"""`python -m system.trainer run|inspect` (and the internal `coordinator` / `worker`
commands that `run` starts as child processes). See docs/trainer.md."""

from __future__ import annotations

import argparse
import sys

import system.trainer  # noqa: F401, I001  (pins BLAS to one thread before numpy loads)


def parse_kv(text: str) -> list[str] | dict[str, str]:
    """`--kv a:1,b:2` (addresses) or `--kv n1=a:1,n2=b:2` (node id -> address: a leader hint
    is then followed by the node's id, through the address given here — a proxy, a published
    port — never by the address the leader advertises to its peers)."""
    parts = [p for p in text.split(",") if p]
    if parts and all("=" in p for p in parts):
        return dict(p.split("=", 1) for p in parts)
    return parts


def _coordinator(args: argparse.Namespace) -> int:
    from system.trainer.config import ConfigError, TrainConfig
    from system.trainer.coordinator import EXIT_CONFIG, Coordinator, CoordinatorOptions
    from system.trainer.pause_points import install
    from system.trainer.procs import die_with_parent

    die_with_parent()
    install()
    config = TrainConfig.from_json(args.config)
    from system.kv.tls import TlsError
    from system.trainer import certs
    from system.trainer.unsafe import UnsafeRefused

    try:
        tls, kv_tls = certs.from_args(args)
        options = CoordinatorOptions(
            coordinator_id=args.id, kv_addresses=parse_kv(args.kv), listen=args.listen,
            checkpoint_store=args.checkpoint_store, object_dir=args.object_dir,
            chunk_bytes=args.chunk_bytes, lease_s=args.lease_s,
            gradient_deadline_s=args.gradient_deadline_s, event_log=args.event_log,
            unsafe=args.unsafe, tls=tls, kv_tls=kv_tls)
        return Coordinator(config, options).run()
    except (ConfigError, UnsafeRefused, TlsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG


def _worker(args: argparse.Namespace) -> int:
    from system.kv.tls import TlsError
    from system.trainer import certs
    from system.trainer.config import TrainConfig
    from system.trainer.procs import die_with_parent
    from system.trainer.worker import Worker

    die_with_parent()
    try:
        tls, kv_tls = certs.from_args(args)
        worker = Worker(TrainConfig.from_json(args.config), args.index, parse_kv(args.kv),
                        tls=tls, kv_tls=kv_tls)
    except TlsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2  # not restarted by `run`: the same files would fail the same way
    return worker.run()


def build_parser() -> argparse.ArgumentParser:
    from system.trainer.certs import add_arguments as add_tls_arguments
    from system.trainer.cli import add_inspect_arguments, add_run_arguments

    parser = argparse.ArgumentParser(prog="python -m system.trainer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_run_arguments(sub.add_parser("run", help="train with workers, a coordinator and standbys"))
    add_inspect_arguments(sub.add_parser("inspect", help="show a job's checkpoint history"))
    c = sub.add_parser("coordinator", help="(internal) one coordinator process")
    c.add_argument("--id", required=True)
    c.add_argument("--config", required=True)
    c.add_argument("--kv", required=True)
    c.add_argument("--listen", default="127.0.0.1:0")
    c.add_argument("--checkpoint-store", default="inline")
    c.add_argument("--object-dir", default="")
    c.add_argument("--chunk-bytes", type=int, default=4 * 1024 * 1024)
    c.add_argument("--lease-s", type=float, default=2.0)
    c.add_argument("--gradient-deadline-s", type=float, default=5.0)
    c.add_argument("--event-log", default="")
    c.add_argument("--unsafe", default="", help="test-only canary (system/trainer/unsafe.py)")
    add_tls_arguments(c)
    w = sub.add_parser("worker", help="(internal) one worker process")
    w.add_argument("--index", type=int, required=True)
    w.add_argument("--config", required=True)
    w.add_argument("--kv", required=True)
    add_tls_arguments(w)
    return parser


def main(argv: list[str] | None = None) -> int:
    if (argv if argv is not None else sys.argv[1:])[:1] in (["run"], ["inspect"]):
        from system.trainer.certs import quiet_grpc_client_logs

        quiet_grpc_client_logs()  # before anything imports grpc
    args = build_parser().parse_args(argv)
    if args.command == "coordinator":
        return _coordinator(args)
    if args.command == "worker":
        return _worker(args)
    from system.trainer.cli import inspect_command, run_command

    if args.command == "inspect":
        return inspect_command(args)
    hosts = None
    if args.hosts is not None:
        # Other machines are reached through the harness's SSH platform: only this entry
        # point imports it (tests/test_purity.py), the trainer itself never does.
        from nemesis.trainer_hosts import HostsSupport

        hosts = HostsSupport()
    return run_command(args, hosts)


if __name__ == "__main__":
    sys.exit(main())
