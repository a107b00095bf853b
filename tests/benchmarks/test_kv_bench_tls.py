"""kv_bench --tls: TLS targets are made with certificates and measured on their rows only,
and the TLS table gives the cost of TLS beside the plaintext figures."""

from __future__ import annotations

from pathlib import Path

from benchmarks import kv_bench
from benchmarks.kvbench import report


def test_tls_targets_are_named_and_carry_their_certificate_directory(tmp_path: Path) -> None:
    target = kv_bench.make_target("ours-tls", tmp_path / "ours-tls")
    assert target.name == "ours-tls" and target.tls_dir == str(tmp_path / "ours-tls" / "tls")
    plain = kv_bench.make_target("ours", tmp_path / "ours")
    assert plain.name == "ours" and plain.tls_dir == ""


def test_tls_targets_measure_only_the_tls_rows() -> None:
    measured = {plan.key for plan in kv_bench.ROW_PLANS if kv_bench.measures("etcd-tls", plan)}
    assert measured == set(kv_bench.TLS_ROWS)
    assert all(kv_bench.measures("etcd", plan) for plan in kv_bench.ROW_PLANS)


def test_tls_table_gives_the_cost_of_tls_and_ours_against_etcd() -> None:
    results = {name: report.SystemResult(name=name) for name in ("ours", "ours-tls", "etcd", "etcd-tls")}
    for name, ops in (("ours", 1000.0), ("ours-tls", 800.0), ("etcd", 1000.0), ("etcd-tls", 500.0)):
        results[name].add_sample("put_64_ops", ops)
    row = next(line for line in report.tls_table(results).splitlines() if "put ops/s, 64" in line)
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1:] == ["1,000", "800", "0.80x", "1,000", "500", "0.50x", "1.60x"]
