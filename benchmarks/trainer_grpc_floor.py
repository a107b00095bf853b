"""The floor under a trainer step's communication: what Python gRPC costs per message with
nothing behind it, as the trainer uses it — a sync server (thread pool) and a sync client,
unary calls against messages on one bidirectional stream fed from a queue (as worker.py's
TrainStream), 5,200-byte messages (the digits model's parameters).

    python benchmarks/trainer_grpc_floor.py [--messages 3000]

A no-op echo server runs in a child process on a free loopback port; this process sends
one message at a time and waits for its echo. Printed per message: the server's CPU
(getrusage of the child, every thread) and context switches, and the client's CPU. A
benchmark, not a test: it asserts nothing; the counts are bounded; the child is always
stopped. benchmarks/grpc_floor.py measures the same for grpc.aio (the store's server).
"""

from __future__ import annotations

import argparse
import os
import queue
import resource
import subprocess
import sys
import time
from concurrent import futures

import grpc

PAYLOAD = b"x" * 5200


def _handlers() -> grpc.GenericRpcHandler:
    def unary(raw: bytes, context: grpc.ServicerContext) -> bytes:
        return raw

    def stream(requests, context: grpc.ServicerContext):  # noqa: ANN001, ANN202
        yield from requests

    return grpc.method_handlers_generic_handler("floor.Echo", {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "Stream": grpc.stream_stream_rpc_method_handler(stream),
    })


def serve() -> None:
    """The child: print the port, then its CPU seconds and context switches per stdin line."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((_handlers(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    for _ in sys.stdin:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        print(ru.ru_utime + ru.ru_stime, ru.ru_nvcsw + ru.ru_nivcsw, flush=True)
    server.stop(grace=None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return 0
    n = max(100, min(args.messages, 100_000))
    child = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        port = child.stdout.readline().strip()

        def server_usage() -> tuple[float, int]:
            child.stdin.write("?\n")
            child.stdin.flush()
            cpu, switches = child.stdout.readline().split()
            return float(cpu), int(switches)

        print(f"load average {os.getloadavg()[0]:.1f}; {n} messages of {len(PAYLOAD)} bytes, one at a time")
        print("| sync gRPC | messages/s | server CPU / message | server context switches / message | client CPU / message |")
        print("|---|---:|---:|---:|---:|")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            unary = channel.unary_unary("/floor.Echo/Unary")
            for _ in range(100):
                unary(PAYLOAD, timeout=10)
            for kind in ("unary call", "stream message"):
                s0, c0, t0 = server_usage(), time.process_time(), time.perf_counter()
                if kind == "unary call":
                    for _ in range(n):
                        unary(PAYLOAD, timeout=10)
                else:
                    requests: queue.SimpleQueue = queue.SimpleQueue()
                    replies = channel.stream_stream("/floor.Echo/Stream")(iter(requests.get, None), timeout=600)
                    for _ in range(n):
                        requests.put(PAYLOAD)
                        next(replies)
                    requests.put(None)
                wall, cpu, s1 = time.perf_counter() - t0, time.process_time() - c0, server_usage()
                print(f"| {kind} | {n / wall:,.0f} | {1000 * (s1[0] - s0[0]) / n:.3f} ms "
                      f"| {(s1[1] - s0[1]) / n:.1f} | {1000 * cpu / n:.3f} ms |")
    finally:
        child.stdin.close()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
