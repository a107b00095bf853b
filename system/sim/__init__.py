"""The deterministic simulator: Raft cores and the store's state machine over a fake network
and fake disks, driven one event at a time from one seed.

It lives outside `system/raft/` because it runs the store's replicated state machine
(`system/kv/state_machine.py`), and the Raft core must never import the store. Modules, one
job each: `disk` (fake durable storage), `network` (messages in flight, cut links),
`clients` (client operations and attempts), `shell` (the node shell around a core),
`variant` (which core/shell/state machine a run uses), `simulation` (the `Simulation` a
test drives), `invariants` (the safety monitor), `history` (client history and its
conversion to the checker's records), `swarm` (one randomized seed), `cli`
(`python -m system.sim`).
"""
