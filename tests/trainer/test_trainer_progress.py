"""The trainer CLI's progress line and final table from a status and events (no processes):
the figures after a takeover, and what counts as a takeover."""

from __future__ import annotations

from system.trainer.cli import progress_line, takeovers
from system.trainer.proto import trainer_pb2


def _status(step: int, loss: float, accuracy: float, cid: str = "c1", term: int = 1):  # noqa: ANN202
    return trainer_pb2.StatusReply(coordinator_id=cid, active=True, loss=loss, accuracy=accuracy,
                                   term=term, step=step, last_checkpoint_step=0,
                                   last_checkpoint_version=1)


def test_a_coordinator_that_has_evaluated_nothing_shows_the_last_figures_or_a_dash() -> None:
    nan = float("nan")
    figures: dict[str, float] = {}
    first = progress_line(_status(0, nan, nan), 100, figures)
    assert "loss - acc -" in first and "nan" not in first
    progress_line(_status(40, 0.25, 0.9), 100, figures)
    # A takeover: the successor has not evaluated yet.
    line = progress_line(_status(41, nan, nan, cid="c2", term=2), 100, figures)
    assert "loss 0.2500 acc 0.9000 coordinator c2 (term 2)" in line and "nan" not in line
    assert "loss 0.1000 acc 0.9500" in progress_line(_status(60, 0.1, 0.95, "c2", 2), 100, figures)


def _acquired(cid: str, term: int, time: float) -> dict:
    return {"kind": "lease-acquired", "coordinator_id": cid, "lease_version": term,
            "time": time, "outcome": "ok"}


def test_the_first_acquisition_is_no_takeover_and_a_change_of_holder_is() -> None:
    assert takeovers([]) == 0
    assert takeovers([_acquired("c1", 1, 1.0)]) == 0
    # Event logs are read one coordinator at a time: the order is the term's, not the file's.
    events = [_acquired("c2", 2, 5.0), _acquired("c1", 3, 9.0), {"kind": "checkpoint-ok"},
              _acquired("c1", 1, 1.0), {"kind": "lease-lost", "coordinator_id": "c1"}]
    assert takeovers(events) == 2
    # Taking back one's own lapsed lease takes it from no one else.
    assert takeovers([_acquired("c1", 1, 1.0), _acquired("c1", 2, 4.0)]) == 0
