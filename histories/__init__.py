"""The operation record: format, reader and writer, importers (docs/histories.md).

Public API:
    Op, OpType, Operation, HistoryError     the records (histories.ops)
    HistoryWriter                            append + flush per record (histories.write)
    read_history, read_operations            validated reading of history.jsonl (histories.read)
    pair_operations                          invoke/completion pairing (histories.pairing)
    load_history                             any supported format (histories.load)
"""

from histories.ops import HistoryError, Op, Operation, OpType
from histories.pairing import pair_operations

__all__ = ["HistoryError", "Op", "OpType", "Operation", "pair_operations"]
