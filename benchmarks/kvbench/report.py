"""The key-value benchmark's results: figures per system and row, the side-by-side table with
the ratios ours/etcd and ours/PySyncObj, and the issue's targets marked reached or not.

Pure formatting: it never measures anything and never reads a clock.
"""

from __future__ import annotations

import enum
import statistics
from dataclasses import dataclass, field

from tabulate import tabulate

from benchmarks.kvbench.profiling import Profile


class Better(enum.Enum):
    HIGHER = "higher"
    LOWER = "lower"


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    better: Better
    digits: int = 0


# The rows of the table, in order. Keys are what the runner records under.
ROWS: tuple[Row, ...] = (
    Row("put_1_ops", "put ops/s, 1 client, 256 B values", Better.HIGHER),
    Row("put_1_p50", "put p50 ms, 1 client", Better.LOWER, 2),
    Row("put_1_p99", "put p99 ms, 1 client", Better.LOWER, 2),
    Row("put_16_ops", "put ops/s, 16 clients", Better.HIGHER),
    Row("put_16_p50", "put p50 ms, 16 clients", Better.LOWER, 2),
    Row("put_16_p99", "put p99 ms, 16 clients", Better.LOWER, 2),
    Row("put_64_ops", "put ops/s, 64 clients", Better.HIGHER),
    Row("put_64_p50", "put p50 ms, 64 clients", Better.LOWER, 2),
    Row("put_64_p99", "put p99 ms, 64 clients", Better.LOWER, 2),
    Row("get_linearizable_64_ops", "linearizable get ops/s, 64 clients", Better.HIGHER),
    Row("get_stale_64_ops", "stale get ops/s, 64 clients", Better.HIGHER),
    Row("put_1_cpu", "members' CPU ms per put, 1 client (all three)", Better.LOWER, 3),
    Row("put_16_cpu", "members' CPU ms per put, 16 clients", Better.LOWER, 3),
    Row("put_64_cpu", "members' CPU ms per put, 64 clients", Better.LOWER, 3),
    Row("get_linearizable_64_cpu", "members' CPU ms per linearizable get, 64 clients", Better.LOWER, 3),
    Row("get_stale_64_cpu", "members' CPU ms per stale get, 64 clients", Better.LOWER, 3),
    Row("put_1mib_mbps", "1 MiB puts, MB/s, 4 clients", Better.HIGHER, 1),
    Row("put_1mib_rss_mb", "peak RSS of the largest member in the 1 MiB row, MB", Better.LOWER),
    Row("put_1mib_rss_growth", "RSS growth of that member per MiB acknowledged, MB", Better.LOWER, 2),
    Row("failover_s", "SIGKILL leader -> first acked write, s (median)", Better.LOWER, 2),
)


@dataclass(frozen=True)
class Goal:
    """A goal from the issue, as a ratio of our figure to a peer's, measured in one run."""

    label: str
    row_key: str
    peer: str
    limit_ratio: float
    better: Better


GOALS: tuple[Goal, ...] = (
    # Issue 14 (the request path).
    Goal("put ops/s at 64 clients >= 0.7x etcd", "put_64_ops", "etcd", 0.7, Better.HIGHER),
    Goal("put p99 at 64 clients <= 2x etcd", "put_64_p99", "etcd", 2.0, Better.LOWER),
    Goal("put ops/s at 1 client >= 0.8x etcd", "put_1_ops", "etcd", 0.8, Better.HIGHER),
    Goal("linearizable get ops/s at 64 clients >= 0.8x etcd", "get_linearizable_64_ops", "etcd",
         0.8, Better.HIGHER),
    # Kept from earlier issues ("no worse than now").
    Goal("put ops/s at 64 clients >= 1.0x PySyncObj", "put_64_ops", "pysyncobj", 1.0, Better.HIGHER),
    Goal("1 MiB puts MB/s >= 0.5x etcd", "put_1mib_mbps", "etcd", 0.5, Better.HIGHER),
    Goal("leader kill to first write (median) <= 1x etcd", "failover_s", "etcd", 1.0, Better.LOWER),
)

PEERS = ("etcd", "pysyncobj")
SYSTEM_TITLES = {"ours": "ours", "etcd": "etcd", "pysyncobj": "PySyncObj",
                 "ours-tls": "ours with TLS", "etcd-tls": "etcd with TLS"}
TLS_ROW_KEYS = ("put_1_ops", "put_1_p50", "put_1_p99", "put_64_ops", "put_64_p50", "put_64_p99",
                "get_linearizable_64_ops")


@dataclass
class SystemResult:
    name: str
    version: str = ""
    durability: str = ""
    figures: dict[str, float] = field(default_factory=dict)
    failover_samples_s: list[float] = field(default_factory=list)
    errors: dict[str, tuple[int, str]] = field(default_factory=dict)  # row -> (count, first)
    failure: str = ""  # why the system could not be measured (in full or in part)
    notes: list[str] = field(default_factory=list)  # anything else a reader must know
    profile: Profile | None = None  # py-spy summary of the leader under 64-client puts

    samples: dict[str, list[float]] = field(default_factory=dict)  # per row, one per round

    def add_sample(self, key: str, value: float, peak: bool = False) -> None:
        """Record one round's figure; the table shows the median of the rounds (the
        maximum when peak, as for memory)."""
        values = self.samples.setdefault(key, [])
        values.append(value)
        self.figures[key] = max(values) if peak else statistics.median(values)

    def add_errors(self, key: str, count: int, first: str) -> None:
        previous_count, previous_first = self.errors.get(key, (0, ""))
        self.errors[key] = (previous_count + count, previous_first or first)

    def record_failover(self, seconds: float) -> None:
        self.failover_samples_s.append(seconds)
        self.figures["failover_s"] = statistics.median(self.failover_samples_s)


def _cell(result: SystemResult | None, row: Row) -> str:
    if result is None:
        return "not run"
    value = result.figures.get(row.key)
    if value is None:
        return "failed" if result.failure else "-"
    text = f"{value:,.{row.digits}f}"
    if row.key == "failover_s" and len(result.failover_samples_s) > 1:
        samples = result.failover_samples_s
        text += f" ({min(samples):.2f}-{max(samples):.2f}, n={len(samples)})"
    if result.errors.get(row.key, (0, ""))[0]:
        text += f" [{result.errors[row.key][0]} errors]"
    return text


def ratio(results: dict[str, SystemResult], row_key: str, peer: str) -> float | None:
    ours = results.get("ours")
    other = results.get(peer)
    if ours is None or other is None:
        return None
    mine, theirs = ours.figures.get(row_key), other.figures.get(row_key)
    if mine is None or theirs is None or theirs == 0:
        return None
    return mine / theirs


def table(results: dict[str, SystemResult]) -> str:
    headers = ["row", "ours", "etcd", "PySyncObj", "ours/etcd", "ours/PySyncObj"]
    lines = []
    for row in ROWS:
        ratios = [ratio(results, row.key, peer) for peer in PEERS]
        lines.append(
            [row.label]
            + [_cell(results.get(name), row) for name in ("ours", "etcd", "pysyncobj")]
            + [f"{r:.2f}x" if r is not None else "-" for r in ratios]
        )
    lines.append(
        ["durability"]
        + [results[name].durability if name in results else "not run" for name in ("ours", "etcd", "pysyncobj")]
        + ["", ""]
    )
    return tabulate(lines, headers=headers, tablefmt="github", disable_numparse=True)


def tls_table(results: dict[str, SystemResult]) -> str:
    """Plaintext beside TLS for ours and etcd, the cost of TLS for each, and ours/etcd with
    TLS on both."""

    def figure(name: str, key: str) -> float | None:
        result = results.get(name)
        return result.figures.get(key) if result is not None else None

    def times(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}x" if a is not None and b else "-"

    lines = []
    for row in (r for r in ROWS if r.key in TLS_ROW_KEYS):
        cells = [_cell(results.get(name), row) for name in ("ours", "ours-tls", "etcd", "etcd-tls")]
        lines.append([row.label, cells[0], cells[1],
                      times(figure("ours-tls", row.key), figure("ours", row.key)),
                      cells[2], cells[3],
                      times(figure("etcd-tls", row.key), figure("etcd", row.key)),
                      times(figure("ours-tls", row.key), figure("etcd-tls", row.key))])
    headers = ["row", "ours", "ours TLS", "cost", "etcd", "etcd TLS", "cost", "ours/etcd, TLS"]
    return tabulate(lines, headers=headers, tablefmt="github", disable_numparse=True)


def goals_table(results: dict[str, SystemResult]) -> str:
    lines = []
    for goal in GOALS:
        measured = ratio(results, goal.row_key, goal.peer)
        if measured is None:
            verdict = "not measured"
        elif goal.better is Better.HIGHER:
            verdict = "reached" if measured >= goal.limit_ratio else "not reached"
        else:
            verdict = "reached" if measured <= goal.limit_ratio else "not reached"
        # Three decimals: 0.997x must not print as 1.00x beside "not reached".
        lines.append([goal.label, f"{measured:.3f}x" if measured is not None else "-", verdict])
    return tabulate(lines, headers=["target", "measured", "verdict"], tablefmt="github", disable_numparse=True)


def error_notes(results: dict[str, SystemResult]) -> list[str]:
    notes = []
    for result in results.values():
        if result.failure:
            notes.append(f"- {SYSTEM_TITLES[result.name]}: {result.failure}")
        for row_key, (count, first) in result.errors.items():
            if count:
                notes.append(f"- {SYSTEM_TITLES[result.name]}, `{row_key}`: {count} failed operations, first: {first}")
        for note in dict.fromkeys(result.notes):  # one line per distinct note, rounds counted
            times = result.notes.count(note)
            notes.append(f"- {SYSTEM_TITLES[result.name]}, {note}" + (f" ({times} rounds)" if times > 1 else ""))
    return notes


def profile_section(profile: Profile) -> list[str]:
    """Markdown lines: where our leader's samples went during 64-client puts."""
    if profile.samples == 0:
        return ["## Where our leader spends its time", "", "py-spy recorded no samples."]

    def rows(shares) -> str:
        return tabulate(
            [[s.function, f"{s.self_percent:.1f}%", f"{s.total_percent:.1f}%"] for s in shares],
            headers=["function", "self", "with callees"],
            tablefmt="github",
            disable_numparse=True,
        )

    return [
        "## Where our leader spends its time (py-spy, 64-client puts, run again after the 256-byte rows)",
        "",
        f"{profile.samples:,} samples of the leader while it was not idle (blocking system calls "
        "such as fdatasync count as busy: the event loop waits for them).",
        "",
        "Most samples on top of the stack:",
        "",
        rows(profile.top_self),
        "",
        "Our code, with callees:",
        "",
        rows(profile.top_total_in_project),
    ]
