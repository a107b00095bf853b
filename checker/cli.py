"""`python -m checker check FILE ...`: check a stored history from the command line.

Prints a one-line verdict, a per-key summary table and, for an invalid key, the
counterexample; optionally writes the HTML timeline and the JSON results. Exit codes:
0 valid, 1 invalid (or a lost write), 2 unknown (a budget ran out), 3 bad input (unreadable
file, no operations, a bad option) or an internal error.
Must never print a verdict for input it could not read, nor before every output file was
written; must never let a crash exit 1 (the code that means "invalid") or 2.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from checker.linearizability import (
    DEFAULT_BUDGET_S,
    DEFAULT_MAX_MEMO_ENTRIES,
    DEFAULT_MAX_MEMORY_MB,
    check_linearizable,
)
from checker.lost_writes import check_lost_writes
from checker.models import MODELS, ModelError, by_name
from checker.result import UNKNOWN, Result, Verdict, combine
from checker.timeline import FAILING_OP_ANCHOR, render_html
from histories.load import FORMATS, load_history
from histories.ops import HistoryError, Operation
from histories.pairing import pair_operations

EXIT_VALID, EXIT_INVALID, EXIT_UNKNOWN, EXIT_UNREADABLE = 0, 1, 2, 3
EXIT_ERROR = EXIT_UNREADABLE  # bad input and internal errors share the code: never 1 or 2
_DEFAULT_MODEL = {"porcupine-etcd": "etcd", "porcupine-kv": "kv", "edn": "cas-register"}
_LOST_WRITE_MODELS = ("versioned-kv", "register", "cas-register")
_TABLE_ROWS = 20


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on a usage error, which here means "unknown": exit 3 instead."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")


def _budget(kind: type) -> object:
    def parse(text: str) -> float | int:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value) or value < 0:
            raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m checker", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="check a history file for linearizability and lost writes")
    check.add_argument("file", type=Path, metavar="FILE", help="history.jsonl, Jepsen EDN or a Porcupine log")
    check.add_argument("--model", choices=list(MODELS), help="default: from the format")
    check.add_argument("--init", metavar="VALUE", help="the register's initial value as EDN (default nil)")
    check.add_argument("--format", choices=FORMATS, help="default: from the name and content")
    check.add_argument("--budget-s", type=_budget(float), default=DEFAULT_BUDGET_S, metavar="N", help="CPU seconds per key (default %(default)s)")
    check.add_argument(
        "--wall-budget-s",
        type=_budget(float),
        default=None,
        metavar="N",
        help="wall-clock seconds for the whole check, all keys together (default: none); past it the verdict is unknown",
    )
    check.add_argument("--max-memo", type=_budget(int), default=DEFAULT_MAX_MEMO_ENTRIES, metavar="N", help="memo entries per key (default %(default)s)")
    check.add_argument("--max-memory-mb", type=_budget(float), default=DEFAULT_MAX_MEMORY_MB, metavar="MB", help="search memory per key (default %(default)s)")
    check.add_argument("--all-keys", action="store_true", help="check every key, not only up to the first invalid")
    check.add_argument("--no-partition", action="store_true", help="check the history as one object (slow)")
    check.add_argument("--html", type=Path, metavar="OUT", help="write the HTML timeline here")
    check.add_argument("--json", type=Path, metavar="OUT", help="write the JSON results here")
    check.add_argument(
        "--allow-empty",
        action="store_true",
        help="a history with no operations is valid (default: exit 3, a harness that wrote nothing must not pass)",
    )
    return parser


def main(argv: Sequence[str] | None = None, *, own_process: bool = False) -> int:
    """`own_process`: this is `python -m checker`, whose process ends with the check (its
    garbage collector may be tuned for the one history it reads)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (3, see _Parser)
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    try:
        return _check(args, own_process)
    except (HistoryError, ModelError) as exc:
        print(f"UNREADABLE: {_with_file(exc, args.file)}", file=sys.stderr)
    except _OutputError as exc:
        print(f"ERROR: {exc}; no verdict printed", file=sys.stderr)
    except RecursionError:
        print(f"UNREADABLE: {args.file}: values nested too deeply to check", file=sys.stderr)
    except MemoryError:
        print(f"ERROR: {args.file}: out of memory (lower --max-memory-mb)", file=sys.stderr)
    except Exception as exc:  # a bug must never read as a verdict: exit 3, not 1
        print(f"INTERNAL ERROR: {args.file}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return EXIT_ERROR


class _OutputError(Exception):
    """An output file (--html, --json) could not be written."""


def _check(args: argparse.Namespace, own_process: bool = False) -> int:
    records, source, operations = _read(args, own_process)
    if not operations and not args.allow_empty:
        raise HistoryError(
            "no operations (an empty or blank history; a harness that died before writing "
            "anything must not pass; --allow-empty accepts it as valid)",
            path=str(args.file),
        )
    model_name = args.model or _default_model(source, operations)
    try:
        init = _parse_init(args.init) if args.init is not None else None
    except ValueError as exc:
        raise ModelError(f"--init: {exc}") from None
    model = by_name(model_name, init)
    result = check_linearizable(
        operations,
        model,
        budget_s=args.budget_s,
        all_keys=args.all_keys,
        partition=not args.no_partition,
        max_memo_entries=args.max_memo,
        max_memory_mb=args.max_memory_mb,
        wall_budget_s=args.wall_budget_s,
    )
    lost = check_lost_writes(operations) if model_name in _LOST_WRITE_MODELS else None
    verdict: Verdict = combine([result.valid] + ([lost.valid] if lost else []))
    written = []
    # Every output file first: a verdict printed before a write failed would be read by CI.
    if args.html:
        _write(args.html, render_html(result, operations, model, title=args.file.name))
        opens = f" (opens on the failing operation: {args.html.resolve().as_uri()}#{FAILING_OP_ANCHOR})"
        written.append(f"timeline: {args.html}" + (opens if result.valid is False else ""))
    if args.json:
        payload = {"file": str(args.file), "valid": verdict, "linearizable": result.to_json()}
        if lost is not None:
            payload["lost_writes"] = lost.to_json()
        _write(args.json, json.dumps(payload, indent=2))
        written.append(f"results: {args.json}")
    code = EXIT_VALID if verdict is True else EXIT_INVALID if verdict is False else EXIT_UNKNOWN
    try:
        _print_report(args.file, result, lost, verdict)
        for line in written:
            print(line)
        sys.stdout.flush()
    except BrokenPipeError:
        # Piped into `head` that closed early: the verdict stands, the rest had no reader.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return code


def _read(args: argparse.Namespace, own_process: bool) -> tuple[list, str, list[Operation]]:
    """The records and operations, read with the cyclic garbage collector off: a long history
    is tens of thousands of objects that live to the end, and every collection on the way
    walked all of them again. In its own process they are then frozen and collections made
    rarer, so the search's collections do not walk them either (with the exit in __main__,
    15% of the CPU of checking an 11,000-operation key); the search runs with the collector
    on, as it may leave cycles behind and has a memory budget to keep."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        records, source = load_history(args.file, args.format)
        operations = pair_operations(records, path=str(args.file), strict=source == "jsonl")
    finally:
        if own_process:
            gc.freeze()
            gc.set_threshold(100_000, 50, 100)
        if was_enabled:
            gc.enable()
    return records, source, operations


def _parse_init(text: str) -> object:
    from histories.edn import parse_edn_value  # edn_format costs startup time: only when asked

    return parse_edn_value(text)


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise _OutputError(f"cannot write {path}: {exc.strerror or exc}") from exc


def _with_file(exc: Exception, path: Path) -> str:
    """The message names the file even when the error came from a model (which knows lines only)."""
    text = str(exc)
    return text if text.startswith(str(path)) else f"{path}: {text}"


def _default_model(source: str, operations: list[Operation]) -> str:
    if source in _DEFAULT_MODEL:
        return _DEFAULT_MODEL[source]
    if any(op.f in ("get", "put", "delete") for op in operations):
        return "versioned-kv"
    return "cas-register"


def _print_report(path: Path, result: Result, lost: Result | None, verdict: Verdict) -> None:
    word = {True: "VALID", False: "INVALID", UNKNOWN: "UNKNOWN"}[verdict]
    counts = result.counts
    print(
        f"{word}: {path} — linearizable: {_word(result.valid)} (model {result.model}, "
        f"{counts['operations']} operations, {counts['keys']} key{'s' if counts['keys'] != 1 else ''}, {result.seconds:.3f} s)"
    )
    if result.note:
        print(f"  note: {result.note}")
    if "wall-clock budget" in result.note:
        print("  the wall-clock budget (--wall-budget-s) ran out before a verdict: unknown, not a pass")
    if lost is not None:
        found = len(lost.anomalies)
        print(f"  lost writes: {'none found' if not found else f'{found} found'} ({lost.counts['reads_checked']} reads checked)")
    rows = sorted(result.keys, key=lambda k: (k.valid is True, k.valid != UNKNOWN, -k.seconds))
    table = [
        [repr(k.key), k.operations, _word(k.valid), f"{k.seconds:.3f}", k.explored, k.note]
        for k in rows[:_TABLE_ROWS]
    ]
    print(_table(table, ["key", "ops", "verdict", "seconds", "explored", "note"]))
    if len(rows) > _TABLE_ROWS:
        print(f"  ... {len(rows) - _TABLE_ROWS} more keys, all valid" if rows[_TABLE_ROWS].valid is True else f"  ... {len(rows) - _TABLE_ROWS} more keys")
    for counterexample in result.counterexamples:
        print()
        print(counterexample.text())
    if lost is not None:
        for anomaly in lost.anomalies:
            print(f"  {anomaly.kind}: {anomaly.text}")


def _table(rows: list[list[object]], headers: list[str]) -> str:
    """A plain text table: text left-aligned, numbers right-aligned, a dashed rule under the
    headers. (tabulate did this; importing it and wcwidth was a third of the start-up time.)"""
    cells = [[str(c) for c in row] for row in rows]
    numeric = [bool(rows) and all(_is_number(row[n]) for row in rows) for n in range(len(headers))]
    widths = [max([len(h)] + [len(row[n]) for row in cells]) for n, h in enumerate(headers)]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)).rstrip()

    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *(line(row) for row in cells)])


def _is_number(value: object) -> bool:
    try:
        float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True


def _word(valid: Verdict) -> str:
    return {True: "valid", False: "INVALID", UNKNOWN: "unknown"}[valid]
