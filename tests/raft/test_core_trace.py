"""A scripted interaction, etcd-style: the full message trace of an election and one
write in a healthy 3-node cluster, compared line by line with the expected transcript.

It pins down the protocol as a reader would check it against the paper: PreVote at
term+1 before the real vote (thesis §9.6), the NOOP of the new term (§8) committed by a
majority before anything else, commit indexes travelling on the next APPEND, and every
node applying entries only after the leader says they are committed. A change in the
core's wire behaviour shows up here as a readable diff.
"""

from __future__ import annotations

import random

from system.raft.core import RaftConfig, RaftCore
from system.raft.messages import Message, MessageType

MT = MessageType

EXPECTED = """
a->b pre_vote t1 last/prev=(0,0)
a->c pre_vote t1 last/prev=(0,0)
b->a pre_vote_response t1
c->a pre_vote_response t1
a->b vote t1 last/prev=(0,0)
a->c vote t1 last/prev=(0,0)
b->a vote_response t1
c->a vote_response t1
a->b append t1 last/prev=(0,0) entries=1@1(noop) commit=0
a->c append t1 last/prev=(0,0) entries=1@1(noop) commit=0
b->a append_response t1 index=1
c->a append_response t1 index=1
a applies 1@1
a->b append t1 last/prev=(1,1) commit=1
a->c append t1 last/prev=(1,1) commit=1
b applies 1@1
c applies 1@1
b->a append_response t1 index=1
c->a append_response t1 index=1
a->b append t1 last/prev=(1,1) entries=2@1 commit=1
a->c append t1 last/prev=(1,1) entries=2@1 commit=1
b->a append_response t1 index=2
c->a append_response t1 index=2
a applies 2@1
a->b append t1 last/prev=(2,1) commit=2
a->c append t1 last/prev=(2,1) commit=2
b applies 2@1
c applies 2@1
b->a append_response t1 index=2
c->a append_response t1 index=2
"""


def describe(m: Message) -> str:
    parts = [f"{m.src}->{m.dst} {m.type.value} t{m.term}"]
    if m.type in (MT.PRE_VOTE, MT.VOTE, MT.APPEND):
        parts.append(f"last/prev=({m.index},{m.log_term})")
    if m.entries:
        parts.append(
            "entries="
            + ",".join(f"{e.index}@{e.term}{'' if e.data else '(noop)'}" for e in m.entries)
        )
    if m.type in (MT.APPEND, MT.HEARTBEAT):
        parts.append(f"commit={m.commit}")
    if m.type is MT.APPEND_RESPONSE:
        parts.append(f"index={m.index}")
    if m.reject:
        parts.append("REJECT")
    return " ".join(parts)


def test_election_and_one_write_produce_exactly_the_expected_messages() -> None:
    ids = ("a", "b", "c")
    nodes = {i: RaftCore(RaftConfig(i, ids), random.Random(n)) for n, i in enumerate(ids)}
    lines: list[str] = []

    def take_readies() -> list[Message]:
        outbox: list[Message] = []
        for node_id, node in nodes.items():
            while node.has_ready():
                ready = node.ready()
                outbox.extend(ready.messages)
                lines.extend(
                    f"{node_id} applies {e.index}@{e.term}" for e in ready.committed_entries
                )
                node.advance(ready)
        return outbox

    def run_until_quiet() -> None:
        outbox = take_readies()
        while outbox:
            for m in outbox:
                lines.append(describe(m))
                nodes[m.dst].step(m)
            outbox = take_readies()

    a = nodes["a"]
    for _ in range(a.randomized_election_timeout):  # a's election timer fires first
        a.tick()
    run_until_quiet()
    assert a.propose(b"x") == (2, 1)
    run_until_quiet()
    assert "\n".join(lines) == EXPECTED.strip("\n")
