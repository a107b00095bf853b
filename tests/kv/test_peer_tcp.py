"""The TCP peer transport (system/kv/peer_tcp.py): frames survive any split of the byte
stream, a stranger's bytes close its connection without reaching the node, a sender
reconnects to a restarted peer, and a lane written in `flush` needs no task wake-up.

Real sockets on 127.0.0.1 inside one event loop; every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from system.kv.peer_tcp import MAGIC, MAX_FRAME_BYTES, TcpPeerSender, serve_peers
from system.kv.transport import Transport, encode_batch
from system.ports import free_ports
from system.raft.messages import Message, MessageType
from system.raft.types import Entry

APPEND = MessageType.APPEND


def append(index: int, data: bytes = b"v", dst: str = "n2") -> Message:
    return Message(APPEND, "n1", dst, 3, log_term=3, index=index - 1,
                   entries=(Entry(term=3, index=index, data=data),), commit=index - 1)


def frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


async def wait_for(condition, what: str, timeout_s: float = 5.0) -> None:  # noqa: ANN001
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


class Receiver:
    """A peer listener on a free port that records what it delivers."""

    def __init__(self, known: tuple[str, ...] = ("n1",)) -> None:
        self.known = known
        self.delivered: list[Message] = []
        (port,) = free_ports(1)
        self.address = f"127.0.0.1:{port}"
        self.listener = None

    async def __aenter__(self) -> Receiver:
        self.listener = await serve_peers(self.address, "n2", self.known.__contains__,
                                          self.delivered.extend)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.listener.close()


async def raw_connection(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, _, port = address.rpartition(":")
    return await asyncio.open_connection(host, int(port))


async def closed_by_peer(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(1), 5.0) == b""


def test_frames_split_at_every_byte_and_run_together_are_all_delivered_in_order() -> None:
    messages = [append(i, data=bytes([i]) * (i * 37)) for i in range(2, 9)]
    stream = MAGIC + b"".join(frame(encode_batch("n1", [m])) for m in messages)

    async def scenario() -> list[Message]:
        async with Receiver() as receiver:
            _, writer = await raw_connection(receiver.address)
            for i in range(0, len(stream), 3):  # 3-byte pieces: every boundary split
                writer.write(stream[i:i + 3])
                await writer.drain()
            await wait_for(lambda: len(receiver.delivered) == len(messages), "every frame")
            writer.close()
            return receiver.delivered

    assert asyncio.run(scenario()) == messages


@pytest.mark.parametrize(("garbage", "why"), [
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "a gRPC client at the peer port"),
    (MAGIC + (MAX_FRAME_BYTES + 1).to_bytes(4, "big"), "a frame larger than the limit"),
    (MAGIC + frame(b"\xff\xff\xff\xff not protobuf"), "a frame that is not a MessageBatch"),
    (MAGIC + frame(encode_batch("n9", [append(2)])), "a batch from a node it does not know"),
])
def test_a_strangers_bytes_close_the_connection_and_reach_nothing(garbage: bytes, why: str) -> None:
    async def scenario() -> tuple[bool, list[Message]]:
        async with Receiver() as receiver:
            reader, writer = await raw_connection(receiver.address)
            writer.write(garbage)
            await writer.drain()
            closed = await closed_by_peer(reader)
            writer.close()
            # The listener still serves a real peer afterwards.
            _, good = await raw_connection(receiver.address)
            good.write(MAGIC + frame(encode_batch("n1", [append(2)])))
            await wait_for(lambda: receiver.delivered, "a good peer's batch after the bad one")
            good.close()
            return closed, receiver.delivered

    closed, delivered = asyncio.run(scenario())
    assert closed, why
    assert delivered == [append(2)]


def test_a_misrouted_message_is_dropped_and_the_rest_of_its_batch_delivered() -> None:
    async def scenario() -> list[Message]:
        async with Receiver() as receiver:
            _, writer = await raw_connection(receiver.address)
            writer.write(MAGIC + frame(encode_batch("n1", [append(2, dst="n3"), append(3)])))
            await wait_for(lambda: receiver.delivered, "the batch")
            writer.close()
            return receiver.delivered

    assert asyncio.run(scenario()) == [append(3)]


async def send_until_delivered(sender: TcpPeerSender, receiver: Receiver, indexes: range) -> None:
    """Send one APPEND every 20 ms until one gets through (the sender is backing off)."""
    for index in indexes:
        sender.enqueue(append(index))
        sender.flush()
        await asyncio.sleep(0.02)
        if receiver.delivered:
            return
    await wait_for(lambda: receiver.delivered, "a batch on a new connection")


def test_a_sender_reconnects_to_a_restarted_peer_and_drops_what_it_could_not_send() -> None:
    async def scenario() -> tuple[list[Message], int]:
        receiver = Receiver()
        sender = TcpPeerSender("n1", "n2", receiver.address)
        sender.start()
        try:
            sender.enqueue(append(2))  # nobody listens yet: dropped, the task backs off
            sender.flush()
            await wait_for(lambda: sender.dropped_messages >= 1, "the first batch dropped")
            async with receiver:
                await send_until_delivered(sender, receiver, range(3, 50))
            delivered = list(receiver.delivered)
            async with receiver:  # the peer restarts on the same address
                receiver.delivered.clear()
                await send_until_delivered(sender, receiver, range(50, 100))
            return delivered, sender.dropped_messages
        finally:
            await sender.close()

    delivered, dropped = asyncio.run(scenario())
    assert delivered and all(m.type is APPEND for m in delivered)
    assert dropped >= 1


def test_a_connected_lane_writes_in_flush_without_its_task() -> None:
    """Shown to matter: the node skips its yield before an inline fsync only when no lane
    holds messages (Transport.has_queued), so a TCP lane must empty its queue in flush."""
    async def scenario() -> tuple[bool, bool, list[Message]]:
        async with Receiver() as receiver:
            transport = Transport("n1", {"n2": "127.0.0.1:1"}, tcp_links={"n2": receiver.address})
            transport.start()
            try:
                transport.send([append(2)])  # not connected yet: left to the task
                queued_before_connect = transport.has_queued()
                await wait_for(lambda: receiver.delivered, "the first batch")
                transport.send([append(3)])  # connected: written here, nothing queued
                queued_after = transport.has_queued()
                await wait_for(lambda: len(receiver.delivered) == 2, "the second batch")
                return queued_before_connect, queued_after, receiver.delivered
            finally:
                await transport.close()

    queued_before, queued_after, delivered = asyncio.run(scenario())
    assert queued_before and not queued_after
    assert delivered == [append(2), append(3)]


def test_the_listener_refuses_a_port_in_use_with_what_to_do() -> None:
    async def scenario() -> str:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen(1)
            address = f"127.0.0.1:{taken.getsockname()[1]}"
            with pytest.raises(OSError) as err:
                await serve_peers(address, "n2", lambda _: True, lambda _: None)
            return str(err.value)

    message = asyncio.run(scenario())
    assert "cannot listen for peers on" in message and "--peer-listen" in message



def test_a_members_recorded_info_gives_its_peer_port_and_old_entries_still_read() -> None:
    from system.kv.node import member_info, split_member_info

    assert split_member_info(member_info("h:1", "h:2")) == ("h:1", "h:2")
    assert split_member_info("h:1") == ("h:1", ""), "an entry from before peer ports"
    assert split_member_info("") == ("", "")


def test_a_link_from_the_command_line_wins_over_one_from_the_membership() -> None:
    async def scenario() -> dict[str, str]:
        transport = Transport("n1", {"n2": "h:1"}, tcp_links={"n2": "route:9"})
        transport.set_peer("n2", "h:1", "h:2")
        transport.set_peer("n3", "h:3", "h:4")
        transport.set_peer("n4", "h:5")
        seen = transport.describe()
        transport.set_peer("n3", "h:3")  # re-added without a peer address: back to gRPC
        seen["n3 re-added"] = transport.describe()["n3"]
        await transport.close()
        return seen

    assert asyncio.run(scenario()) == {"n2": "tcp route:9", "n3": "tcp h:4", "n4": "grpc h:5",
                                       "n3 re-added": "grpc h:3"}
