"""Partition shapes: who can reach whom, for every size the harness allows."""

from __future__ import annotations

import random

import networkx as nx
import pytest

from nemesis import partitions

NODES = {n: [f"n{i}" for i in range(1, n + 1)] for n in range(3, 10)}


@pytest.mark.parametrize("n", range(3, 10))
def test_random_halves_splits_into_majority_and_minority(n: int) -> None:
    g = partitions.random_halves(NODES[n], random.Random(n))
    sizes = sorted(len(c) for c in nx.connected_components(g))
    assert sizes == [n // 2, n - n // 2]


@pytest.mark.parametrize("n", range(3, 10))
def test_isolate_leader_cuts_exactly_the_leader(n: int) -> None:
    g = partitions.shape("isolate-leader", NODES[n], random.Random(0), leader="n2")
    assert list(g.neighbors("n2")) == []
    assert g.subgraph([x for x in NODES[n] if x != "n2"]).number_of_edges() == (n - 1) * (n - 2) // 2
    cut = partitions.cuts(g)
    assert sorted(cut) == sorted([("n2", x) for x in NODES[n] if x != "n2"]
                                 + [(x, "n2") for x in NODES[n] if x != "n2"])


@pytest.mark.parametrize("n", range(4, 10))
def test_majorities_ring_every_node_sees_a_majority_and_no_two_the_same(n: int) -> None:
    g = partitions.majorities_ring(NODES[n], random.Random(n))
    majority = n // 2 + 1
    views = {node: frozenset([node, *g.neighbors(node)]) for node in g.nodes}
    assert all(majority <= len(v) < n for v in views.values()), views
    if n >= 5:
        assert len(set(views.values())) == n  # nobody shares its majority with another
    assert partitions.cuts(g)  # something is cut


@pytest.mark.parametrize("n", range(3, 10))
def test_bridge_one_node_talks_to_both_sides(n: int) -> None:
    g = partitions.bridge(NODES[n], random.Random(n))
    degrees = dict(g.degree())
    middle = max(degrees, key=degrees.get)
    assert degrees[middle] == n - 1
    rest = g.subgraph([x for x in g.nodes if x != middle])
    assert nx.number_connected_components(rest) == 2


def test_same_seed_same_shapes() -> None:
    a = [partitions.to_json(partitions.shape(s, NODES[5], random.Random(7), "n1"))
         for s in partitions.SHAPES]
    b = [partitions.to_json(partitions.shape(s, NODES[5], random.Random(7), "n1"))
         for s in partitions.SHAPES]
    assert a == b


def test_describe_names_the_groups() -> None:
    g = partitions.isolate(NODES[5], "n3")
    assert partitions.describe(g) == "n1 n2 n4 n5 | n3"
