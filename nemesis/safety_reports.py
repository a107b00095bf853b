"""Lines in which a node reports a broken safety property, gathered into the history.

The store's Raft core notices some broken rules itself — a follower whose committed log
conflicts with its leader's, a leader told so (docs/raft.md, "A follower whose committed
log diverged") — then repairs the node and goes on. A repaired divergence leaves no wrong
answer in the history, so the node's own report is the evidence. The node logs each such
line with a `safety` field naming the property (system/kv/node.py); after the run's last
reads the harness copies the node logs, and records one `safety-report` event per node
and line (`node`, `rule`, `text`, `logged_at`) for `checker/safety_reports.py` to judge.
Any system whose nodes log JSON lines with a `safety` field is read the same way.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

MAX_REPORTS = 50  # per run: the first ones say what broke, the rest repeat it


def scan(log_dir: Path) -> list[dict[str, Any]]:
    """Every distinct (node, text) reported in `log_dir/*.log`, oldest first."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(log_dir.glob("*.log")):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if '"safety"' not in line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict) or not record.get("safety"):
                continue
            node = str(record.get("node") or path.stem)
            message = str(record.get("msg") or "")
            found.setdefault((node, message), {
                "node": node, "rule": str(record["safety"]), "text": message,
                "logged_at": record.get("ts")})
    return sorted(found.values(), key=lambda r: str(r["logged_at"]))[:MAX_REPORTS]


def record_all(reports: list[dict[str, Any]], record, now: float | None = None) -> None:  # noqa: ANN001 - record(f, value)
    """One `safety-report` event each. `age_s`: how long before this record the node
    logged it (from `logged_at`; 0 when unknown), so the first-violation time can be the
    node's, not the moment the harness read the logs."""
    now = time.time() if now is None else now
    for report in reports:
        record("safety-report", {
            "fault": "safety", "phase": "step", "nodes": [report["node"]], **report,
            "age_s": _age_s(report.get("logged_at"), now),
            "description": f"{report['node']} reports {report['rule']}: {report['text']}"})


def _age_s(logged_at: object, now: float) -> float:
    if not isinstance(logged_at, str):
        return 0.0
    try:
        stamp = datetime.fromisoformat(logged_at).timestamp()
    except ValueError:
        return 0.0
    return round(max(0.0, now - stamp), 3)
