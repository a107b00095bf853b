"""Systems under test, by the name `python -m nemesis run --system NAME` takes.

Each entry maps a name to "module:Class", imported only when that system is asked for (a
system's client libraries need not be installed to run another). Adding a system is one
module under nemesis/systems/ and one line here (docs/systems.md) — or no line at all:
`--system mypackage.mydb:MyDb` names a System subclass in any importable module, so a
user's system can live in their own repository.
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
    """A name not in SYSTEMS, or a "module:Class" that does not name a System; the message
    is one line saying which and what to give instead."""


def get_system(name: str) -> System:
    """A new instance of the system called `name`: a name in SYSTEMS, or "module:Class"."""
    target = SYSTEMS.get(name)
    if target is None and ":" not in name:
        raise UnknownSystem(f"unknown system {name!r}; choose one of: {', '.join(SYSTEMS)}, "
                            f"or give module:Class of your own System (docs/systems.md)")
    module_name, _, cls_name = (target or name).partition(":")
    if target is None:  # the user's own: every way it can be wrong gets one line
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise UnknownSystem(f"--system {name}: cannot import {module_name!r} ({exc}); "
                                f"is it on PYTHONPATH?") from None
        cls = getattr(module, cls_name, None)
        if not (isinstance(cls, type) and issubclass(cls, System)):
            what = "no such name" if cls is None else f"a {type(cls).__name__}"
            raise UnknownSystem(f"--system {name}: {module_name}.{cls_name} is {what}, not a "
                                f"subclass of nemesis.systems.base.System")
        return cls()
    return getattr(importlib.import_module(module_name), cls_name)()
