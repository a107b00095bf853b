"""Sequential specifications the linearizability search checks a history against.

A model is a handful of pure functions, as in Porcupine: the initial state, how to turn one
operation into a step (a function state -> new state, or ILLEGAL when the operation cannot
have happened in that state), the partition key, and text for people. States must be
hashable and small: the search memoizes (set of linearized operations, state).

`prepare(op)` returns None when the operation carries no information and may be dropped:
a read that failed or timed out, an operation that certainly did not happen (`fail`). A
step for an operation with an unknown outcome (`info`) must accept every state in which the
operation could have taken effect; the search itself allows it to never take effect.

`read_only` promises that the step never changes the state wherever it is legal; the search
uses it to linearize such operations greedily, so it must never be set for a write.
`blind` promises that the step is legal in every state and its new state does not depend on
the old one (a plain register write); the search uses it to skip placing an unknown-outcome
operation right before a blind write that would erase its effect. `requires` promises that
the step is legal in that one state only (a read of x, a cas from x); the search uses it to
place an unknown-outcome write only where some operation could observe it. All three are
optional: the defaults are always correct, only slower.

Models here: register and cas_register (Knossos' `register` / `cas-register`; as in Knossos a
read that returns nil matches any value), etcd (Porcupine's etcd model: nil is "key missing",
a failed cas means the compare did not match), kv (Porcupine's get/put/append on strings),
versioned_kv (our store, docs/checker.md).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from histories.ops import Operation, OpType


class _Illegal:
    __slots__ = ()

    def __repr__(self) -> str:
        return "ILLEGAL"


ILLEGAL: Any = _Illegal()
"""Returned by a step when the operation cannot have happened in the given state."""

ANY_STATE: Any = type("_AnyState", (), {"__repr__": lambda self: "ANY_STATE"})()
"""`Step.requires` when the step may be legal in more than one state."""

State = Hashable


@dataclass(frozen=True)
class Step:
    """One operation compiled for the search."""

    apply: Callable[[Any], Any]  # state -> new state, or ILLEGAL
    read_only: bool = False  # never changes the state wherever it is legal
    blind: bool = False  # legal in every state, and the new state ignores the old one
    requires: Any = ANY_STATE  # else: ILLEGAL in every state but this one


class ModelError(ValueError):
    """The history holds an operation this model does not know (wrong --model?)."""


class Model:
    """Base class; subclasses define prepare() and may override the rest."""

    name = "model"

    def __init__(self, init: Any = None) -> None:
        self.init = init

    def initial_state(self) -> State:
        return self.init

    def partition_key(self, op: Operation) -> Hashable:
        return op.key

    def prepare(self, op: Operation) -> Step | None:
        raise NotImplementedError

    def forget_unread_values(self, operations: Sequence[Operation]) -> list[Operation]:
        """The operations, with values that cannot change the verdict made equal, so the
        search can treat them as one (its symmetry rule). Default: unchanged."""
        return list(operations)

    def describe_state(self, state: State) -> str:
        return "nil" if state is None else repr(state)

    def describe_operation(self, op: Operation) -> str:
        outcome = {OpType.OK: "", OpType.FAIL: " (fail)", OpType.INFO: " (unknown outcome)"}[op.type]
        if op.f in ("read", "get"):
            shown = "?" if op.type is not OpType.OK else _show(op.result)
            return f"{op.f}() -> {shown}{outcome}"
        return f"{op.f}({_show(op.value)}){outcome}"

    def _unknown(self, op: Operation) -> ModelError:
        return ModelError(
            f"the {self.name} model has no operation {op.f!r} (history line "
            f"{op.invoke.line or op.call}); choose another --model"
        )


def _show(value: Any) -> str:
    if value is None:
        return "nil"
    if isinstance(value, tuple):
        return "[" + " ".join(_show(v) for v in value) + "]"
    return repr(value) if isinstance(value, str) else str(value)


def _pair(op: Operation, value: Any) -> tuple[Any, Any]:
    if not (isinstance(value, tuple) and len(value) == 2):
        raise ModelError(f"cas value must be [old new], got {value!r} (line {op.invoke.line})")
    return value


# --- Knossos' register and cas-register -----------------------------------------------------


class CasRegister(Model):
    """Knossos' cas-register: read, write, cas [old new]; fail means it did not happen."""

    name = "cas-register"
    allow_cas = True

    def prepare(self, op: Operation) -> Step | None:
        if op.type is OpType.FAIL:
            return None  # certainly did not happen: no constraint (Knossos drops it)
        f = op.f
        if f == "read":
            if op.type is OpType.INFO or op.result is None:
                return None  # unknown read, or Knossos' nil read that matches anything
            expected = op.result
            return Step(lambda s: s if s == expected else ILLEGAL, read_only=True, requires=expected)
        if f == "write":
            new = op.value
            return Step(lambda s: new, blind=True)
        if f == "cas" and self.allow_cas:
            old, new = _pair(op, op.value)
            # An unknown cas that did not match is the same as one that never happened.
            return Step(lambda s: new if s == old else ILLEGAL, requires=old)
        raise self._unknown(op)


class Register(CasRegister):
    """Knossos' register: read and write only."""

    name = "register"
    allow_cas = False


def cas_register(init: Any = None) -> Model:
    return CasRegister(init)


def register(init: Any = None) -> Model:
    return Register(init)


# --- Porcupine's etcd model -----------------------------------------------------------------


class Etcd(Model):
    """A single etcd key as Jepsen's etcd test uses it: nil = missing, a failed cas = no match."""

    name = "etcd"

    def partition_key(self, op: Operation) -> Hashable:
        return None  # one register

    def prepare(self, op: Operation) -> Step | None:
        f = op.f
        if f == "read":
            if op.type is not OpType.OK:
                return None
            expected = op.result
            return Step(lambda s: s if s == expected else ILLEGAL, read_only=True, requires=expected)
        if f == "write":
            if op.type is OpType.FAIL:
                return None
            new = op.value
            return Step(lambda s: new, blind=True)
        if f == "cas":
            old, new = _pair(op, op.value)
            if op.type is OpType.FAIL:
                # etcd answered "compare failed": the value differed at that moment.
                return Step(lambda s: s if s != old else ILLEGAL, read_only=True)
            return Step(lambda s: new if s == old else ILLEGAL, requires=old)
        raise self._unknown(op)


def etcd(init: Any = None) -> Model:
    return Etcd(init)


# --- Porcupine's key-value model ------------------------------------------------------------


class Kv(Model):
    """Porcupine's kv: per key a string; get returns it ("" if absent), put sets, append adds."""

    name = "kv"

    def __init__(self, init: Any = None) -> None:
        super().__init__("" if init is None else init)

    def prepare(self, op: Operation) -> Step | None:
        if op.type is OpType.FAIL:
            return None
        f = op.f
        if f == "get":
            if op.type is not OpType.OK:
                return None
            expected = "" if op.result is None else op.result
            return Step(lambda s: s if s == expected else ILLEGAL, read_only=True, requires=expected)
        if f == "put":
            new = op.value
            return Step(lambda s: new, blind=True)
        if f == "append":
            suffix = op.value
            return Step(lambda s: s + suffix)
        raise self._unknown(op)

    def describe_operation(self, op: Operation) -> str:
        if op.f == "get":
            shown = repr(op.result) if op.type is OpType.OK else "?"
            return f"get({op.key!r}) -> {shown}"
        return f"{op.f}({op.key!r}, {op.value!r})" + ("" if op.type is OpType.OK else " (unknown outcome)")


def kv(init: Any = None) -> Model:
    return Kv(init)


# --- our store: a versioned register per key ------------------------------------------------

ABSENT = (None, 0)


class VersionedKv(Model):
    """Our store (docs/checker.md): each key has a value and a version (0 = absent, 1 on
    creation, +1 per write, back to absent on delete). put/delete may carry expected_version
    (compare-and-swap; 0 = must not exist); a mismatch is answered with the current version,
    recorded as `ok` with applied=false or as `fail` with error "cas-mismatch". get returns
    the value (null if absent) and the version. Stale reads (consistency "stale") promise no
    recency and are not checked for linearizability."""

    name = "versioned-kv"

    def initial_state(self) -> State:
        return ABSENT

    def describe_state(self, state: State) -> str:
        value, version = state  # type: ignore[misc]
        return "absent" if version == 0 else f"{_show(value)} @v{version}"

    def describe_operation(self, op: Operation) -> str:
        cond = "" if op.expected_version is None else f" if v{op.expected_version}"
        if op.type is OpType.INFO:
            answer = "?"
        elif _mismatch(op):
            answer = f"mismatch, at v{op.version}" if op.version is not None else "mismatch"
        elif op.f == "get":
            answer = "absent" if not op.version else f"{_show(op.result)} @v{op.version}"
        else:
            answer = "ok" if op.version is None else f"ok v{op.version}"
        if op.f == "get":
            return f"get({op.key!r}) -> {answer}"
        if op.f == "delete":
            return f"delete({op.key!r}{cond}) -> {answer}"
        return f"put({op.key!r}, {_show(op.value)}{cond}) -> {answer}"

    def forget_unread_values(self, operations: Sequence[Operation]) -> list[Operation]:
        """Every unknown-outcome put whose value no read returned gets one placeholder value.

        Exact for this model: a value is compared only by reads (a get matches a state iff
        value and version are equal; puts, deletes, mismatches and versions never look at
        values). A value no read returned fails every such comparison, and so does the
        placeholder (chosen unequal to every value read), so each step is legal in the same
        configurations before and after. Why: values are usually unique, so without it the
        search must try every subset and order of the pending unknown writes to fill the
        version gaps a partition leaves (exponential: the simulator's seed 583, 41 such
        writes, ran out of 2,000,000 configurations); with equal inputs the symmetry rule
        places them in invoke order only (437). Counterexamples show the placeholder."""
        read = {_hashable(op.result) for op in operations
                if op.f in ("get", "read") and op.type is OpType.OK}
        placeholder = NEVER_READ
        while placeholder in read:
            placeholder += "'"
        return [replace(op, value=placeholder)
                if (op.type is OpType.INFO and op.f in ("put", "write")
                    and _hashable(op.value) not in read) else op
                for op in operations]

    def prepare(self, op: Operation) -> Step | None:
        f = op.f
        if f in ("get", "read"):
            if op.type is not OpType.OK or op.consistency == "stale":
                return None
            value, version = op.result, op.version
            if version == 0 or (version is None and value is None):
                return Step(lambda s: s if s[1] == 0 else ILLEGAL, read_only=True)
            if version is None:
                return Step(lambda s: s if s[0] == value and s[1] != 0 else ILLEGAL, read_only=True)
            want = (value, version)
            return Step(lambda s: s if s == want else ILLEGAL, read_only=True, requires=want)
        if f == "replay":
            # A write sent again with an applied request id: it must change nothing, so the
            # model takes none; its answer is checker/replays.py's part.
            return None
        if f not in ("put", "write", "delete"):
            raise self._unknown(op)
        expected = op.expected_version
        if _mismatch(op):
            if expected is None:
                raise ModelError(
                    f"line {op.completion.line if op.completion else op.call}: a compare-and-swap "
                    f"mismatch on an operation without expected_version"
                )
            current = op.version
            if current is None:
                return Step(lambda s: s if s[1] != expected else ILLEGAL, read_only=True)
            return Step(
                lambda s: s if s[1] != expected and s[1] == current else ILLEGAL, read_only=True
            )
        if op.type is OpType.FAIL:
            return None  # certainly not applied
        reported = op.version if op.type is OpType.OK else None
        if f == "delete":

            def delete(s: Any) -> Any:
                if expected is not None and s[1] != expected:
                    return ILLEGAL
                if reported is not None and reported != s[1]:
                    return ILLEGAL
                return ABSENT

            return Step(delete)
        new_value = op.value

        def put(s: Any) -> Any:
            version = s[1]
            if expected is not None and version != expected:
                return ILLEGAL
            if reported is not None and reported != version + 1:
                return ILLEGAL
            return (new_value, version + 1)

        return Step(put)


NEVER_READ = "<a value no read returned>"


def _hashable(value: Any) -> Hashable:
    """Values as set members: JSON lists and objects become tuples (by their repr)."""
    try:
        hash(value)
    except TypeError:
        return ("unhashable", repr(value))
    return value


def _mismatch(op: Operation) -> bool:
    if op.type is OpType.OK and op.applied is False:
        return True
    return op.type is OpType.FAIL and op.error == "cas-mismatch"


def versioned_kv(init: Any = None) -> Model:
    if init is not None:
        raise ModelError("the versioned-kv model starts with every key absent; --init does not apply")
    return VersionedKv()


# --- the whole history as one state (no partition by key) -----------------------------------


class Unpartitioned(Model):
    """Checks a multi-key history as one object whose state is the tuple of every key's
    state: Porcupine's stress test of the search (`--no-partition`)."""

    def __init__(self, inner: Model, keys: Sequence[Hashable]) -> None:
        super().__init__(None)
        self.inner = inner
        self.name = f"{inner.name} (unpartitioned)"
        self.keys = list(keys)
        self.position = {key: i for i, key in enumerate(self.keys)}

    def initial_state(self) -> State:
        return tuple(self.inner.initial_state() for _ in self.keys)

    def partition_key(self, op: Operation) -> Hashable:
        return None

    def prepare(self, op: Operation) -> Step | None:
        step = self.inner.prepare(op)
        if step is None:
            return None
        at = self.position[self.inner.partition_key(op)]
        inner_apply = step.apply

        def apply(s: Any) -> Any:
            new = inner_apply(s[at])
            if new is ILLEGAL:
                return ILLEGAL
            return s[:at] + (new,) + s[at + 1 :]

        return Step(apply, read_only=step.read_only)

    def describe_state(self, state: State) -> str:
        return ", ".join(
            f"{key!r}: {self.inner.describe_state(s)}" for key, s in zip(self.keys, state, strict=True)  # type: ignore[arg-type]
        )

    def describe_operation(self, op: Operation) -> str:
        return self.inner.describe_operation(op)


MODELS: dict[str, Callable[..., Model]] = {
    "register": register,
    "cas-register": cas_register,
    "versioned-kv": versioned_kv,
    "etcd": etcd,
    "kv": kv,
}


def by_name(name: str, init: Any = None) -> Model:
    try:
        factory = MODELS[name]
    except KeyError:
        raise ModelError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}") from None
    return factory(init)
