"""The shared corpus of published histories with known verdicts (`expected.tsv` per folder).

Used by the corpus test and the benchmark so that both read the corpus the same way. Must
never change a verdict or an init value from what `expected.tsv` says.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

from histories.edn import parse_edn_value

CORPORA = ("porcupine", "knossos")  # the verdict corpora; longkeys/ is read on its own


@dataclass(frozen=True)
class CorpusEntry:
    corpus: str
    path: Path
    file: str  # relative to the corpus folder, as in expected.tsv
    model: str
    init: object
    expected_valid: bool
    operations: int
    porcupine_s: float | None


def find_shared_data() -> Path | None:
    """$MAO_SHARED_DATA, else ../shared/data beside the checkout (or its parents)."""
    env = os.environ.get("MAO_SHARED_DATA")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent
    for parent in here.parents:
        candidate = parent / "shared" / "data"
        if (candidate / "porcupine" / "expected.tsv").exists():
            return candidate
    return None


def load_corpus(data_dir: Path, corpus: str) -> list[CorpusEntry]:
    folder = data_dir / corpus
    entries = []
    with open(folder / "expected.tsv", encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle, delimiter="\t"):
            entries.append(
                CorpusEntry(
                    corpus=corpus,
                    path=folder / row["file"],
                    file=row["file"],
                    model=row["model"],
                    init=parse_edn_value(row["init"]) if row["init"] else None,
                    expected_valid=row["expected"] == "valid",
                    operations=int(row["ops"]),
                    porcupine_s=float(row["porcupine_s"]) if row["porcupine_s"] else None,
                )
            )
    return entries
