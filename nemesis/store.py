"""Run folders: `store/<workload>/<timestamp>/`, and `store/latest` pointing at the newest.

A run folder holds everything needed to understand and re-check a run without its cluster:

    test.json       the command line, the configuration, the seed, platform, versions
    history.jsonl   every client operation and nemesis event (docs/histories.md)
    nemesis.jsonl   the nemesis events alone, with wall-clock time
    nodes/          every node's log (nX.log, JSON lines) and what it printed (nX.stderr)
    harness.log     what the harness itself logged
    results.json    the checkers' verdicts and evidence, and the run's counts
    timeline.html   the counterexample drawn as a timeline (when a check fails)

Must never overwrite a previous run: the timestamp is made unique.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import subprocess
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


def new_run_dir(store: Path, workload: str, point_latest: bool = True) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%dT%H%M%S")
    base = store / workload
    base.mkdir(parents=True, exist_ok=True)
    for n in range(1000):
        path = base / (stamp if n == 0 else f"{stamp}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        if point_latest:
            _point_latest(store, path)
        return path
    raise RuntimeError(f"could not create a unique run folder under {base}")


def store_problem(store: Path, workload: str) -> str | None:
    """Why run folders cannot be made under `store` (one line for the user), or None.
    Checked before anything starts, so a bad --store never costs a cluster start."""
    base = store / workload
    try:
        base.mkdir(parents=True, exist_ok=True)
        probe = base / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        where = exc.filename or base
        return (f"cannot keep runs under --store {store}: {where}: "
                f"{exc.strerror or type(exc).__name__}; give a writable folder with --store DIR")
    return None


def _point_latest(store: Path, run_dir: Path) -> None:
    latest = store / "latest"
    tmp = store / f".latest-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    tmp.symlink_to(run_dir.relative_to(store))
    os.replace(tmp, latest)


def write_json(path: Path, payload: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def source_version() -> str:
    """The git commit of the harness (with -dirty), or 'unknown' outside a checkout."""
    try:
        commit = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--",
                                "system", "nemesis", "workloads", "checker", "histories"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
