"""What a Python gRPC server pays per request, with nothing behind it: unary calls against
messages on one long-lived bidirectional stream, at 1 and 64 clients, on asyncio's loop and
(when installed) uvloop's; and how long one stream message takes to cross from one
process to another, against a plain asyncio TCP connection.

    python benchmarks/grpc_floor.py [--duration-s 3]

Each case starts a no-op echo server in a child process on a free loopback port, drives it
from this process with grpc.aio (one channel per client, one request in flight each), and
prints calls per second and the server's CPU per call. The one-way case sends a message
every 1.5 ms carrying its send time (time.monotonic_ns, one clock for all processes) and
the receiver prints the median delay. A put of our store crosses four such hops (client to
leader, leader to follower and back, leader to client), so these bound every row of
kv_bench.py measured through a Python server (docs/benchmarks.md). A benchmark, not a test:
it asserts nothing; every load is bounded in time and count; the child is always stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import resource
import subprocess
import sys
import time

import grpc

MAX_CALLS_PER_CLIENT = 1_000_000


def _handlers() -> grpc.GenericRpcHandler:
    async def unary(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return raw

    async def stream(requests, context: grpc.aio.ServicerContext):  # noqa: ANN001, ANN202
        async for raw in requests:
            yield raw

    return grpc.method_handlers_generic_handler("floor.Echo", {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "Stream": grpc.stream_stream_rpc_method_handler(stream),
    })


ONE_WAY_MESSAGES = 2_000
ONE_WAY_GAP_S = 0.0015
ONE_WAY_PAYLOAD = 300  # bytes, about a put's APPEND


async def _one_way_receiver(kind: str) -> None:
    """Print the port, then the median delay of ONE_WAY_MESSAGES timestamped messages."""
    delays: list[int] = []
    finished = asyncio.Event()

    def record(raw: bytes) -> None:
        delays.append(time.monotonic_ns() - int.from_bytes(raw[:8], "big"))
        if len(delays) == ONE_WAY_MESSAGES:
            finished.set()

    if kind == "grpc":
        async def sink(requests, context: grpc.aio.ServicerContext) -> bytes:  # noqa: ANN001
            async for raw in requests:
                record(raw)
            return b""
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("floor.Sink", {
            "Stream": grpc.stream_unary_rpc_method_handler(sink)}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
    else:
        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while not finished.is_set():
                record(await reader.readexactly(ONE_WAY_PAYLOAD))
        tcp = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = tcp.sockets[0].getsockname()[1]
    print(port, flush=True)
    await asyncio.wait_for(finished.wait(), 120)
    ordered = sorted(delays[ONE_WAY_MESSAGES // 10:])  # the first tenth warms up
    print(json.dumps({"p50_us": ordered[len(ordered) // 2] / 1000}), flush=True)


async def _one_way_send(kind: str, port: int) -> None:
    padding = b"x" * (ONE_WAY_PAYLOAD - 8)
    if kind == "grpc":
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        call = channel.stream_unary("/floor.Sink/Stream")()
        for _ in range(ONE_WAY_MESSAGES):
            await call.write(time.monotonic_ns().to_bytes(8, "big") + padding)
            await asyncio.sleep(ONE_WAY_GAP_S)
        await call.done_writing()
        await channel.close()
    else:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(ONE_WAY_MESSAGES):
            writer.write(time.monotonic_ns().to_bytes(8, "big") + padding)
            await asyncio.sleep(ONE_WAY_GAP_S)
        writer.close()


def _one_way(kind: str) -> float:
    receiver = subprocess.Popen([sys.executable, __file__, "--one-way-receiver", kind],
                                stdout=subprocess.PIPE, text=True)
    try:
        port = int(receiver.stdout.readline())
        asyncio.run(_one_way_send(kind, port))
        return json.loads(receiver.stdout.readline())["p50_us"]
    finally:
        receiver.kill()
        receiver.wait()


async def _serve() -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((_handlers(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"cpu_s": usage.ru_utime + usage.ru_stime}), flush=True)
    await server.stop(None)


async def _drive(port: int, kind: str, clients: int, duration_s: float) -> int:
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}",
                                          options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(clients)]
    await asyncio.gather(*(c.channel_ready() for c in channels))
    end = time.monotonic() + duration_s
    payload = b"x" * 300
    counts = []

    async def one(channel: grpc.aio.Channel) -> None:
        done = 0
        if kind == "unary":
            call = channel.unary_unary("/floor.Echo/Unary")
            while time.monotonic() < end and done < MAX_CALLS_PER_CLIENT:
                await call(payload)
                done += 1
        else:
            stream = channel.stream_stream("/floor.Echo/Stream")()
            while time.monotonic() < end and done < MAX_CALLS_PER_CLIENT:
                await stream.write(payload)
                await stream.read()
                done += 1
            await stream.done_writing()
        counts.append(done)

    await asyncio.gather(*(one(c) for c in channels))
    await asyncio.gather(*(c.close() for c in channels))
    return sum(counts)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--one-way-receiver":
        asyncio.run(_one_way_receiver(sys.argv[2]))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        if sys.argv[2] == "uvloop":
            import uvloop
            uvloop.install()
        asyncio.run(_serve())
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=3.0)
    args = parser.parse_args()
    loops = ["asyncio"] + (["uvloop"] if importlib.util.find_spec("uvloop") else [])
    for loop in loops:
        for kind in ("unary", "stream"):
            for clients in (1, 64):
                server = subprocess.Popen([sys.executable, __file__, "--serve", loop],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                try:
                    port = int(server.stdout.readline())
                    calls = asyncio.run(_drive(port, kind, clients, args.duration_s))
                    server.stdin.write("\n")
                    server.stdin.flush()
                    cpu_s = json.loads(server.stdout.readline())["cpu_s"]
                finally:
                    server.kill()
                    server.wait()
                print(f"{loop:8} {kind:6} {clients:2} client(s): {calls / args.duration_s:7,.0f} "
                      f"calls/s, server CPU {cpu_s * 1000 / max(1, calls):.3f} ms per call "
                      f"(start-up included)", flush=True)
    for kind, name in (("grpc", "gRPC stream message"), ("tcp", "asyncio TCP write")):
        print(f"one-way, idle, one {name} every {ONE_WAY_GAP_S * 1000:g} ms: "
              f"p50 {_one_way(kind):.0f} us", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
