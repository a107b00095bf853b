"""The simulator's client operations: one logical operation, its attempts and its outcome.

What it is for: a client operation keeps Jepsen's model (one invoke, at most one
completion: ok, fail or info) across any number of attempts on different nodes, all with
the same request id, so retries and unknown outcomes can be simulated exactly. What it
must never do: complete an operation twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from system.raft.types import NodeId
from system.sim.history import Function


class AttemptState(Enum):
    WAITING = "waiting"  # the node holds it; no answer yet
    REFUSED = "refused"  # certainly never takes effect (not leader, overwritten, ...)
    ANSWERED = "answered"
    UNKNOWN = "unknown"  # the node crashed or the client stopped waiting: it may still apply


@dataclass
class Attempt:
    """One submission of a client operation to one node (retries make more)."""

    node: NodeId
    step: int
    state: AttemptState = AttemptState.WAITING
    index: int = 0  # writes: the proposed entry's index
    term: int = 0  # writes: the proposed entry's term
    context: bytes = b""  # linearizable reads: the ReadIndex id
    reason: str = ""
    leader_hint: NodeId | None = None  # NotLeader: the leader the node knows of


class OpStatus(Enum):
    OPEN = "open"
    OK = "ok"
    FAIL = "fail"
    INFO = "info"


@dataclass
class ClientOp:
    """One logical client operation: one invoke, at most one completion, any number of
    attempts, all carrying the same request id."""

    id: int
    process: int
    f: Function
    key: str
    value: str | None  # put/cas: the value to write (None for get and delete)
    expected_version: int | None  # cas and conditional delete only
    request_id: str
    stale: bool  # get only: serve from local state, no ReadIndex barrier
    retry_on_refusal: bool  # driven clients retry; hand-driven ops fail at once
    invoked_step: int
    attempts: list[Attempt] = field(default_factory=list)
    status: OpStatus = OpStatus.OPEN
    result_value: str | None = None
    result_version: int | None = None
    answered_by: NodeId = ""
    error: str = ""
    # Writes answered by a state machine: True applied, False a CAS whose expected version
    # did not match (result_version is the key's version then); None otherwise.
    applied: bool | None = None
    # A get's answer: the answering node's applied index when it read its state (the
    # harness's end-of-run replica check compares nodes by it).
    result_applied_index: int | None = None

    @property
    def done(self) -> bool:
        return self.status is not OpStatus.OPEN

    @property
    def ok(self) -> bool:
        return self.status is OpStatus.OK

    def waiting(self) -> bool:
        return any(a.state is AttemptState.WAITING for a in self.attempts)

    def maybe_applied(self) -> bool:
        return any(
            a.state in (AttemptState.WAITING, AttemptState.UNKNOWN) for a in self.attempts
        )


