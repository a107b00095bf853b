#!/usr/bin/env bash
# Setup for the key-value benchmark (benchmarks/kv_bench.py): installs the two peers it
# measures our store against. Idempotent: a second run changes nothing.
#
#   etcd       Debian's etcd-server package (bookworm: etcd 3.4.23). It ships only the
#              `etcd` daemon; `etcdctl` is in the separate etcd-client package, which the
#              benchmark does not need (it asks etcd for its leader over gRPC).
#   PySyncObj  from PyPI, pinned to the 0.3 line the reference figures were taken with.
#   py-spy     from PyPI: samples our leader from outside for the report's profile section.
#
# Needs root (apt-get). Never starts a service: the benchmark starts its own etcd members
# on loopback ports in a temporary directory and stops them when it ends.
set -euo pipefail

if ! command -v etcd >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    # The package lists may be missing or old on a fresh machine; refresh them only when
    # the package is not known yet.
    if ! apt-cache show etcd-server >/dev/null 2>&1; then
        apt-get update
    fi
    apt-get install -y --no-install-recommends etcd-server
fi
# Debian's package may enable a system etcd on 127.0.0.1:2379; the benchmark never uses it
# (it picks free ports), but a running one would take memory and CPU from the measurement.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet etcd 2>/dev/null; then
    echo "setup_kv_bench: stopping the system etcd service (the benchmark runs its own)" >&2
    systemctl stop etcd || true
fi
etcd --version | head -n 1

if ! python -c 'import pysyncobj' >/dev/null 2>&1; then
    python -m pip install --quiet "pysyncobj>=0.3.12,<0.4"
fi
python -c 'import pysyncobj, importlib.metadata as m; print("pysyncobj", m.version("pysyncobj"))'

if ! command -v py-spy >/dev/null 2>&1; then
    python -m pip install --quiet "py-spy>=0.4,<0.5"
fi
py-spy --version
