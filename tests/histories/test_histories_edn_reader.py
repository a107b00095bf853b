"""The fast EDN reader reads what edn-format reads, the same way, or hands the text over.

histories.edn_reader must give the importer exactly what edn-format gives it: checked on every
EDN file of the shared corpus and on random EDN values printed by edn-format itself.
"""

from __future__ import annotations

import glob

import edn_format
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checker.corpus import find_shared_data
from histories import edn, edn_reader
from histories.ops import HistoryError

DATA = find_shared_data()
FILES = sorted(glob.glob(f"{DATA}/knossos/**/*.edn", recursive=True) + glob.glob(f"{DATA}/porcupine/kv/*.txt")) if DATA else []


def _both(text: str) -> tuple[list, list]:
    fast = [edn.to_python(v) for v in edn_reader.read_all(text, edn._TAGS)]
    reference = [edn.to_python(v) for v in edn_format.loads_all(text)]
    return fast, reference


@pytest.mark.skipif(not FILES, reason="shared corpus not found")
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.rsplit("/", 2)[-1])
def test_corpus_files_read_the_same(path: str) -> None:
    with open(path, encoding="utf-8") as handle:
        fast, reference = _both(handle.read())
    assert fast == reference


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8),
    st.from_regex(r"[a-z][a-z0-9\-]{0,6}", fullmatch=True).map(edn_format.Keyword),
    st.from_regex(r"[a-z][a-z0-9\-]{0,6}", fullmatch=True).map(edn_format.Symbol),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(edn_format.ImmutableList),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.one_of(st.integers(0, 9), st.text(max_size=3)), inner, max_size=3).map(edn_format.ImmutableDict),
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_values, min_size=1, max_size=4))
def test_random_values_printed_by_edn_format_read_the_same(values: list) -> None:
    text = "\n".join(edn_format.dumps(v) for v in values)
    try:
        fast = [edn.to_python(v) for v in edn_reader.read_all(text, edn._TAGS)]
    except edn_reader.Unsupported:
        return  # handed over to edn-format: nothing to compare
    assert fast == [edn.to_python(v) for v in edn_format.loads_all(text)]


def test_unsupported_forms_fall_back_to_edn_format(tmp_path) -> None:
    path = tmp_path / "history.edn"
    path.write_text('{:process 0 :type :invoke :f :write :value \\c}\n{:process 0 :type :ok :f :write :value 1.5M}\n')
    records = edn.read_edn_history(path)
    assert [r.value for r in records] == ["c", edn_format.loads("1.5M")]


@pytest.mark.parametrize(
    ("text", "reason"),
    [("{:process 0 :type :invoke :f :write :value 1e999}", "not finite"), ("[" * 1000 + "]" * 1000, "nested")],
)
def test_non_finite_numbers_and_deep_nesting_are_refused_with_the_line(tmp_path, text: str, reason: str) -> None:
    path = tmp_path / "history.edn"
    path.write_text("; a comment\n" + text + "\n")
    with pytest.raises(HistoryError, match=reason) as caught:
        edn.read_edn_history(path)
    assert caught.value.line == 2
