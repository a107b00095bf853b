"""The example history in docs/histories.md reads cleanly and is linearizable, so the
documentation of the stable format cannot drift from what the reader and models accept."""

from __future__ import annotations

from pathlib import Path

from checker import check_linearizable, check_lost_writes, models
from histories.read import read_history

DOC = Path(__file__).resolve().parents[2] / "docs" / "histories.md"


def test_documented_example_is_a_valid_history(tmp_path: Path) -> None:
    text = DOC.read_text(encoding="utf-8")
    block = text.split("```json", 1)[1].split("```", 1)[0].strip() + "\n"
    path = tmp_path / "history.jsonl"
    path.write_text(block, encoding="utf-8")
    records = read_history(path)
    assert len(records) == 8
    assert check_linearizable(records, models.versioned_kv()).valid is True
    assert check_lost_writes(records).valid is True
