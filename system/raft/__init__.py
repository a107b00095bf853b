"""Sans-I/O Raft: a deterministic state machine per node (the simulator that drives it is system/sim)."""
