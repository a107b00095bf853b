"""The load generator: N concurrent clients doing one kind of operation against a cluster for
a bounded time and count, measured the same way for every system.

It runs in its own process(es), never inside the benchmark's controlling process or a
server: with 2 cores and the GIL, a generator sharing a process with anything else would
measure that thing. Each generator process drives its share of the clients with grpc.aio on
one event loop; `run_load` starts the processes, releases them at one instant, and merges
their latencies.

Protocol between parent and child (`python -m benchmarks.kvbench.loadgen SPEC_JSON`): the
child connects every client, prints `ready`, reads the start time (time.monotonic, which
is one clock for all processes on Linux) from stdin, runs, and prints one JSON result.

Every loop here is bounded by both a deadline and an operation count.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from benchmarks.kvbench.clients import ClientKind, open_client
from benchmarks.kvbench.processes import REPO_ROOT, child_environment, dying_with_parent


class Operation(enum.Enum):
    PUT = "put"
    GET_LINEARIZABLE = "get-linearizable"
    GET_STALE = "get-stale"


@dataclass(frozen=True)
class LoadSpec:
    """One measured row's load, as sent to a generator process."""

    client_kind: ClientKind
    addresses: tuple[str, ...]  # client i talks to addresses[i % len(addresses)]
    operation: Operation
    clients: int
    value_size_bytes: int
    warmup_s: float  # operations started before warmup ends are not measured
    duration_s: float  # measured window after the warmup
    max_measured_ops: int  # the window closes early once this many were measured
    keys_per_client: int  # client i cycles over keys k{i}-0 .. k{i}-{keys_per_client-1}
    op_timeout_s: float
    first_client_index: int = 0
    tls_dir: str = ""  # mutual TLS with the certificates there (Target.tls_dir), or plaintext

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["client_kind"] = self.client_kind.value
        data["operation"] = self.operation.value
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> LoadSpec:
        data = json.loads(text)
        data["client_kind"] = ClientKind(data["client_kind"])
        data["operation"] = Operation(data["operation"])
        data["addresses"] = tuple(data["addresses"])
        return cls(**data)


@dataclass(frozen=True)
class LoadResult:
    measured_ops: int
    errors: int
    late_ops: int  # started in the window but acknowledged only after it closed
    acknowledged_ops: int  # every acknowledged operation, warm-up and late ones included
    ops_per_s: float  # summed over generator processes, each over its own measured window
    latencies_us: tuple[int, ...]  # one per measured operation
    first_error: str  # empty when none
    value_size_bytes: int

    @property
    def megabytes_per_s(self) -> float:
        return self.ops_per_s * self.value_size_bytes / 1e6

    def latency_ms(self, percentile: float) -> float | None:
        if not self.latencies_us:
            return None
        ordered = sorted(self.latencies_us)
        rank = min(len(ordered) - 1, max(0, round(percentile / 100 * len(ordered)) - 1))
        return ordered[rank] / 1000


def key_for(client_index: int, op_number: int, keys_per_client: int) -> str:
    return f"k{client_index:03d}-{op_number % keys_per_client}"


async def _drive(spec: LoadSpec, start_at: float, clients: list) -> dict:
    measure_from = start_at + spec.warmup_s
    end_at = measure_from + spec.duration_s
    value = os.urandom(spec.value_size_bytes)
    latencies: list[int] = []
    state = {"errors": 0, "late": 0, "acknowledged": 0, "first_error": "", "window_closed_at": end_at}
    # A generous hard cap on attempts per client, on top of the deadline.
    max_attempts_per_client = spec.max_measured_ops + 1_000_000

    async def one_client(slot: int, client) -> None:
        client_index = spec.first_client_index + slot
        for op_number in range(max_attempts_per_client):
            started = time.monotonic()
            if started >= state["window_closed_at"]:
                return
            key = key_for(client_index, op_number, spec.keys_per_client)
            try:
                if spec.operation is Operation.PUT:
                    await client.put(key, value, spec.op_timeout_s)
                else:
                    linearizable = spec.operation is Operation.GET_LINEARIZABLE
                    await client.get(key, linearizable, spec.op_timeout_s)
            except grpc.aio.AioRpcError as error:
                state["errors"] += 1
                if not state["first_error"]:
                    state["first_error"] = f"{error.code().name}: {error.details()}"
                # Do not spin on a failing member; errors are counted, not hidden.
                await asyncio.sleep(0.01)
                continue
            done = time.monotonic()
            state["acknowledged"] += 1
            if started < state["window_closed_at"] < done:
                state["late"] += 1
            if started >= measure_from and done <= state["window_closed_at"]:
                latencies.append(int((done - started) * 1e6))
                if len(latencies) >= spec.max_measured_ops:
                    state["window_closed_at"] = done

    delay_s = start_at - time.monotonic()
    if delay_s > 0:
        await asyncio.sleep(delay_s)
    await asyncio.gather(*(one_client(slot, client) for slot, client in enumerate(clients)))
    window_s = min(state["window_closed_at"], end_at) - measure_from
    return {
        "measured_ops": len(latencies),
        "errors": state["errors"],
        "late_ops": state["late"],
        "acknowledged_ops": state["acknowledged"],
        "window_s": window_s,
        "latencies_us": latencies,
        "first_error": state["first_error"],
    }


async def _child_main(spec: LoadSpec) -> dict:
    clients = [
        open_client(spec.client_kind,
                    spec.addresses[(spec.first_client_index + slot) % len(spec.addresses)],
                    tls_dir=spec.tls_dir)
        for slot in range(spec.clients)
    ]
    try:
        await asyncio.gather(*(client.wait_connected(10.0) for client in clients))
        print("ready", flush=True)
        line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        return await _drive(spec, float(line), clients)
    finally:
        await asyncio.gather(*(client.close() for client in clients), return_exceptions=True)


def _read_line(process: subprocess.Popen, timeout_s: float) -> str:
    ready, _, _ = select.select([process.stdout], [], [], timeout_s)
    if not ready:
        raise TimeoutError(f"load generator gave no sign of life within {timeout_s:.0f} s")
    return process.stdout.readline().decode().strip()


def run_load(spec: LoadSpec, processes: int, log_dir: Path) -> LoadResult:
    """Run spec.clients clients split over `processes` generator processes; merge results.
    Every child is killed in the finally, whatever happens."""
    processes = max(1, min(processes, spec.clients))
    shares = [spec.clients // processes + (1 if i < spec.clients % processes else 0) for i in range(processes)]
    children: list[subprocess.Popen] = []
    logs = []
    try:
        first = 0
        for index, share in enumerate(shares):
            child_spec = dataclasses.replace(
                spec,
                clients=share,
                first_client_index=first,
                max_measured_ops=max(1, spec.max_measured_ops * share // spec.clients),
            )
            first += share
            log = open(log_dir / f"loadgen-{index}.log", "ab")  # noqa: SIM115 - closed below
            logs.append(log)
            children.append(
                subprocess.Popen(
                    dying_with_parent(
                        [sys.executable, "-m", "benchmarks.kvbench.loadgen", child_spec.to_json()]
                    ),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    cwd=REPO_ROOT,
                    env=child_environment(),
                    start_new_session=True,
                )
            )
        for child in children:
            line = _read_line(child, 30.0)
            if line != "ready":
                raise RuntimeError(
                    f"load generator failed to connect (said {line!r}); see {log_dir}/loadgen-*.log"
                )
        start_at = time.monotonic() + 0.05
        for child in children:
            child.stdin.write(f"{start_at}\n".encode())
            child.stdin.flush()
        outputs = []
        limit_s = spec.warmup_s + spec.duration_s + spec.op_timeout_s + 30
        for child in children:
            out, _ = child.communicate(timeout=limit_s)
            if child.returncode != 0:
                raise RuntimeError(
                    f"load generator exited with {child.returncode}; see {log_dir}/loadgen-*.log"
                )
            outputs.append(json.loads(out.decode().strip().splitlines()[-1]))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        for log in logs:
            log.close()
    latencies = tuple(value for output in outputs for value in output["latencies_us"])
    return LoadResult(
        measured_ops=sum(output["measured_ops"] for output in outputs),
        errors=sum(output["errors"] for output in outputs),
        late_ops=sum(output["late_ops"] for output in outputs),
        acknowledged_ops=sum(output["acknowledged_ops"] for output in outputs),
        ops_per_s=sum(
            o["measured_ops"] / o["window_s"] for o in outputs if o["window_s"] > 0
        ),
        latencies_us=latencies,
        first_error=next((o["first_error"] for o in outputs if o["first_error"]), ""),
        value_size_bytes=spec.value_size_bytes,
    )


def main() -> None:
    spec = LoadSpec.from_json(sys.argv[1])
    result = asyncio.run(_child_main(spec))
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
