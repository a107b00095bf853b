"""The Raft core and the KV state machine are pure: no sockets, threads, clocks,
asyncio or global randomness. These tests read the source and fail on any such import,
so purity is checked by the suite rather than promised in a comment."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Modules that must stay pure. The simulator is pure too: its time is ticks and its
# randomness a seeded random.Random instance passed around explicitly.
PURE_MODULES = sorted(
    [p for p in (ROOT / "system" / "raft").glob("*.py") if p.name != "__main__.py"]
    + [p for p in [ROOT / "system" / "kv" / "state_machine.py"] if p.exists()]
)

FORBIDDEN_MODULES = {
    "socket", "time", "threading", "asyncio", "multiprocessing", "subprocess",
    "selectors", "concurrent", "grpc", "datetime", "os", "signal", "secrets", "uuid",
}


def forbidden_uses(source: str) -> list[str]:
    """Names of forbidden imports and of global-randomness calls in `source`."""
    problems: list[str] = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in FORBIDDEN_MODULES:
                    problems.append(f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            top = node.module.split(".")[0]
            if top in FORBIDDEN_MODULES:
                problems.append(f"from {node.module} import ...")
            if top == "random" and any(a.name != "Random" for a in node.names):
                problems.append(f"from random import {', '.join(a.name for a in node.names)}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "random"
            and node.func.attr != "Random"
        ):
            # random.random(), random.choice(...): the hidden global generator.
            problems.append(f"random.{node.func.attr}() uses the global generator")
    return problems


def test_there_are_pure_modules_to_check() -> None:
    assert PURE_MODULES, "no Raft core modules found under system/raft"


@pytest.mark.parametrize("path", PURE_MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_pure(path: Path) -> None:
    assert forbidden_uses(path.read_text()) == []


def test_scanner_catches_impurities() -> None:
    """The scan itself must be able to fail."""
    bad = "import time\nfrom threading import Lock\nimport random\nx = random.choice([1])\n"
    assert forbidden_uses(bad) == [
        "import time",
        "from threading import ...",
        "random.choice() uses the global generator",
    ]
    assert forbidden_uses("import random\nrng = random.Random(7)\n") == []
