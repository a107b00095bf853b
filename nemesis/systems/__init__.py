"""Systems under test, by the name `python -m nemesis run --system NAME` takes.

Each entry maps a name to "module:Class", imported only when that system is asked for (a
system's client libraries need not be installed to run another). Adding a system is one
module under nemesis/systems/ and one line here (docs/systems.md).
"""

from __future__ import annotations

import importlib

from nemesis.systems.base import System

SYSTEMS: dict[str, str] = {
    "store": "nemesis.systems.store:StoreSystem",  # our Raft KV store (system/kv)
    "etcd": "nemesis.systems.etcd:EtcdSystem",  # etcd 3.4 (Debian etcd-server)
}
DEFAULT = "store"


class UnknownSystem(ValueError):
    """A name not in SYSTEMS; the message is one line listing the choices."""


def get_system(name: str) -> System:
    """A new instance of the system called `name`."""
    target = SYSTEMS.get(name)
    if target is None:
        raise UnknownSystem(f"unknown system {name!r}; choose one of: {', '.join(SYSTEMS)}")
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)()
