"""Pair each invoke with its completion, checking the op model's rules on the way.

Rules (docs/histories.md): a process has at most one operation in flight; every completion
follows an invoke of the same process and function; an invoke never completed by the end of
the history is treated like `info` (unknown outcome). In strict mode (our own histories) a
process whose operation ended in `info` must never invoke again: Jepsen retires it.

Must never guess: a history that breaks a rule raises HistoryError naming the record's line.
"""

from __future__ import annotations

from collections.abc import Iterable

from histories.ops import HistoryError, Op, Operation, OpType


def pair_operations(
    records: Iterable[Op], *, path: str | None = None, strict: bool = False
) -> list[Operation]:
    """Client operations in invoke order; nemesis and other non-client records are skipped."""
    open_by_process: dict[int, tuple[int, Op]] = {}
    retired: dict[int, Op] = {}
    pending: list[tuple[int, Op, Op | None]] = []  # (id, invoke, completion) in invoke order
    completions: dict[int, Op] = {}
    next_id = 0
    for record in records:
        if not record.is_client:
            continue
        process = record.process
        where = record.line if record.line is not None else record.index
        if record.type is OpType.INVOKE:
            if process in open_by_process:
                _, earlier = open_by_process[process]
                raise HistoryError(
                    f"process {process} invokes {record.f!r} while its {earlier.f!r} invoked "
                    f"at line {earlier.line} is still in flight (one operation per process)",
                    path=path,
                    line=where,
                )
            if strict and process in retired:
                raise HistoryError(
                    f"process {process} invokes again after its operation at line "
                    f"{retired[process].line} ended in 'info'; a process with an unknown "
                    f"outcome must be retired (use a new process id)",
                    path=path,
                    line=where,
                )
            open_by_process[process] = (next_id, record)
            pending.append((next_id, record, None))
            next_id += 1
            continue
        if process not in open_by_process:
            raise HistoryError(
                f"{record.type.value!r} completion for process {process} without an invoke "
                f"in flight",
                path=path,
                line=where,
            )
        op_id, invoke = open_by_process.pop(process)
        if record.f != invoke.f:
            raise HistoryError(
                f"completion f={record.f!r} does not match the invoke f={invoke.f!r} "
                f"at line {invoke.line} of process {process}",
                path=path,
                line=where,
            )
        if record.key is not None and invoke.key is not None and record.key != invoke.key:
            raise HistoryError(
                f"completion key {record.key!r} does not match the invoke key {invoke.key!r} "
                f"at line {invoke.line} of process {process}",
                path=path,
                line=where,
            )
        if record.type is OpType.INFO:
            retired[process] = record
        completions[op_id] = record

    operations = []
    for op_id, invoke, _ in pending:
        completion = completions.get(op_id)
        if completion is None or completion.type is OpType.INFO:
            kind, result, ret = OpType.INFO, None, None
        else:
            kind, result, ret = completion.type, completion.value, completion.index
        operations.append(
            Operation.trusted(
                id=op_id,
                process=invoke.process,
                f=invoke.f,
                key=invoke.key,
                value=invoke.value,
                type=kind,
                result=result,
                call=invoke.index,
                ret=ret,
                invoke=invoke,
                completion=completion,
            )
        )
    return operations
