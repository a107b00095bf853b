"""Sans-I/O Raft: a deterministic state machine per node, and the simulator that drives it."""
