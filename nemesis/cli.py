"""`python -m nemesis run|check|clean|report|serve|show`: the harness's command line.

    python -m nemesis run --faults partition,kill|all --duration 120 [--nodes 5] [--workload kv]
        [--platform docker|local|sim] [--seed N] [--store DIR] [--concurrency N] [--rate N]
        [--interval S] [--read-consistency linearizable|stale] [--mix get=20,put=15,...]
        [--unsafe NAME] [--tls]
    python -m nemesis check RUN_DIR       re-check a stored run, no cluster needed
    python -m nemesis shrink RUN_DIR [--test-out FILE]   minimise a failing --platform sim run
    python -m nemesis explore --platform sim --runs N [--seed S] [--unsafe NAME]
        [--budget-s S] [--tests-out DIR] [--set FLAG=VALUE]   many runs, settings drawn
    python -m nemesis clean [--run ID] [--hosts FILE]   remove what a crashed run left behind
    python -m nemesis report RUN_DIR [--junit FILE]   regenerate report.html (and JUnit XML)
    python -m nemesis serve [--store DIR] [--port 8080] [--host 127.0.0.1] [--token T]
        browse the store (beyond loopback only with the token it prints)
    python -m nemesis show RUN_DIR [--key K]          the report as text for a terminal

Exit codes: 0 valid, 1 invalid, 2 unknown, 3 harness error (bad flags included: they are
refused with one line before anything starts).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections.abc import Sequence
from pathlib import Path

from nemesis.check import EXIT_HARNESS

WORKLOADS = ("kv", "trainer")


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on a bad flag, which here means "unknown"; ours is 3, one line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(EXIT_HARNESS)


def _positive(kind: type) -> object:
    def parse(text: str) -> object:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value
    parse.__name__ = kind.__name__
    return parse


def _mix(text: str) -> dict[str, int]:
    from workloads.kv import parse_mix

    try:
        return parse_mix(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    from nemesis.faults import FAULTS
    from nemesis.systems import DEFAULT, SYSTEMS, get_system
    from system.trainer.unsafe import CANARIES as TRAINER_CANARIES
    from workloads.kv import DEFAULT_MIX, OPS, format_mix

    # Canary names are the default system's (a system's own are checked once it is chosen).
    default_system = get_system(DEFAULT)
    CANARIES, CLIENT_CANARIES = default_system.canaries(), default_system.client_canaries()  # noqa: N806
    parser = _Parser(prog="python -m nemesis", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="break a real cluster, record the history, check it")
    run.add_argument("--faults", default="partition,kill",
                     help=f"comma list of {', '.join(FAULTS)}; or all: every kind the "
                          f"platform runs (a note names those left out), dealt in rounds "
                          f"led by a partition that isolates the leader. With kill, "
                          f"partition or member (kv, local, docker or ssh) leader faults are "
                          f"also aimed at snapshot transfers and member rejoins "
                          f"(docs/nemesis.md, Windows) (default %(default)s)")
    run.add_argument("--duration", type=_positive(float), default=60.0, metavar="S",
                     help="seconds of workload under faults (default %(default)s)")
    run.add_argument("--interval", type=_positive(float), default=10.0, metavar="S",
                     help="seconds between a fault's start and its heal, and between faults "
                          "(default %(default)s)")
    run.add_argument("--nodes", type=_positive(int), default=5, help="default %(default)s")
    run.add_argument("--workload", choices=WORKLOADS, default="kv")
    run.add_argument("--system", default=DEFAULT, metavar="NAME",
                     help=f"what runs on the nodes: {', '.join(SYSTEMS)} (default "
                          f"%(default)s; docs/systems.md adds one)")
    run.add_argument("--platform", choices=("docker", "local", "sim", "ssh"), default=None,
                     help="default: docker when a Docker engine answers, else local; sim: "
                          "the deterministic simulator in simulated time (same seed, same "
                          "history); ssh: one node per host of --hosts FILE, over SSH")
    run.add_argument("--hosts", type=Path, default=None, metavar="FILE",
                     help="--platform ssh: one host per line, ADDRESS [PORT [USER [KEY]]] "
                          "[peer=ADDRESS] or an SSH config host name (docs/nemesis.md)")
    run.add_argument("--known-hosts", type=Path, default=None, metavar="FILE",
                     help="--platform ssh: the hosts' keys (default ~/.ssh/known_hosts)")
    run.add_argument("--accept-new-host-keys", action="store_true",
                     help="--platform ssh: trust a host the known_hosts file does not know "
                          "yet, and add its key there (a changed key is still refused)")
    run.add_argument("--seed", type=int, default=None, help="repeat a run's fault schedule and op mix")
    run.add_argument("--store", type=Path, default=Path("store"), help="default %(default)s/")
    run.add_argument("--concurrency", type=_positive(int), default=None,
                     help="client processes (default 2 per node)")
    run.add_argument("--rate", type=float, default=100.0,
                     help="operations per second over all clients; 0 = as fast as they go "
                          "(default %(default)s)")
    run.add_argument("--op-timeout", type=_positive(float), default=3.0, metavar="S",
                     help="deadline of one operation (default %(default)s)")
    run.add_argument("--read-consistency", choices=("linearizable", "stale"), default="linearizable")
    run.add_argument("--mix", type=_mix, default=None, metavar="KIND=W,...",
                     help=f"kv workload: weights of {', '.join(OPS)} (default "
                          f"{format_mix(DEFAULT_MIX)})")
    run.add_argument("--unsafe", choices=(*CANARIES, *CLIENT_CANARIES, *TRAINER_CANARIES),
                     default=None, metavar="NAME",
                     help="TEST THE HARNESS: run every node (store canaries and broken Raft "
                          "cores; a broken core needs MAO_ALLOW_UNSAFE=1), every kv client "
                          "(client canaries) or every trainer coordinator (trainer canaries, "
                          "--workload trainer) deliberately broken; one of: "
                          + ", ".join((*CANARIES, *CLIENT_CANARIES, *TRAINER_CANARIES)))
    run.add_argument("--check-budget-s", type=_positive(float), default=60.0, metavar="S",
                     help="linearizability search budget per key, CPU seconds (default %(default)s)")
    run.add_argument("--check-wall-budget-s", type=_positive(float), default=None, metavar="S",
                     help="wall-clock seconds for the whole linearizability check (default: "
                          "none); past it the verdict is unknown")
    run.add_argument("--junit", type=Path, default=None, metavar="FILE",
                     help="also write JUnit XML (one test case per checker) for CI")
    run.add_argument("--tls", action="store_true",
                     help="mutual TLS on every node port, with certificates of a CA made for "
                          "this run in a temporary directory (removed at the end; the run "
                          "folder gets ca.crt only); local, docker and ssh platforms")

    chk = sub.add_parser("check", help="re-check a stored run from its history")
    chk.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="e.g. store/latest")
    chk.add_argument("--budget-s", type=_positive(float), default=60.0, metavar="S",
                     help="CPU seconds per key (default %(default)s)")
    chk.add_argument("--wall-budget-s", type=_positive(float), default=None, metavar="S",
                     help="wall-clock seconds for the whole check (default: none); past it "
                          "the verdict is unknown")

    shrink = sub.add_parser("shrink", help="minimise a failing --platform sim run into a "
                                           "named-step schedule and a pytest test")
    shrink.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="e.g. store/latest")
    shrink.add_argument("--test-out", type=Path, default=None, metavar="FILE",
                        help="write the minimal schedule as a pytest test")

    _add_explore_command(sub, (*CANARIES, *CLIENT_CANARIES))
    clean = sub.add_parser("clean", help="remove containers, networks, volumes and processes "
                                         "a crashed run left")
    clean.add_argument("--run", default=None, metavar="RUN_ID", help="only this run's")
    clean.add_argument("--images", action="store_true", help="also remove the cached node images")
    clean.add_argument("--hosts", type=Path, default=None, metavar="FILE",
                       help="instead: the run folders, node processes and iptables rules that "
                            "--platform ssh runs left on these hosts")
    clean.add_argument("--known-hosts", type=Path, default=None, metavar="FILE")
    clean.add_argument("--accept-new-host-keys", action="store_true")
    _add_report_commands(sub)
    return parser


def _add_explore_command(sub, canaries: tuple[str, ...]) -> None:  # noqa: ANN001
    from nemesis.explore import KNOB_BY_FLAG

    explore = sub.add_parser("explore", help="many --platform sim runs, each with its own "
                                             "drawn faults and settings; failures grouped, "
                                             "shrunk into tests")
    explore.add_argument("--platform", choices=("sim",), required=True,
                         help="only the simulator: runs in simulated time, replayable")
    explore.add_argument("--runs", type=_positive(int), required=True, metavar="N")
    explore.add_argument("--seed", type=int, default=None,
                         help="run i has seed S+i (default: a random S, printed)")
    explore.add_argument("--unsafe", choices=canaries, default=None,
                         help="TEST THE HARNESS: explore a deliberately broken store "
                              "(needs MAO_ALLOW_UNSAFE=1)")
    explore.add_argument("--budget-s", type=_positive(float), default=None, metavar="S",
                         help="start no run after S wall-clock seconds")
    explore.add_argument("--tests-out", type=Path, default=None, metavar="DIR",
                         help="also copy each shrunk test here")
    explore.add_argument("--set", action="append", default=[], metavar="FLAG=VALUE",
                         dest="pins", help=f"fix a drawn setting for every run; FLAG one of "
                                           f"{', '.join(KNOB_BY_FLAG)}")
    explore.add_argument("--no-shrink", action="store_true", help="do not shrink findings")
    explore.add_argument("--keep-valid", action="store_true",
                         help="keep the folders of valid runs (a few MB each)")
    explore.add_argument("--store", type=Path, default=Path("store"), help="default %(default)s/")


def _explore(args: argparse.Namespace) -> int:
    from nemesis.explore import Exploration, explore, parse_pins, refuse_unsafe

    if problem := refuse_unsafe(args.unsafe):
        return _refuse(problem)
    try:
        pins = parse_pins(args.pins)
    except ValueError as exc:
        return _refuse(str(exc))
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
    return explore(Exploration(runs=args.runs, seed=seed, unsafe=args.unsafe, store=args.store,
                               budget_s=args.budget_s, tests_out=args.tests_out,
                               keep_valid=args.keep_valid, shrink=not args.no_shrink,
                               pinned=pins))


# --- report, serve, show (nemesis/report) ---------------------------------------------------

def _add_report_commands(sub) -> None:  # noqa: ANN001 - argparse's subparsers action
    report = sub.add_parser("report", help="regenerate report.html and its plots from a stored run")
    report.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="e.g. store/latest")
    report.add_argument("--junit", type=Path, default=None, metavar="FILE",
                        help="also write JUnit XML (one test case per checker)")
    serve = sub.add_parser("serve", help="browse every stored run and its report over HTTP")
    serve.add_argument("--store", type=Path, default=Path("store"), help="default %(default)s/")
    serve.add_argument("--port", type=int, default=8080, help="default %(default)s; 0 = any free")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to bind (default %(default)s: this machine only); any "
                            "other needs the token, printed at start")
    serve.add_argument("--token", default=None,
                       help="the token to require (default: $NEMESIS_SERVE_TOKEN, else one "
                            "drawn at start when --host is not loopback)")
    show = sub.add_parser("show", help="print a stored run's verdict, tables and counterexample")
    show.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="e.g. store/latest")
    show.add_argument("--key", default=None, help="the invalid key whose counterexample to draw")


def _report_commands(args: argparse.Namespace) -> int:
    if args.command == "serve":
        import secrets

        from nemesis.report.serve import TOKEN_ENV, TokenRequired, is_loopback, make_server

        if not args.store.is_dir():
            return _refuse(f"{args.store} is not a folder; give the store with --store DIR "
                           f"(python -m nemesis run writes to ./store)")
        token = args.token or os.environ.get(TOKEN_ENV) or None
        if token is None and not is_loopback(args.host):
            token = secrets.token_urlsafe(32)
        try:
            server = make_server(args.store, args.host, args.port, token)
        except TokenRequired as exc:
            return _refuse(f"--token / ${TOKEN_ENV}: {exc}")
        except OSError as exc:
            return _refuse(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
        host, port = server.server_address[:2]
        shown = f"[{host}]" if ":" in host else host
        address = f"http://{shown}:{port}/" + (f"?token={token}" if token else "")
        print(f"serving {args.store.resolve()} at {address} (Ctrl-C stops)", flush=True)
        if token:
            print(f"every request needs the token: open that address once (a cookie keeps it) "
                  f"or send 'Authorization: Bearer {token}'", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
        return 0
    run_dir = args.run_dir.resolve()
    if not (run_dir / "history.jsonl").exists() and not (run_dir / "test.json").exists():
        return _refuse(f"{args.run_dir} is not a run folder (no history.jsonl); give one such "
                       f"as store/latest or store/kv/<timestamp>")
    if args.command == "show":
        from nemesis.report.data import load_run
        from nemesis.report.show import render

        print(render(load_run(run_dir), key=args.key))
        return 0
    from nemesis.report import write_junit, write_report

    print(f"report: {write_report(run_dir)}")
    if args.junit is not None:
        print(f"junit: {write_junit(run_dir, args.junit)}")
    return 0

# --- end of report, serve, show -------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.command == "run":
        return _run(args, argv)
    if args.command == "check":
        return _check(args)
    if args.command == "explore":
        return _explore(args)
    if args.command in ("report", "serve", "show"):
        return _report_commands(args)
    if args.command == "shrink":
        from nemesis.shrink import ShrinkRefused, shrink_run

        try:
            return shrink_run(args.run_dir.resolve(), args.test_out, sys.stdout)
        except ShrinkRefused as exc:
            return _refuse(str(exc))
    return _clean(args)


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    from nemesis.fault_mix import ALL, expand_all
    from nemesis.faults import min_nodes, parse_faults, unsupported
    from nemesis.platforms import choose
    from nemesis.platforms.base import PlatformUnavailable
    from nemesis.runner import RunConfig, run
    from nemesis.store import store_problem

    faults_all = args.faults.strip() == ALL
    note = ""
    try:
        if faults_all:  # every kind the platform runs; the auto-chosen one is known below
            faults, note = expand_all(args.platform or "local")
        elif ALL in (t.strip() for t in args.faults.split(",")):
            raise ValueError("--faults all cannot be combined with other faults")
        else:
            faults = parse_faults(args.faults)
    except ValueError as exc:
        return _refuse(str(exc))
    if faults_all:
        faults, note = _fit_all(faults, note, args.nodes, args.platform)
    for fault in faults:
        if args.nodes < (least := min_nodes(fault, args.platform)):
            return _refuse(f"--faults {fault} needs at least {least} nodes "
                           f"(a majority must be able to survive it); --nodes is {args.nodes}")
    from nemesis.systems import UnknownSystem, get_system
    from system.raft.unsafe import VARIANTS as CORE_VARIANTS
    from system.trainer.unsafe import CANARIES as TRAINER_CANARIES

    try:
        system = get_system(args.system)
    except UnknownSystem as exc:
        return _refuse(str(exc))
    CLIENT_CANARIES = system.client_canaries()  # noqa: N806
    ALLOW_ENV_VAR = system.unsafe_allow_env() or "MAO_ALLOW_UNSAFE"  # noqa: N806
    node_canaries = (*system.canaries(), *(CORE_VARIANTS if system.canaries() else ()))
    if args.unsafe and args.unsafe not in (*node_canaries, *CLIENT_CANARIES, *TRAINER_CANARIES):
        return _refuse(f"--unsafe {args.unsafe} is a canary of another system; the "
                       f"{system.name} system has none by that name")
    if args.workload == "trainer" and not hasattr(system, "kv_client_class"):
        return _refuse(f"--workload trainer needs our store (its state lives there); "
                       f"got --system {system.name}")
    if args.platform == "sim" and not system.simulated:
        return _refuse(f"--platform sim simulates our store only; got --system {system.name}")
    # election and rollback time their steps by Raft fields of the nodes' Status (candidates
    # and their term, the index a node was told to catch up to) that only our store serves.
    raft_status_faults = [f for f in faults if f in RAFT_STATUS_FAULTS]
    if raft_status_faults and not system.status_windows and not faults_all:
        return _refuse(f"--faults {raft_status_faults[0]} times its steps by Raft fields of "
                       f"the nodes' status that the {system.name} system does not report; "
                       f"it runs on --system store")

    # hold keeps a node's bytes in the proxy of each link it sends on; a system whose
    # members all dial one peer address per destination (etcd) has no such proxy.
    # reorder reads the store's own peer-lane frames in those proxies.
    for lane_fault in LANE_FAULTS:
        if lane_fault in faults and system.one_peer_address and args.platform == "local" \
                and not faults_all:
            return _refuse(f"--faults {lane_fault} on --platform local works in a proxy per "
                           f"link, which the {system.name} system's single peer address per "
                           f"member does not allow; it runs on --system store")

    # A broken Raft core (system/raft/unsafe.py) runs only when the person asks twice: by
    # name and in the environment, as `serve --unsafe` demands of a node.
    if args.unsafe in CORE_VARIANTS and os.environ.get(ALLOW_ENV_VAR) != "1":
        return _refuse(f"refusing --unsafe {args.unsafe}: it runs a deliberately broken Raft "
                       f"core to test the harness; set {ALLOW_ENV_VAR}=1 if that is really "
                       f"what you want")
    if args.unsafe in TRAINER_CANARIES and args.workload != "trainer":
        return _refuse(f"--unsafe {args.unsafe} is a trainer canary; it needs --workload trainer")
    gate_faults = [f for f in faults if f in GATE_FAULTS]
    if gate_faults and args.workload != "kv" and not faults_all:
        return _refuse(f"--faults {gate_faults[0]} holds the workload's clients for a quiet "
                       f"window, which only the kv workload can do; got --workload "
                       f"{args.workload}")
    if args.workload != "kv" and (args.mix is not None or args.unsafe in CLIENT_CANARIES):
        what = "--mix" if args.mix is not None else f"--unsafe {args.unsafe}"
        return _refuse(f"{what} is for the kv workload; got --workload {args.workload}")
    if args.platform is not None and (problem := unsupported(faults, args.platform)):
        return _refuse(problem)
    if args.platform == "sim" and args.workload != "kv":
        return _refuse(f"--platform sim runs the kv workload only (the simulator holds the "
                       f"store, not the trainer); got --workload {args.workload}")
    if args.tls and args.platform == "sim":
        return _refuse("--tls needs real nodes (--platform local, docker or ssh): the simulator's "
                       "nodes exchange messages in memory, with no network to encrypt")
    if args.rate < 0:
        return _refuse(f"--rate must be >= 0, got {args.rate:g}")
    ssh_hosts = None
    if args.platform == "ssh" and args.workload != "kv":
        return _refuse(f"--platform ssh runs the kv workload only for now; --workload "
                       f"{args.workload} across hosts is not built yet (issue 26)")
    if args.platform == "ssh":
        from nemesis.platforms.ssh_hosts import HostsFileError, read_hosts

        if args.hosts is None:
            return _refuse("--platform ssh needs --hosts FILE (one host per line; "
                           "docs/nemesis.md, 'Real machines')")
        try:
            ssh_hosts = read_hosts(args.hosts)
        except HostsFileError as exc:
            return _refuse(str(exc))
        if len(ssh_hosts) < args.nodes:
            return _refuse(f"--nodes {args.nodes} needs {args.nodes} hosts, one per node; "
                           f"{args.hosts} names {len(ssh_hosts)}")
        if args.known_hosts is not None and not args.known_hosts.is_file():
            return _refuse(f"--known-hosts {args.known_hosts} does not exist")
    elif args.hosts is not None or args.known_hosts is not None or args.accept_new_host_keys:
        return _refuse("--hosts, --known-hosts and --accept-new-host-keys are for "
                       "--platform ssh")
    if args.interval * 2 > args.duration and faults != ["none"]:
        print(f"note: --interval {args.interval:g} leaves no room for a fault in "
              f"--duration {args.duration:g} (a fault starts after one quiet interval)",
              file=sys.stderr)
    try:
        platform, reason = choose(args.platform)
    except PlatformUnavailable as exc:
        return _refuse(str(exc))
    # Made only once the platform answers, so a refused platform leaves nothing behind.
    if problem := store_problem(args.store, args.workload):
        return _refuse(problem)
    # The first line says where the nodes run and why.
    print(f"platform: {platform} ({reason})", flush=True)
    if faults_all:
        faults, note = _fit_all(*expand_all(platform), args.nodes, platform)
        if not system.status_windows:
            left = [f for f in faults if f in RAFT_STATUS_FAULTS]
            faults = [f for f in faults if f not in RAFT_STATUS_FAULTS]
            if left:
                why = (f"{', '.join(left)} (they time their steps by Raft fields of the "
                       f"status only our store reports)")
                note = (f"{note}; {why}" if note else
                        f"note: --faults all with --system {system.name} leaves out {why}")
        left = [f for f in faults if f in GATE_FAULTS] if args.workload != "kv" else []
        if left:
            faults = [f for f in faults if f not in left]
            why = f"{', '.join(left)} (it holds the clients, which only the kv workload can)"
            note = (f"{note}; {why}" if note else
                    f"note: --faults all with --workload {args.workload} leaves out {why}")
        left = [f for f in faults if f in LANE_FAULTS] if system.one_peer_address else []
        if left:
            faults = [f for f in faults if f not in left]
            why = (f"{', '.join(left)} (its members share one peer address per destination, "
                   f"no link proxy)")
            note = (f"{note}; {why}" if note else
                    f"note: --faults all with --system {system.name} leaves out {why}")
    if note:
        print(note, flush=True)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
    config = RunConfig(
        argv=["python", "-m", "nemesis", *argv], platform=platform, platform_reason=reason,
        faults=faults, duration_s=args.duration, interval_s=args.interval, nodes=args.nodes,
        workload=args.workload, seed=seed, store=args.store,
        concurrency=args.concurrency or 2 * args.nodes, rate=args.rate,
        op_timeout_s=args.op_timeout, read_consistency=args.read_consistency,
        unsafe=args.unsafe, check_budget_s=args.check_budget_s,
        check_wall_budget_s=args.check_wall_budget_s, junit=args.junit,
        faults_all=faults_all, mix=args.mix, tls=args.tls, system=args.system,
        ssh_hosts=ssh_hosts, hosts_file=args.hosts, known_hosts=args.known_hosts,
        accept_new_host_keys=args.accept_new_host_keys)
    return run(config)


def _check(args: argparse.Namespace) -> int:
    from histories.ops import HistoryError
    from nemesis import check

    run_dir = args.run_dir.resolve()
    if not (run_dir / "history.jsonl").exists():
        return _refuse(f"{args.run_dir} has no history.jsonl; give a run folder such as "
                       f"store/latest or store/kv/<timestamp>")
    try:
        results = check.check_run(run_dir, budget_s=args.budget_s,
                                  wall_budget_s=args.wall_budget_s)
    except HistoryError as exc:
        return _refuse(f"cannot read the history: {exc}")
    for line in check.summary_lines(results):
        print(line)
    print(f"{results['verdict']}: {run_dir} (results.json rewritten)")
    return check.exit_code(results["valid"])


def _clean(args: argparse.Namespace) -> int:
    from nemesis.platforms import docker_status
    from nemesis.platforms import local as local_platform

    if args.hosts is not None:  # the hosts of --platform ssh, and nothing on this machine
        from nemesis.platforms.base import PlatformError
        from nemesis.platforms.ssh_clean import clean_hosts
        from nemesis.platforms.ssh_hosts import HostsFileError, read_hosts

        try:
            removed = clean_hosts(read_hosts(args.hosts), args.run, known_hosts=args.known_hosts,
                                  accept_new=args.accept_new_host_keys)
        except (HostsFileError, PlatformError) as exc:
            return _refuse(str(exc))
        for item in removed:
            print(f"removed {item}")
        print(f"clean: removed {len(removed)} item{'s' if len(removed) != 1 else ''}")
        return 0
    removed = local_platform.clean(args.run)
    ok, reason = docker_status()
    if ok:
        from nemesis.platforms import docker as docker_platform

        removed += docker_platform.clean(args.run)
        if args.images:
            from nemesis.platforms import image

            removed += image.remove_images()
    else:
        print(f"docker: skipped ({reason})")
    for item in removed:
        print(f"removed {item}")
    print(f"clean: removed {len(removed)} item{'s' if len(removed) != 1 else ''}")
    return 0


RAFT_STATUS_FAULTS = ("election", "rollback", "restore-majority")  # need System.status_windows
GATE_FAULTS = ("restore-majority",)  # hold the workload's clients (workloads.base.ClientGate)
LANE_FAULTS = ("hold", "reorder")  # on local: a proxy per link (and for reorder, our frames)


def _fit_all(faults: list[str], note: str, nodes: int,
             platform: str | None = None) -> tuple[list[str], str]:
    """`--faults all` means every kind this cluster size can run too; the note names the
    kinds left out for it."""
    from nemesis.faults import min_nodes

    small = [f for f in faults if nodes < min_nodes(f, platform)]
    if not small:
        return faults, note
    left = "; ".join(f"{f} (needs {min_nodes(f, platform)} nodes)" for f in small)
    note = f"{note}; {left}" if note else f"note: --faults all with --nodes {nodes} leaves out {left}"
    return [f for f in faults if f not in small], note


def _refuse(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_HARNESS
