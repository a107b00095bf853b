"""The simulator's fake network: messages in flight, in send order, and the cut links.

What it is for: the simulation (and a test) chooses which message is delivered, lost,
duplicated or held; nothing moves by itself. What it must never do: iterate anything in an
order that is not deterministic (links are a set used for membership only).
"""

from __future__ import annotations

from dataclasses import dataclass

from system.raft.messages import Message
from system.raft.types import NodeId


@dataclass(frozen=True, slots=True)
class InFlight:
    """A message on the wire. `id` is unique in a run and names it in tests and traces."""

    id: int
    message: Message
    sent_step: int


def describe(message: Message) -> str:
    """A short, deterministic, human-readable rendering of a message."""
    m = message
    parts = [f"{m.type.value} {m.src}->{m.dst} t{m.term}"]
    if m.index or m.log_term:
        parts.append(f"i{m.index} lt{m.log_term}")
    if m.entries:
        parts.append(f"entries[{m.entries[0].index}..{m.entries[-1].index}]")
    if m.commit:
        parts.append(f"c{m.commit}")
    if m.reject:
        parts.append(f"REJECT hint{m.reject_hint}/{m.reject_term}")
    if m.context:
        parts.append(f"ctx={m.context.hex()}")
    if m.snapshot is not None:
        parts.append(f"snap({m.snapshot.index},{m.snapshot.term}) off{m.offset}+{len(m.data)}")
    if m.done:
        parts.append("done")
    return " ".join(parts)


class FakeNetwork:
    """Messages in flight, in send order, plus the set of cut (src, dst) links."""

    def __init__(self) -> None:
        self.in_flight: dict[int, InFlight] = {}  # insertion-ordered: oldest first
        self.cut_links: set[tuple[NodeId, NodeId]] = set()  # membership only, never iterated
        self.held: set[int] = set()  # ids the default schedule skips until released
        self.next_id = 1

    def add(self, message: Message, step: int) -> InFlight:
        flight = InFlight(self.next_id, message, step)
        self.next_id += 1
        self.in_flight[flight.id] = flight
        return flight

    def is_cut(self, src: NodeId, dst: NodeId) -> bool:
        return (src, dst) in self.cut_links


