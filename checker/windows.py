"""Cutting one key's history at isolated blind writes, so that each piece is searched alone.

An *isolated blind write* is a completed operation whose step is blind (Step.blind: legal in
every state, its new state ignores the old one, a plain register write) and that no other
completed operation overlaps in real time: every completed operation returned before it was
invoked, or was invoked after it returned. Such a write splits the history into *windows*:
window 0 is everything before the first one; window k starts at the k-th and runs to the next.

Why a window can be searched alone (the argument the checker's soundness rests on): in any
linearization of the whole key, a window's completed operations come after those of every
earlier window and before those of every later one (real time), so the linearization, cut
there, is a linearization of the window that uses some of the unknown-outcome (`info`)
operations. A window that starts with a blind write leaves the same states whatever state it
starts from (the `info` operations placed before the write can be left out: never taking
effect is allowed). Hence:

- a window that has no linearization even with every `info` operation invoked before its end
  available makes the whole key not linearizable, whatever the rest (a stale read planted
  after the last write of a 30-client key is refuted in a few configurations, where the whole
  search must first exhaust every order of the 20,000 operations before it);
- linearizations of every window that use disjoint sets of `info` operations concatenate into
  a linearization of the whole key (each window's operations precede the next window's in
  real time, and an `info` operation is placed only after its invoke), so the key is
  linearizable.

When the windows' own linearizations need the same `info` operation the cut proves nothing
either way, and the checker searches the whole key as before (checker/linearizability.py).
This is the quiescent-point decomposition of the literature (a point no operation spans
splits the search), kept exact by the blind write that starts each window.

Must never decide a verdict by itself: it only says where the cuts are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from histories.ops import Operation


def isolated_blind_writes(ops: Sequence[Operation], steps: Sequence[Any]) -> list[int]:
    """Indexes (into `ops`) of the isolated blind writes, in call order. `ops` are one key's
    operations as the search gets them (prepared; the uninformative ones dropped)."""
    completed = sorted((i for i, op in enumerate(ops) if op.ret is not None), key=lambda i: ops[i].call)
    found = []
    latest_return = -math.inf  # of the completed operations invoked before this one
    for position, i in enumerate(completed):
        op = ops[i]
        next_call = ops[completed[position + 1]].call if position + 1 < len(completed) else math.inf
        if steps[i].blind and latest_return < op.call and op.ret < next_call:  # type: ignore[operator]
            found.append(i)
        latest_return = max(latest_return, op.ret)  # type: ignore[type-var]
    return found


def windows(ops: Sequence[Operation], steps: Sequence[Any]) -> list[list[int]]:
    """The completed operations of each window, as indexes into `ops` in call order: window 0
    (possibly empty) before the first isolated blind write, then one window per such write,
    which is its first operation. One window when there is no cut."""
    cuts = isolated_blind_writes(ops, steps)
    cut_calls = [ops[i].call for i in cuts]
    result: list[list[int]] = [[] for _ in range(len(cuts) + 1)]
    window = 0
    for i in sorted((i for i, op in enumerate(ops) if op.ret is not None), key=lambda i: ops[i].call):
        while window < len(cuts) and ops[i].call >= cut_calls[window]:
            window += 1
        result[window].append(i)
    return result if result[0] else result[1:]
