"""The Raft core and the KV state machine are pure: no sockets, threads, clocks,
asyncio or global randomness. These tests read the source and fail on any such import,
so purity is checked by the suite rather than promised in a comment."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Modules that must stay pure. The simulator is pure too: its time is ticks and its
# randomness a seeded random.Random instance passed around explicitly (its command line,
# system/sim/cli.py, prints and writes files; the shrinker, system/sim/shrink.py, keeps a
# CPU-time budget: the two exceptions).
RAFT_MODULES = sorted(p for p in (ROOT / "system" / "raft").glob("*.py") if p.name != "__main__.py")
PURE_MODULES = sorted(
    RAFT_MODULES
    + [p for p in (ROOT / "system" / "sim").glob("*.py")
       if p.name not in ("__main__.py", "cli.py", "shrink.py")]
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


def imported_modules(source: str) -> list[str]:
    """Every module name `source` imports (absolute imports)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


@pytest.mark.parametrize("path", RAFT_MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_raft_core_never_imports_the_store_or_the_simulator(path: Path) -> None:
    """The core is a library of its own: the store and the simulator import it, never the
    reverse (the simulator runs the store's state machine, so it lives in system/sim)."""
    assert [m for m in imported_modules(path.read_text())
            if m.startswith(("system.kv", "system.sim", "system.trainer"))] == []


def test_import_scan_can_fail() -> None:
    assert imported_modules("from system.kv.state_machine import KVStateMachine\n") == [
        "system.kv.state_machine"]


# The system under test never depends on the harness that tests it (docs/ARCHITECTURE's
# layering: nemesis, workloads and checker import system, never the reverse).
HARNESS_PACKAGES = ("nemesis", "checker", "workloads")
SYSTEM_FILES = sorted((ROOT / "system").rglob("*.py"))
# The one exception, an entry point nothing imports: `python -m system.sim` (a documented
# command) is where the simulator meets the checker that decides its runs; everything it
# runs takes that checker as an argument (`check`).
ENTRY_POINT_IMPORTS = {"system/sim/__main__.py": ["checker"],
                       # `python -m system.trainer run --hosts FILE` reaches other machines
                       # through the harness's SSH platform (nemesis/trainer_hosts.py).
                       "system/trainer/__main__.py": ["nemesis.trainer_hosts"]}


def harness_imports(source: str) -> list[str]:
    """The harness modules `source` imports anywhere (top level, inside functions, by name
    through importlib.import_module / __import__ with a literal)."""
    names = imported_modules(source)
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                     or (isinstance(node.func, ast.Name) and node.func.id == "__import__"))):
            names.append(node.args[0].value)
    return [name for name in names if name.split(".")[0] in HARNESS_PACKAGES]


@pytest.mark.parametrize("path", SYSTEM_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_system_never_imports_the_harness(path: Path) -> None:
    allowed = ENTRY_POINT_IMPORTS.get(str(path.relative_to(ROOT)), [])
    assert harness_imports(path.read_text()) == allowed


def test_harness_import_scan_can_fail() -> None:
    source = ("import checker\n"
              "def cluster():\n"
              "    from nemesis.platforms.local_cluster import LocalCluster\n"
              "    import importlib; importlib.import_module('workloads.kv')\n"
              "from system.kv import client\n")
    assert harness_imports(source) == ["checker", "nemesis.platforms.local_cluster", "workloads.kv"]


def test_importing_every_system_module_loads_no_harness_module() -> None:
    """The same at run time: a fresh interpreter imports every module under system/ (but
    the `python -m` entry points, which run when imported) and then holds none of the
    harness's packages."""
    code = (
        "import importlib, pathlib, sys\n"
        "for path in sorted(pathlib.Path('system').rglob('*.py')):\n"
        "    if path.name == '__main__.py':\n"
        "        continue\n"
        "    parts = path.with_suffix('').parts\n"
        "    importlib.import_module('.'.join(parts[:-1] if parts[-1] == '__init__' else parts))\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HARNESS_PACKAGES!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
