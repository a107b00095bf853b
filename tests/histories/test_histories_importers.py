"""Importers: Jepsen EDN (incl. jepsen.independent tuples) and Porcupine's etcd and kv logs."""

from __future__ import annotations

from pathlib import Path

import pytest

from histories.edn import read_edn_history
from histories.load import detect_source, load_history
from histories.ops import HistoryError, OpType
from histories.pairing import pair_operations
from histories.porcupine import read_etcd_log


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_edn_vector_with_comments_and_nemesis(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "history.edn",
        """[{:process 0, :type :invoke, :f :cas, :value [1 2], :time 5}
 ; a comment between ops
 {:process :nemesis, :type :info, :f :kill, :value nil}
 {:process 0  :type :ok, :f :cas, :value [1 2]}
 {:process 1, :type :invoke, :f :read, :value nil}]
""",
    )
    records = read_edn_history(path)
    assert [r.process for r in records] == [0, "nemesis", 0, 1]
    assert records[0].value == (1, 2) and records[0].time == 5 and records[0].line == 1
    cas, read = pair_operations(records)
    assert (cas.type, cas.ret) == (OpType.OK, 2)
    assert (read.type, read.ret) == (OpType.INFO, None)  # never completed: unknown


def test_edn_independent_vector_tuples_become_keys(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "history.edn",
        """{:process 0, :type :invoke, :f :read, :value [7 nil]}
{:process 0, :type :ok, :f :read, :value [7 3]}
{:process 1, :type :invoke, :f :cas, :value [8 [3 4]]}
{:process 1, :type :fail, :f :cas, :value [8 [3 4]]}
""",
    )
    read, cas = pair_operations(read_edn_history(path))
    assert (read.key, read.result) == (7, 3)
    assert (cas.key, cas.value, cas.type) == (8, (3, 4), OpType.FAIL)


def test_edn_independent_tagged_tuples(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "history.edn",
        """{:process 0, :type :invoke, :f :write, :value #jepsen.independent.Tuple{:key :a, :value 1}}
{:process 0, :type :ok, :f :write, :value #jepsen.independent.Tuple{:key :a, :value 1}}
""",
    )
    (write,) = pair_operations(read_edn_history(path))
    assert (write.key, write.value) == (":a", 1)


def test_plain_cas_histories_are_not_mistaken_for_independent(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "h.edn",
        "{:process 0, :type :invoke, :f :read, :value nil}\n{:process 0, :type :ok, :f :read, :value 2}\n"
        "{:process 1, :type :invoke, :f :cas, :value [1 2]}\n",
    )
    read, cas = pair_operations(read_edn_history(path))
    assert read.key is None and cas.value == (1, 2)


def test_unreadable_edn_names_the_line(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "h.edn",
        "{:process 0, :type :invoke, :f :read, :value nil}\n{:process 0, :type :ok, :f :read, :value",
    )
    with pytest.raises(HistoryError, match="truncated last line") as caught:
        read_edn_history(path)
    assert caught.value.line == 2


def test_edn_op_without_type_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path, "h.edn", "{:process 0, :type :invoke, :f :read}\n{:process 0, :f :read}\n")
    with pytest.raises(HistoryError, match="without :type") as caught:
        read_edn_history(path)
    assert caught.value.line == 2


def test_etcd_log_tabs_spaces_timeouts_and_failed_cas(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "etcd_999.log",
        "INFO  jepsen.util - 1\t:invoke\t:read\tnil\n"
        "some noise from another logger\n"
        "INFO  jepsen.util - 1\t:fail\t:read\t:timed-out\n"
        "INFO  jepsen.util - 2   :invoke :cas    [1 2]\n"
        "INFO  jepsen.util - 2   :fail   :cas    [1 2]\n"
        "INFO  jepsen.util - 3\t:invoke\t:write\t4\n"
        "INFO  jepsen.util - 3\t:info\t:write\t:timed-out\n",
    )
    records = read_etcd_log(path)
    read, cas, write = pair_operations(records)
    assert read.type is OpType.INFO  # a timed-out read is unknown, as Porcupine reads it
    assert (cas.type, cas.value) == (OpType.FAIL, (1, 2))  # etcd: the compare did not match
    assert (write.type, write.value) == (OpType.INFO, 4)
    assert records[1].line == 3


def test_etcd_log_op_line_that_cannot_be_read_is_an_error(tmp_path: Path) -> None:
    path = _write(tmp_path, "etcd.log", "INFO  jepsen.util - 1\t:invoke\t:write\tforty\n")
    with pytest.raises(HistoryError, match="cannot read the value") as caught:
        read_etcd_log(path)
    assert caught.value.line == 1


def test_format_detection(tmp_path: Path) -> None:
    kv = _write(tmp_path, "c01.txt", '{:process 0, :type :invoke, :f :get, :key "1", :value nil}\n')
    assert detect_source(kv) == "porcupine-kv"
    records, source = load_history(kv)
    assert source == "porcupine-kv" and records[0].key == "1"
    etcd = _write(tmp_path, "x.log", "INFO  jepsen.util - 1\t:invoke\t:read\tnil\n")
    assert detect_source(etcd) == "porcupine-etcd"
    assert detect_source(etcd, "edn") == "edn"
    with pytest.raises(HistoryError, match="unknown format"):
        detect_source(etcd, "xml")
