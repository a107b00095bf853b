"""The replicated key-value store: state machine, durable storage, gRPC node and client."""
