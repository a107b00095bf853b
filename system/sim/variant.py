"""Which core, node shell and state machine a simulation runs.

What it is for: the default is the real thing; tests (tests/raft/broken.py) and the store's
canaries (system/sim/unsafe.py) pass deliberately broken subclasses to show that a safety
check can fail. Broken code is passed in, never switched on by flags in the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from system.kv.state_machine import KVStateMachine
from system.raft.core import RaftCore

if TYPE_CHECKING:
    from system.sim.shell import NodeShell


@dataclass(frozen=True)
class SimVariant:
    """The classes a simulation is built from. The default is the real thing; tests pass
    deliberately broken subclasses to show that a safety test can fail."""

    name: str = "correct"
    core_class: type[RaftCore] = RaftCore
    shell_class: type[NodeShell] | None = None  # None: NodeShell
    state_machine_class: type[KVStateMachine] = KVStateMachine
    description: str = "the real core, shell and state machine (the store's own)"


