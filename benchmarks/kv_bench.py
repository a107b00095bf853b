"""Benchmark our replicated key-value store side by side with etcd and PySyncObj.

    bash benchmarks/setup_kv_bench.sh          # once: installs etcd-server and pysyncobj
    python benchmarks/kv_bench.py [--systems ours,etcd,pysyncobj] [--quick] [--out FILE]

For each system it starts a 3-member cluster on free loopback ports in a temporary
directory, drives it with the same load generator (separate processes, grpc.aio, one
connection per client, the same client concurrency), and measures: put ops/s and p50/p99
latency at 1, 16 and 64 clients with 256-byte values; linearizable and stale get ops/s at
64 clients; 1 MiB puts in MB/s with the peak RSS of the largest member; and, on fresh
clusters, the time from SIGKILL of the leader to the first acknowledged write. It prints a
table with the ratios ours/etcd and ours/PySyncObj and the issue's targets, and writes it
to benchmarks/results/kv.md. `--quick` runs a tiny version (a few seconds per system).

Every process it starts is stopped when it ends, including on Ctrl-C or failure. It talks
to loopback addresses only, and every load loop is bounded in time and count.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks.kvbench import report  # noqa: E402
from benchmarks.kvbench.etcd_target import EtcdTarget  # noqa: E402
from benchmarks.kvbench.failover import measure_leader_kill  # noqa: E402
from benchmarks.kvbench.kv_targets import OursTarget, PySyncObjTarget  # noqa: E402
from benchmarks.kvbench.loadgen import LoadSpec, Operation, run_load  # noqa: E402
from benchmarks.kvbench.machine import cpu_s, fdatasync_latency, load_average  # noqa: E402
from benchmarks.kvbench.processes import RssSampler, wait_until  # noqa: E402
from benchmarks.kvbench.profiling import Sampler  # noqa: E402
from benchmarks.kvbench.target import Target  # noqa: E402

TARGET_CLASSES: dict[str, type[Target]] = {
    "ours": OursTarget,
    "etcd": EtcdTarget,
    "pysyncobj": PySyncObjTarget,
}
# `--tls` adds these: the same systems with mutual TLS on every port, measured on the rows
# in TLS_ROWS in the same run (and round) as the plaintext ones.
TLS_SYSTEMS = ("ours", "etcd")
TLS_SUFFIX = "-tls"
TLS_ROWS = ("put_1", "put_64", "get_linearizable_64")
VALUE_SIZE_BYTES = 256
BIG_VALUE_BYTES = 1024 * 1024
BIG_VALUE_CLIENTS = 4
LEADER_WAIT_S = 15.0


@dataclass(frozen=True)
class Settings:
    warmup_s: float
    duration_s: float  # measured window per row
    max_ops_per_row: int
    big_max_ops: int  # 1 MiB puts per row at most (bounds disk and memory use)
    kill_repeats: int
    client_processes: int
    op_timeout_s: float = 10.0
    big_op_timeout_s: float = 30.0  # one 1 MiB put; PySyncObj's never finish (docs/benchmarks.md)
    rounds: int = 1  # every row this many times; the table gives the median (peak for RSS)


FULL = Settings(warmup_s=1.0, duration_s=8.0, max_ops_per_row=200_000, big_max_ops=400, kill_repeats=5, client_processes=2)
QUICK = Settings(warmup_s=0.3, duration_s=1.5, max_ops_per_row=20_000, big_max_ops=40, kill_repeats=1, client_processes=2, big_op_timeout_s=5.0)


def progress(message: str) -> None:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%H:%M:%S")
    print(f"[{stamp}] {message}", flush=True)


@dataclass(frozen=True)
class RowPlan:
    """One measured row: what load, where to send it, and under which key to record it."""

    key: str  # report row key prefix: put_64 -> put_64_ops, put_64_p50, ...
    label: str
    operation: Operation
    clients: int
    value_size_bytes: int = VALUE_SIZE_BYTES
    keys_per_client: int = 100
    all_members: bool = False  # stale reads are spread over the members; the rest go to the leader
    big: bool = False  # the 1 MiB row: MB/s and peak RSS instead of ops/s and latency


# In this order the get rows find the keys the 64-client put row wrote.
ROW_PLANS = (
    RowPlan("put_1", "put, 1 client", Operation.PUT, 1),
    RowPlan("put_16", "put, 16 clients", Operation.PUT, 16),
    RowPlan("put_64", "put, 64 clients", Operation.PUT, 64),
    RowPlan("get_linearizable_64", "linearizable get, 64 clients", Operation.GET_LINEARIZABLE, 64),
    RowPlan("get_stale_64", "stale get, 64 clients", Operation.GET_STALE, 64, all_members=True),
    RowPlan(
        "put_1mib",
        f"1 MiB puts, {BIG_VALUE_CLIENTS} clients",
        Operation.PUT,
        BIG_VALUE_CLIENTS,
        value_size_bytes=BIG_VALUE_BYTES,
        keys_per_client=4,
        big=True,
    ),
)


def measure_row(target: Target, plan: RowPlan, settings: Settings, result: report.SystemResult) -> None:
    # A cluster may be between leaders after the previous row's load: wait for one.
    try:
        leader = wait_until(target.find_leader, LEADER_WAIT_S, what=f"a leader before row {plan.key!r}")
    except TimeoutError as error:
        raise RuntimeError(f"{error}\n{target.describe_logs()}") from error
    addresses = target.client_addresses()
    spec = LoadSpec(
        client_kind=target.client_kind,
        # Writes and linearizable reads go to the leader, where every system serves them
        # best; stale reads are spread over all members, which is what they are for.
        addresses=tuple(addresses) if plan.all_members else (addresses[leader],),
        operation=plan.operation,
        clients=plan.clients,
        value_size_bytes=plan.value_size_bytes,
        warmup_s=settings.warmup_s,
        duration_s=settings.duration_s,
        max_measured_ops=settings.big_max_ops if plan.big else settings.max_ops_per_row,
        keys_per_client=plan.keys_per_client,
        op_timeout_s=settings.big_op_timeout_s if plan.big else settings.op_timeout_s,
        tls_dir=target.tls_dir,
    )
    pids = target.server_pids()
    cpu_before = [cpu_s(pid) for pid in pids]
    with RssSampler(pids) as sampler:
        load = run_load(spec, settings.client_processes, target.work_dir)
    # What the members spent per operation (warm-up included on both sides): at one client
    # a write's path is this work done in series, so it bounds latency as much as the wire.
    server_cpu_ms = sum(_cpu_since(pid, before) for pid, before in zip(pids, cpu_before,
                                                                         strict=True)) * 1000
    p50, p99 = load.latency_ms(50), load.latency_ms(99)
    summary = f"{load.ops_per_s:,.0f} ops/s"
    if plan.big:
        summary += (
            f" = {load.megabytes_per_s:.1f} MB/s, {load.acknowledged_ops} acknowledged in all, "
            f"largest member RSS {(sampler.start_member_rss_bytes or 0) / 1e6:.0f} -> "
            f"{sampler.peak_member_rss_bytes / 1e6:.0f} MB"
        )
    if p50 is not None and p99 is not None:
        summary += f", p50 {p50:.2f} ms, p99 {p99:.2f} ms"
    if load.errors:
        summary += f", {load.errors} errors (first: {load.first_error})"
    if load.late_ops and (plan.big or load.measured_ops == 0):
        summary += f", {load.late_ops} still in flight when the window closed"
    progress(f"[{target.name}] {plan.label}: {summary}")

    if plan.big:
        result.add_sample("put_1mib_mbps", load.megabytes_per_s)
        result.add_sample("put_1mib_rss_mb", sampler.peak_member_rss_bytes / 1e6, peak=True)
        written_mib = load.acknowledged_ops * plan.value_size_bytes / 2**20
        if written_mib and sampler.start_member_rss_bytes is not None:
            growth_mb = (sampler.peak_member_rss_bytes - sampler.start_member_rss_bytes) / 1e6
            result.add_sample("put_1mib_rss_growth", growth_mb / written_mib, peak=True)
        figure_key = "put_1mib_mbps"
    else:
        figure_key = f"{plan.key}_ops"
        result.add_sample(figure_key, load.ops_per_s)
        if plan.operation is Operation.PUT and p50 is not None and p99 is not None:
            result.add_sample(f"{plan.key}_p50", p50)
            result.add_sample(f"{plan.key}_p99", p99)
        if load.acknowledged_ops:
            result.add_sample(f"{plan.key}_cpu", server_cpu_ms / load.acknowledged_ops)
    if load.errors:
        result.add_errors(figure_key, load.errors, load.first_error)
    if load.measured_ops == 0 and load.late_ops:
        result.notes.append(
            f"`{figure_key}`: no operation finished inside the measured window; "
            f"{load.late_ops} finished after it"
        )


def _cpu_since(pid: int, before: float) -> float:
    """CPU seconds `pid` spent since `before`; a member that died meanwhile counts 0
    (its row says so through its errors)."""
    try:
        return cpu_s(pid) - before
    except OSError:
        return 0.0


def base_system(name: str) -> str:
    return name.removesuffix(TLS_SUFFIX)


def make_target(name: str, work_dir: Path) -> Target:
    """The target `name` ("ours", "etcd-tls", ...) in `work_dir`, not started."""
    cls = TARGET_CLASSES[base_system(name)]
    target = cls(work_dir, tls=True) if name.endswith(TLS_SUFFIX) else cls(work_dir)
    target.name = name
    return target


def measures(name: str, plan: RowPlan) -> bool:
    return not name.endswith(TLS_SUFFIX) or plan.key in TLS_ROWS


def run_throughput_rows(
    names: list[str],
    settings: Settings,
    work_dir: Path,
    results: dict[str, report.SystemResult],
    profile: bool,
) -> None:
    """All clusters up at once, each row measured on every system back to back, so that
    the ratios of a row are taken within seconds of each other even when the machine's
    other load comes and goes."""
    targets: dict[str, Target] = {}
    try:
        for name in names:
            try:
                target = make_target(name, work_dir / name)
            except FileNotFoundError as error:
                results[name].failure = str(error)
                progress(f"[{name}] skipped: {error}")
                continue
            results[name].version = target.version()
            targets[name] = target
            progress(f"[{name}] starting 3 members ({results[name].version})")
            try:
                target.start()
            except Exception as error:
                _fail(results[name], target, error)
                del targets[name]
        # The 1 MiB rows come after every round of the others (and after the profile):
        # PySyncObj does not recover from them in time (docs/benchmarks.md), and they leave
        # etcd and our store holding hundreds of MB.
        regular = [plan for plan in ROW_PLANS if not plan.big]
        big = [plan for plan in ROW_PLANS if plan.big]

        def run_rounds(plans: list[RowPlan]) -> None:
            for round_number in range(settings.rounds):
                if settings.rounds > 1:
                    progress(f"round {round_number + 1}/{settings.rounds}")
                for plan in plans:
                    for name, target in list(targets.items()):
                        if not measures(name, plan):
                            continue
                        try:
                            measure_row(target, plan, settings, results[name])
                        except Exception as error:  # one failing must not cost the others their rows
                            _fail(results[name], target, error)
                            del targets[name]

        run_rounds(regular)
        if profile and "ours" in targets:
            profile_leader(targets["ours"], settings, results["ours"])
        run_rounds(big)
    finally:
        for target in targets.values():
            target.stop()


def profile_leader(target: Target, settings: Settings, result: report.SystemResult) -> None:
    """Run the 64-client put load once more with py-spy sampling our leader. Not part of
    the table: sampling costs CPU on a 2-core machine, so it gets its own run."""
    plan = next(plan for plan in ROW_PLANS if plan.key == "put_64")
    try:
        leader = wait_until(target.find_leader, LEADER_WAIT_S, what="a leader to profile")
        member = target.members[leader]
        assert member is not None
        sampler = Sampler(
            member.pid, settings.warmup_s + settings.duration_s + 1, target.work_dir / "leader-profile.txt"
        )
        scratch = report.SystemResult(name=target.name)
        measure_row(target, dataclasses.replace(plan, label=f"{plan.label} again, under py-spy"), settings, scratch)
        result.profile = sampler.result()
    except Exception as error:  # the profile is a note; the figures stand without it
        result.notes.append(f"no profile of the leader: {type(error).__name__}: {error}")
        progress(f"[{target.name}] profile skipped: {error}")


def _fail(result: report.SystemResult, target: Target, error: Exception) -> None:
    first_line = str(error).splitlines()[0] if str(error) else ""
    result.failure = f"{type(error).__name__}: {first_line}"
    progress(f"[{target.name}] FAILED, stopping it: {error}")
    target.stop()


def run_leader_kills(name: str, settings: Settings, work_dir: Path, result: report.SystemResult) -> None:
    cls = TARGET_CLASSES[name]
    for repeat in range(settings.kill_repeats):
        with cls(work_dir / f"{name}-kill{repeat}") as fresh:
            try:
                fresh.start()
                failover = measure_leader_kill(fresh)
            except Exception as error:
                _fail(result, fresh, error)
                return
        result.record_failover(failover.seconds)
        progress(
            f"[{name}] leader kill {repeat + 1}/{settings.kill_repeats}: first acked write "
            f"{failover.seconds:.2f} s after the SIGKILL"
        )


def render(
    results: dict[str, report.SystemResult],
    settings: Settings,
    command: str,
    started: str,
    machine_before: str,
    machine_after: str,
) -> str:
    versions = ", ".join(
        f"{report.SYSTEM_TITLES[r.name]} {r.version}" for r in results.values() if r.version
    )
    lines = [
        "# Key-value store benchmark: ours vs etcd vs PySyncObj",
        "",
        f"Command: `{command}`  ",
        f"Taken {started} UTC on {os.cpu_count()} cores, shared with other work.  ",
        f"Before: {machine_before}.  ",
        f"After: {machine_after}.  ",
        f"Versions: {versions}.  ",
        f"Each row: {settings.rounds} round(s) (the table gives the median; peak for memory), each "
        f"{settings.warmup_s:g} s warm-up then {settings.duration_s:g} s measured (at most "
        f"{settings.max_ops_per_row:,} operations; 1 MiB rows at most {settings.big_max_ops}), "
        f"{settings.client_processes} load-generator process(es) separate from the servers, one "
        f"gRPC connection per client. All clusters run at once and each row is measured on every "
        "system back to back, so a row's ratios are taken within seconds of each other. Leader "
        f"kill: {settings.kill_repeats} fresh cluster(s) per system, median and range.",
        "",
        report.table(results),
        *(["", "## With mutual TLS (same run, same rounds)", "",
           "Every port of every member over TLS with client certificates required (ours: "
           "`--cert-file --key-file --trusted-ca-file --client-cert-auth`, peers on the same "
           "certificates; etcd: the same flags and their `--peer-*` twins, "
           "`--peer-client-cert-auth`), ECDSA P-256 keys from a CA made for the run "
           "(`system.kv.tls.generate`). Cost = TLS figure / plaintext figure.", "",
           report.tls_table(results)] if any(n.endswith(TLS_SUFFIX) for n in results) else []),
        "",
        "## Targets from the issue (ratios measured in this run)",
        "",
        report.goals_table(results),
        "",
        "## How to read it",
        "",
        "- Ratios are ours divided by the peer: above 1 is better for ops/s and MB/s, below 1 is "
        "better for latency, memory and failover time.",
        "- Durability: etcd and our store fsync their write-ahead log before acknowledging; PySyncObj "
        "keeps everything in memory and never fsyncs (no journal file), so its figures are an upper "
        "bound on what Python Raft costs without a disk.",
        "- Every system pays the same client hop: PySyncObj has no client protocol, so each member runs "
        "a thin gRPC front that speaks our KV service; a put is answered when PySyncObj's callback "
        "reports it committed and applied (batching of appends off). PySyncObj has no ReadIndex, so "
        "its linearizable get goes through the log; its stale get reads the member's dict.",
        "- Puts and linearizable gets go to the leader; stale gets are spread over the three members. "
        "Our puts carry a request id (deduplication is paid for, as with our client library).",
        "- etcd runs with its defaults (heartbeat 100 ms, election timeout 1 s, no PreVote in 3.4, "
        "snapshot every 100,000 entries). Leader kill: writes are sent to both survivors every 20 ms "
        "after the SIGKILL; the figure is the time to the first acknowledgement of one of them.",
        "- The machine has 2 cores, shared with the servers, the load generator and, while this was "
        "measured, other work (see the load average and the fdatasync latency above, which bounds "
        "both stores that fsync): absolute figures move from run to run; the ratios, taken in the "
        "same run, move less.",
    ]
    if "ours" in results and results["ours"].profile is not None:
        lines += ["", *report.profile_section(results["ours"].profile)]
    notes = report.error_notes(results)
    if notes:
        lines += ["", "## Failures and errors", "", *notes]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default="ours,etcd,pysyncobj", help="comma-separated: ours, etcd, pysyncobj")
    parser.add_argument("--quick", action="store_true", help="a tiny run, a few seconds per system")
    parser.add_argument("--out", default=str(REPO_ROOT / "benchmarks" / "results" / "kv.md"))
    parser.add_argument("--duration-s", type=float, help="measured seconds per row (overrides the mode)")
    parser.add_argument("--kill-repeats", type=int, help="leader kills per system (overrides the mode)")
    parser.add_argument("--client-processes", type=int, help="load-generator processes (default 2; never more than the clients)")
    parser.add_argument(
        "--rounds", type=int, help="measure every row this many times and report the median (default 1)"
    )
    parser.add_argument("--keep-work-dir", action="store_true", help="keep data and logs of the clusters")
    parser.add_argument("--tls", action="store_true",
                        help="also measure ours and etcd with mutual TLS on every port "
                        f"(rows {', '.join(TLS_ROWS)}), in the same run as plaintext")
    parser.add_argument(
        "--no-profile",
        action="store_true",
        help="skip the extra 64-client put run with py-spy sampling our leader",
    )
    args = parser.parse_args()

    systems = [name.strip() for name in args.systems.split(",") if name.strip()]
    unknown = [name for name in systems if name not in TARGET_CLASSES]
    if unknown:
        parser.error(f"unknown system(s) {', '.join(unknown)}; choose from {', '.join(TARGET_CLASSES)}")
    if args.tls:
        systems += [name + TLS_SUFFIX for name in TLS_SYSTEMS if name in systems]
    settings = QUICK if args.quick else FULL
    overrides = {
        "duration_s": args.duration_s,
        "kill_repeats": args.kill_repeats,
        "client_processes": args.client_processes,
        "rounds": args.rounds,
    }
    settings = Settings(**{**settings.__dict__, **{k: v for k, v in overrides.items() if v is not None}})

    # SIGTERM takes the same path as Ctrl-C, so the finally blocks stop every cluster.
    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    # A shell starts background jobs with SIGINT ignored, and Python keeps that; Ctrl-C or
    # kill -INT must still stop the clusters.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    command = shlex.join(["python", "benchmarks/kv_bench.py", *sys.argv[1:]])
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")
    work_dir = Path(tempfile.mkdtemp(prefix="kvbench-"))

    def machine_state() -> str:
        return f"load average {load_average()}, fdatasync of 4 KiB here {fdatasync_latency(work_dir)}"

    machine_before = machine_state()
    progress(f"work directory {work_dir}; {machine_before}")
    results: dict[str, report.SystemResult] = {}
    began = time.monotonic()
    try:
        for name in systems:
            results[name] = report.SystemResult(name=name, durability=TARGET_CLASSES[base_system(name)].durability)
        run_throughput_rows(systems, settings, work_dir, results, profile=not args.no_profile)
        for name in systems:
            if not results[name].failure and not name.endswith(TLS_SUFFIX):
                run_leader_kills(name, settings, work_dir, results[name])
        machine_after = machine_state()
    except KeyboardInterrupt:
        progress("interrupted: every cluster has been stopped; no results written")
        return 130
    finally:
        if args.keep_work_dir:
            progress(f"kept {work_dir}")
        else:
            shutil.rmtree(work_dir, ignore_errors=True)
    text = render(results, settings, command, started, machine_before, machine_after)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print()
    print(text)
    progress(f"wrote {out} in {time.monotonic() - began:.0f} s")
    return 1 if any(r.failure for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
