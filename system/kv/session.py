"""The client library's side of `KV.Session`: one long-lived stream per node, shared by
every thread of a `KVClient`, each request tagged with a sequence number.

Why: on the node a unary call costs about three times the CPU of one message on an open
stream (docs/benchmarks.md), and the node's CPU is what bounds the store's throughput.

What it does: `call(frame, timeout_s)` sends one SessionRequest and waits for the answer
with that seq, at most `timeout_s`. It hands back the node's answer, or raises
`SessionRpcError` shaped like a failed unary call (code, details, trailing metadata with
"kv-outcome" and the leader hint), so the client classifies both paths the same way.
A stream that breaks fails every request still waiting on it with the stream's own error
(no "kv-outcome": the client treats a write as maybe applied); the next call opens a new
stream. A request that times out is forgotten; its late answer is dropped.

What it must never do: deliver an answer to the wrong request, or let a broken stream
look like a certain failure.
"""

from __future__ import annotations

import collections
import itertools
import queue
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import grpc

from system.kv.proto import kv_pb2

_END = object()  # tells the request iterator to finish the stream
_CODES = {code.value[0]: code for code in grpc.StatusCode}


# Bounds of one SessionBatch: a burst of small requests in one message, a large value alone.
MAX_BATCH_FRAMES = 256
MAX_BATCH_BYTES = 1 << 20


def take_batch(queue: collections.deque[bytes],
               kind: type[kv_pb2.SessionRequest] | type[kv_pb2.SessionResponse]) -> bytes:
    """The next stream message from `queue` (not empty): its first frame alone, or as
    many queued frames as fit the bounds packed in one `kind` carrying a SessionBatch."""
    if len(queue) == 1 or len(queue[0]) >= MAX_BATCH_BYTES:
        return queue.popleft()
    frames: list[bytes] = []
    size = 0
    while queue and len(frames) < MAX_BATCH_FRAMES and size + len(queue[0]) <= MAX_BATCH_BYTES:
        frame = queue.popleft()
        frames.append(frame)
        size += len(frame)
    if len(frames) == 1:
        return frames[0]
    return kind(batch=kv_pb2.SessionBatch(frames=frames)).SerializeToString()


class SessionRpcError(grpc.RpcError):
    """A failed request, as a unary call's RpcError would describe it."""

    def __init__(self, code: grpc.StatusCode, details: str,
                 trailing: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details
        self._trailing = trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._trailing


def error_of(answer: kv_pb2.SessionError) -> SessionRpcError:
    trailing = [("kv-outcome", answer.outcome)] if answer.outcome else []
    if answer.leader_id or answer.leader_address:
        trailing += [("leader-id", answer.leader_id), ("leader-address", answer.leader_address)]
    return SessionRpcError(_CODES.get(answer.code, grpc.StatusCode.UNKNOWN), answer.message,
                           tuple(trailing))


class Session:
    """One Session stream to one node; safe to share between threads."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._requests: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._pending: dict[int, Future[kv_pb2.SessionResponse]] = {}
        self._lock = threading.Lock()
        self._seq = itertools.count(1)
        self.failure: grpc.RpcError | None = None  # set once the stream is broken
        self._sender: threading.Thread | None = None  # gRPC's thread that reads our frames
        rpc = channel.stream_stream("/manyasone.kv.KV/Session", request_serializer=None,
                                    response_deserializer=None)
        self._call: grpc.Call | None = rpc(self._frames())
        self._reader = threading.Thread(target=self._read, name="kv-session", daemon=True)
        self._reader.start()

    def _frames(self) -> Iterator[bytes]:
        # Runs on the thread gRPC starts to send our requests; close() joins that thread.
        self._sender = threading.current_thread()
        yield from iter(self._requests.get, _END)

    def _read(self) -> None:
        error: grpc.RpcError
        call = self._call
        assert call is not None
        try:
            for raw in call:
                answer = kv_pb2.SessionResponse.FromString(raw)
                with self._lock:
                    future = self._pending.pop(answer.seq, None)
                if future is not None:
                    future.set_result(answer)
            error = SessionRpcError(grpc.StatusCode.UNAVAILABLE, "the node ended the session")
        except grpc.RpcError as exc:
            # gRPC raises the call itself, whose traceback holds the call: a reference cycle
            # that only the collector breaks, perhaps at interpreter exit, where the call's
            # __del__ waits on a lock a frozen gRPC daemon thread may hold, and the process
            # hangs after its last line. So: a copy of the error, and the cycle cut.
            error = SessionRpcError(exc.code(), exc.details() or "",
                                    tuple(exc.trailing_metadata() or ()))
            exc.with_traceback(None)
        del call
        with self._lock:
            self.failure = error
            pending, self._pending = self._pending, {}
        # Let gRPC's thread that reads our request iterator finish too (it would otherwise
        # wait on the queue for as long as the process lives).
        self._requests.put(_END)
        for future in pending.values():
            future.set_exception(error)

    def call(self, frame: kv_pb2.SessionRequest, timeout_s: float) -> kv_pb2.SessionResponse:
        """The node's answer to `frame` (its seq is set here); raises grpc.RpcError."""
        future: Future[kv_pb2.SessionResponse] = Future()
        with self._lock:
            if self.failure is not None:
                raise self.failure
            seq = next(self._seq)
            self._pending[seq] = future
        frame.seq = seq
        frame.timeout_ms = max(1, int(timeout_s * 1000))
        self._requests.put(frame.SerializeToString())
        try:
            return future.result(timeout_s)
        except FutureTimeout:
            with self._lock:
                self._pending.pop(seq, None)
            raise SessionRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None

    def close(self) -> None:
        """End the stream and wait (a bounded time) for the threads that serve it, so that
        the call is released here, while every thread still runs, and not at exit."""
        self._requests.put(_END)
        if self._call is not None:
            self._call.cancel()
        for thread in (self._reader, self._sender):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=2.0)
        if not self._reader.is_alive():
            self._call = None
