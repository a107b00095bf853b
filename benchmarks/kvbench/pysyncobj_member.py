"""One PySyncObj cluster member with a thin gRPC front speaking our client API
(`manyasone.kv.KV`), so that PySyncObj, which has no client protocol of its own, pays the
same client hop as our store and etcd.

    python -m benchmarks.kvbench.pysyncobj_member --id p1 \\
        --members p1=127.0.0.1:7001/127.0.0.1:7101,p2=...,p3=...

(each member: client address / Raft address). PySyncObj is configured as the benchmark
issue says: batching of appends off (with its default batching a lone client gets about 9
puts/s), no journal and no dump file, so it keeps everything in memory and never fsyncs.

Semantics of the front:
- Put is answered once PySyncObj calls back that the command was committed and applied on
  this member. A follower forwards the command to its leader (PySyncObj does that itself);
  a failure (no leader, leader changed) is UNAVAILABLE with a leader hint in the trailing
  metadata, as our nodes do.
- Get LINEARIZABLE goes through the log (PySyncObj has no ReadIndex); STALE reads this
  member's dict.
This is benchmark scaffolding: it must never be mistaken for, or imported by, the store.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import grpc
from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, replicated

from system.kv.proto import kv_pb2, kv_pb2_grpc

MAX_MESSAGE_BYTES = 80 * 1024 * 1024


class VersionedDict(SyncObjConsumer):
    """Replicated dict of key -> (value, version); versions count writes, as in our store."""

    def __init__(self):
        super().__init__()
        self.entries: dict[str, tuple[bytes, int]] = {}

    @replicated
    def put(self, key: str, value: bytes, expected_version: int | None) -> tuple[bool, int]:
        _, version = self.entries.get(key, (b"", 0))
        if expected_version is not None and expected_version != version:
            return False, version
        self.entries[key] = (value, version + 1)
        return True, version + 1

    @replicated
    def read_through_log(self, key: str) -> tuple[bytes, int] | None:
        return self.entries.get(key)

    def read_local(self, key: str) -> tuple[bytes, int] | None:
        return self.entries.get(key)


class Front(kv_pb2_grpc.KVServicer):
    def __init__(self, member_id: str, members: dict[str, tuple[str, str]]):
        self.member_id = member_id
        self.members = members
        self.raft_to_id = {raft: name for name, (_, raft) in members.items()}
        self.store = VersionedDict()
        others = [raft for name, (_, raft) in members.items() if name != member_id]
        conf = SyncObjConf(appendEntriesUseBatch=False, dynamicMembershipChange=False)
        self.sync = SyncObj(members[member_id][1], others, conf=conf, consumers=[self.store])

    def _leader_id(self) -> str:
        leader = self.sync._getLeader()
        return self.raft_to_id.get(leader.address, "") if leader is not None else ""

    def _header(self) -> kv_pb2.Header:
        return kv_pb2.Header(
            node_id=self.member_id,
            term=self.sync.raftCurrentTerm,
            applied_index=self.sync.raftLastApplied,
            leader_id=self._leader_id(),
        )

    async def _replicate(self, method, *args):
        """Run a replicated method; return its result once committed and applied here."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def settle(result, error):
            if not future.done():
                future.set_result((result, error))

        # PySyncObj calls back from its own tick thread.
        method(*args, callback=lambda result, error: loop.call_soon_threadsafe(settle, result, error))
        return await future

    async def _unavailable(self, context, error: int) -> None:
        leader = self._leader_id()
        context.set_trailing_metadata(
            (("leader-id", leader), ("leader-address", self.members[leader][0] if leader else ""))
        )
        await context.abort(
            grpc.StatusCode.UNAVAILABLE,
            f"PySyncObj member {self.member_id} could not commit (fail reason {error}); "
            f"leader is {leader or 'unknown'}",
        )

    async def Put(self, request, context):
        expected = request.expected_version if request.HasField("expected_version") else None
        result, error = await self._replicate(self.store.put, request.key, request.value, expected)
        if error != FAIL_REASON.SUCCESS:
            await self._unavailable(context, error)
        applied, version = result
        return kv_pb2.PutResponse(applied=applied, version=version, header=self._header())

    async def Get(self, request, context):
        if request.consistency == kv_pb2.LINEARIZABLE:
            entry, error = await self._replicate(self.store.read_through_log, request.key)
            if error != FAIL_REASON.SUCCESS:
                await self._unavailable(context, error)
        else:
            entry = self.store.read_local(request.key)
        value, version = entry if entry is not None else (b"", 0)
        return kv_pb2.GetResponse(
            found=entry is not None,
            value=value,
            version=version,
            stale=request.consistency == kv_pb2.STALE,
            header=self._header(),
        )

    async def Session(self, request_iterator, context):
        """The stream our client library speaks (kv.proto Session), so PySyncObj pays the
        same client hop as our store: each request in a task, answers tagged by seq."""
        pending = set()
        writing = asyncio.Lock()

        async def serve_one(request):
            response = kv_pb2.SessionResponse(seq=request.seq)
            which = request.WhichOneof("request")
            if which == "put":
                put = request.put
                expected = put.expected_version if put.HasField("expected_version") else None
                result, error = await self._replicate(self.store.put, put.key, put.value, expected)
                if error == FAIL_REASON.SUCCESS:
                    response.put.CopyFrom(kv_pb2.PutResponse(applied=result[0], version=result[1], header=self._header()))
            elif which == "get":
                get = request.get
                error = FAIL_REASON.SUCCESS
                if get.consistency == kv_pb2.LINEARIZABLE:
                    entry, error = await self._replicate(self.store.read_through_log, get.key)
                else:
                    entry = self.store.read_local(get.key)
                if error == FAIL_REASON.SUCCESS:
                    value, version = entry if entry is not None else (b"", 0)
                    response.get.CopyFrom(kv_pb2.GetResponse(
                        found=entry is not None, value=value, version=version,
                        stale=get.consistency == kv_pb2.STALE, header=self._header()))
            else:
                error = -1
            if response.WhichOneof("response") is None:
                leader = self._leader_id()
                response.error.CopyFrom(kv_pb2.SessionError(
                    code=grpc.StatusCode.UNAVAILABLE.value[0], outcome="not-applied",
                    message=f"PySyncObj member {self.member_id} could not serve (reason {error})",
                    leader_id=leader, leader_address=self.members[leader][0] if leader else ""))
            async with writing:
                await context.write(response)

        async for request in request_iterator:
            task = asyncio.get_running_loop().create_task(serve_one(request))
            pending.add(task)
            task.add_done_callback(pending.discard)
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def Delete(self, request, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the PySyncObj front has no Delete")

    async def Status(self, request, context):
        status = self.sync.getStatus()
        role = {0: "follower", 1: "candidate", 2: "leader"}.get(status["state"], "unknown")
        return kv_pb2.StatusResponse(
            node_id=self.member_id,
            role=role,
            term=status["raft_term"],
            leader_id=self._leader_id(),
            commit_index=status["commit_idx"],
            applied_index=status["last_applied"],
            peers={name: client for name, (client, _) in self.members.items()},
        )


def parse_members(text: str) -> dict[str, tuple[str, str]]:
    members = {}
    for part in text.split(","):
        name, _, addresses = part.partition("=")
        client, _, raft = addresses.partition("/")
        if not (name and client and raft):
            raise SystemExit(f"--members: expected id=client_host:port/raft_host:port, got {part!r}")
        members[name] = (client, raft)
    return members


async def serve(member_id: str, members: dict[str, tuple[str, str]]) -> None:
    front = Front(member_id, members)
    server = grpc.aio.server(
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ]
    )
    kv_pb2_grpc.add_KVServicer_to_server(front, server)
    server.add_insecure_port(members[member_id][0])
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(grace=1.0)
    front.sync.destroy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--id", required=True)
    parser.add_argument("--members", required=True, help="id=client_addr/raft_addr,...")
    args = parser.parse_args()
    members = parse_members(args.members)
    if args.id not in members:
        raise SystemExit(f"--id {args.id} is not one of --members ({', '.join(members)})")
    asyncio.run(serve(args.id, members))


if __name__ == "__main__":
    main()
