"""Load any supported history file: our `history.jsonl`, Jepsen EDN, Porcupine's logs.

`load_history(path, format=None)` picks the reader from `format` ("jsonl", "edn",
"porcupine") or, when None, from the file name and its first characters. Returns the records
and the source kind ("jsonl", "edn", "porcupine-etcd", "porcupine-kv") so a caller can choose
a default model. Must never fall back to another format after a reader has failed: the
first reader's error is the one reported.
"""

from __future__ import annotations

from pathlib import Path

from histories.ops import HistoryError, Op
from histories.porcupine import read_etcd_log, read_kv_log
from histories.read import read_history

FORMATS = ("jsonl", "edn", "porcupine")


def detect_source(path: str | Path, format: str | None = None) -> str:
    """The source kind of a file: jsonl, edn, porcupine-etcd or porcupine-kv."""
    name = str(path)
    if format is not None and format not in FORMATS:
        raise HistoryError(f"unknown format {format!r} (expected one of {', '.join(FORMATS)})", path=name)
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            head = handle.read(4096).lstrip()
    except OSError as exc:
        raise HistoryError(f"cannot read the file: {exc.strerror or exc}", path=name) from exc
    if format == "jsonl":
        return "jsonl"
    if format == "edn":
        return "edn"
    if format == "porcupine":
        return "porcupine-etcd" if head.startswith("INFO") else "porcupine-kv"
    suffix = Path(name).suffix
    if suffix == ".jsonl" or head.startswith('{"'):
        return "jsonl"
    if head.startswith("INFO"):
        return "porcupine-etcd"
    if suffix == ".txt" and head.startswith("{:"):
        return "porcupine-kv"
    if suffix == ".edn" or head[:1] in ("[", "{", ";") or not head:
        return "edn"
    raise HistoryError(
        "cannot tell the format from the name or the first characters; pass --format "
        "jsonl, edn or porcupine",
        path=name,
    )


def load_history(path: str | Path, format: str | None = None) -> tuple[list[Op], str]:
    source = detect_source(path, format)
    if source == "jsonl":
        return read_history(path), source
    if source == "porcupine-etcd":
        return read_etcd_log(path), source
    if source == "porcupine-kv":
        return read_kv_log(path), source
    # EDN's reader (and edn_format under it) is imported only for EDN: starting the checker
    # on a Porcupine log or a jsonl history must not pay for it.
    from histories.edn import read_edn_history

    return read_edn_history(path), source
