"""Where a put's time goes, stage by stage, on our store at 1 and 64 clients.

    python benchmarks/kv_stages.py [--duration-s 5] [--clients 1,64] [--via leader,follower]
                                   [--unary] [--profile] [--operation put|get-linearizable]
                                   [--grpc-peers] [--json FILE]

Starts one 3-member cluster of ours with KV_STAGE_TRACE set (system/kv/stage_trace.py), runs
the benchmark's load generator (benchmarks/kvbench/loadgen.py, the same clients as
kv_bench.py) with 256-byte puts, and after each load asks the leader for its stage summary
(SIGUSR2). It prints, per load: the client's latency, the leader's time per stage (mean and
p99), the part the leader does not see (client library, gRPC and the kernel on both sides),
the CPU each member spent per put, entries per fsync, and the machine's load average.
`--via follower` sends the puts to a follower, which forwards them to the leader.
It also asks every member for its hops (stage_trace.py) and merges them into one timeline
of a put across the processes: leader to follower, the follower's Ready and fsync, the
answer back, the commit (at 1 client one put per Ready; under load a Ready carries many).

A benchmark, not a test: it prints figures and asserts nothing about speed. Every process
it starts is stopped in a `finally`; loads are bounded in time and count; loopback only.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.kvbench.clients import ClientKind  # noqa: E402
from benchmarks.kvbench.kv_targets import OursTarget  # noqa: E402
from benchmarks.kvbench.loadgen import LoadSpec, Operation, run_load  # noqa: E402
from benchmarks.kvbench.machine import cpu_s, load_average  # noqa: E402
from benchmarks.kvbench.processes import wait_until  # noqa: E402
from benchmarks.kvbench.profiling import Sampler  # noqa: E402
from system.kv.stage_trace import ENV_VAR, STAGES  # noqa: E402


def summary_of(target: OursTarget, index: int, trace_dir: Path) -> dict:
    """A member's stage summary (it writes the file whole, by rename); resets its trace."""
    path = trace_dir / f"{target.ids[index]}.json"
    path.unlink(missing_ok=True)
    member = target.members[index]
    assert member is not None
    os.kill(member.pid, signal.SIGUSR2)
    wait_until(lambda: path.exists() or None, 10.0, what=f"{target.ids[index]}'s stage summary")
    return json.loads(path.read_text())


def member_summaries(target: OursTarget, trace_dir: Path) -> list[dict]:
    """Every member's summary (their hops included); resets their traces."""
    return [summary_of(target, i, trace_dir) for i in range(len(target.ids))]


# The path of one put across the members, in order; each step is the first event of that
# name on that member (L the leader, F the follower whose answer came first) at or after
# the previous step, for an index at least the put's (batches carry several).
TIMELINE = (
    ("L", "append-write", "leader hands the APPEND to the transport"),
    ("F", "append-received", "follower has it decoded (transport, network, transport)"),
    ("F", "taken", "follower's drive loop takes the Ready"),
    ("F", "persisted", "follower's write + fsync done"),
    ("F", "answer-write", "follower hands its answer to the transport"),
    ("L", "answer-received", "leader has the answer decoded (transport, network, transport)"),
    ("L", "committed", "leader's Ready commits it"),
)


def timeline(summaries: list[dict], leader: int) -> dict:
    """Median time of each TIMELINE step after the leader took the put's Ready (us), the
    leader's own fsync beside it, and how many of the leader's Readies could be followed
    all the way ("puts": one put each at 1 client)."""
    def by_name(hops: list) -> dict[str, list[tuple[int, int]]]:
        names: dict[str, list[tuple[int, int]]] = {}
        for name, index, t in hops:
            names.setdefault(name, []).append((t, index))
        for events in names.values():
            events.sort()
        return names

    def first(events: dict, name: str, after: int, index: int) -> int | None:
        found = events.get(name, [])
        position = bisect.bisect_left(found, (after, -1))
        for t, i in found[position:position + 64]:
            if i >= index:
                return t
        return None

    members = [by_name(s.get("hops", [])) for s in summaries]
    lead = members[leader]
    followers = [m for i, m in enumerate(members) if i != leader]
    offsets: dict[str, list[float]] = {}
    for t0, index in lead.get("taken", []):
        best = None
        for follower in followers:
            times, t = {}, t0
            for who, name, _ in TIMELINE:
                t = first(lead if who == "L" else follower, name, t, index)
                if t is None:
                    break
                times[name] = t
            if t is not None and (best is None or times["committed"] < best["committed"]):
                best = times
        own = first(lead, "persisted", t0, index)
        if best is None or own is None:
            continue
        for name, t in (*best.items(), ("leader persisted", own)):
            offsets.setdefault(name, []).append((t - t0) / 1000)
    return {"puts": len(offsets.get("committed", [])),
            "median_us": {k: sorted(v)[len(v) // 2] for k, v in offsets.items()}}


def render_timeline(row: dict) -> str:
    line = row.get("timeline")
    if not line or not line["puts"]:
        return ""
    out = [f"Across the members ({line['puts']:,} Readies followed; median microseconds after "
           f"the leader took a Ready of puts):\n", "| step | at | since the step before |",
           "|---|---|---|"]
    previous = 0.0
    for _, name, what in TIMELINE:
        at = line["median_us"][name]
        out.append(f"| {what} (`{name}`) | {at:,.0f} | {at - previous:+,.0f} |")
        previous = at
    out.append(f"| beside it: leader's own write + fsync done (`persisted`) | "
               f"{line['median_us']['leader persisted']:,.0f} | |")
    return "\n".join(out) + "\n"


def measure(target: OursTarget, trace_dir: Path, clients: int, via: str, duration_s: float,
            profile: bool, operation: Operation = Operation.PUT) -> dict:
    leader = target.find_leader()
    assert leader is not None
    index = leader if via == "leader" else (leader + 1) % len(target.ids)
    addresses = target.client_addresses()
    member_summaries(target, trace_dir)  # resets every member's trace
    pids = target.server_pids()
    cpu_before = [cpu_s(pid) for pid in pids]
    spec = LoadSpec(
        client_kind=target.client_kind, addresses=(addresses[index],), operation=operation,
        clients=clients, value_size_bytes=256, warmup_s=0.0, duration_s=duration_s,
        max_measured_ops=100_000, keys_per_client=100, op_timeout_s=10.0)
    sampler = None
    if profile:  # py-spy on the leader for the load's duration (costs CPU: a separate run)
        sampler = Sampler(target.members[leader].pid, duration_s,
                          trace_dir / f"profile-{clients}-{via}.txt", gil_only=True)
    load = run_load(spec, min(2, clients), target.work_dir)
    top = []
    if sampler is not None:
        result = sampler.result()
        top = [(f.function, f.self_percent, f.total_percent)
               for f in (*result.top_self[:10], *result.top_total_in_project[:8])]
    cpu_after = [cpu_s(pid) for pid in pids]
    summaries = member_summaries(target, trace_dir)
    summary = summaries[leader]
    line = timeline(summaries, leader) if operation is Operation.PUT else None
    for each in summaries:
        each.pop("hops", None)
    puts = max(1, load.acknowledged_ops)
    return {
        "operation": operation.value, "clients": clients, "via": via, "protocol": "unary calls" if target.client_kind is ClientKind.KV else "Session stream", "ops_per_s": load.ops_per_s, "errors": load.errors,
        "client_p50_ms": load.latency_ms(50), "client_p99_ms": load.latency_ms(99),
        "client_mean_ms": sum(load.latencies_us) / max(1, len(load.latencies_us)) / 1000,
        "cpu_ms_per_put": [(a - b) * 1000 / puts for a, b in zip(cpu_after, cpu_before, strict=True)],
        "leader_pid_index": pids.index(target.members[leader].pid),
        "leader": summary, "timeline": line, "load_average": load_average(), "profile": top,
    }


def render(rows: list[dict]) -> str:
    out = []
    for row in rows:
        s = row["leader"]
        kind = row.get("operation", "put") + "s"
        out.append(f"### {row['clients']} client(s), {kind} sent to the {row['via']} ({row['protocol']})\n")
        out.append(f"{row['ops_per_s']:,.0f} {kind}/s, client latency mean {row['client_mean_ms']:.2f} ms, "
                   f"p50 {row['client_p50_ms']:.2f} ms, p99 {row['client_p99_ms']:.2f} ms; "
                   f"{row['errors']} errors; load average {row['load_average']}.\n")
        if kind != "puts":  # the stage trace follows writes only
            leader_i = row["leader_pid_index"]
            out.append("CPU ms per operation: " + ", ".join(
                f"{'leader' if i == leader_i else 'member'} {c:.3f}"
                for i, c in enumerate(row["cpu_ms_per_put"])) + ".\n")
            out += _profile_table(row)
            continue
        out.append("| stage (on the leader) | mean ms | p99 ms |")
        out.append("|---|---|---|")
        for stage in STAGES[1:]:
            st = s["stages_us"][stage]
            out.append(f"| {stage} | {st['mean'] / 1000:.3f} | {st['p99'] / 1000:.3f} |")
        total = s["total_us"]
        outside = row["client_mean_ms"] - total["mean"] / 1000
        out.append(f"| **leader total** (received -> replied) | {total['mean'] / 1000:.3f} | {total['p99'] / 1000:.3f} |")
        out.append(f"| outside the leader's handler (client, gRPC, kernel{', follower hop' if row['via'] == 'follower' else ''}) | {outside:.3f} | |")
        leader_i = row["leader_pid_index"]
        cpus = ", ".join(f"{'leader' if i == leader_i else 'member'} {c:.3f}"
                         for i, c in enumerate(row["cpu_ms_per_put"]))
        out.append(f"\nCPU ms per put: {cpus}. Entries per fsync on the leader: "
                   f"{s['entries_per_ready']:.1f}; fsync mean {s['fsync_mean_us'] / 1000:.2f} ms; "
                   f"{s['writes']} writes traced.\n")
        out.append(render_timeline(row))
        out += _profile_table(row)
    return "\n".join(out)


def _profile_table(row: dict) -> list[str]:
    if not row["profile"]:
        return []
    return ["| leader profile (py-spy --gil: samples holding the GIL): function | self % | with callees % |",
            "|---|---|---|",
            *(f"| {name} | {own:.1f} | {total:.1f} |" for name, own, total in row["profile"]), ""]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--clients", default="1,64")
    parser.add_argument("--via", default="leader", help="comma-separated: leader, follower")
    parser.add_argument("--unary", action="store_true",
                        help="unary calls instead of the Session stream (the path other clients take)")
    parser.add_argument("--profile", action="store_true",
                        help="sample the leader with py-spy during each load (lowers the figures)")
    parser.add_argument("--operation", choices=[o.value for o in Operation], default="put",
                        help="what the clients do (the stage table follows puts only)")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    parser.add_argument("--grpc-peers", action="store_true",
                        help="members talk gRPC to each other (no --peer-listen/--peer-links)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvstages-") as work:
        trace_dir = Path(work) / "trace"
        os.environ[ENV_VAR] = str(trace_dir)
        target = OursTarget(Path(work) / "cluster", tcp_peers=not args.grpc_peers)
        if args.unary:
            target.client_kind = ClientKind.KV
        rows = []
        try:
            target.start()
            for via in args.via.split(","):
                for clients in (int(c) for c in args.clients.split(",")):
                    rows.append(measure(target, trace_dir, clients, via, args.duration_s,
                                        args.profile, Operation(args.operation)))
                    print(render(rows[-1:]), flush=True)
        finally:
            target.stop()
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
