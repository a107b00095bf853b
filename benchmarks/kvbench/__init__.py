"""The key-value benchmark's parts: cluster targets (ours, etcd, PySyncObj), their clients,
the load generator and the report. `benchmarks/kv_bench.py` is the one command that runs it.

Nothing here is imported by the store itself, and nothing here may talk to anything but
loopback addresses.
"""
