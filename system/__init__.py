"""The system under test: the Raft core, the replicated key-value store and the trainer."""
