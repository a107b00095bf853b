"""Partition shapes as graphs of who can reach whom (Jepsen's names), and the cuts they need.

A shape is an undirected networkx Graph over the node ids: an edge means the two nodes can
talk. Everything not an edge is cut in both directions. The graph is recorded with the
fault event (`to_json`) so a report can draw it.

- random-halves: the nodes shuffled and split into a majority and a minority;
- isolate-leader: the leader alone, the rest together (Jepsen's "primaries" for one leader);
- majorities-ring: every node sees a majority, but no two nodes see the same majority
  (each node reaches its neighbours on a ring); needs 4 or more nodes to cut anything;
- bridge: two halves that cannot talk, and one node that talks to both.

Pure: the random source is passed in, so a seed repeats the shapes.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

import networkx as nx

# The first is the one aimed at the leader: the nemesis leads each round of shapes with it.
SHAPES = ("isolate-leader", "random-halves", "majorities-ring", "bridge")
# The least number of nodes for which each shape cuts something while a majority survives
# somewhere (a 3-node ring is a full graph; a bridge needs two sides and the bridge).
MIN_NODES = {"random-halves": 2, "isolate-leader": 2, "majorities-ring": 4, "bridge": 3}


def _complete(nodes: Sequence[str]) -> nx.Graph:
    g = nx.Graph()
    g.add_nodes_from(nodes)
    g.add_edges_from(itertools.combinations(nodes, 2))
    return g


def components(nodes_groups: Sequence[Sequence[str]]) -> nx.Graph:
    """Groups that talk inside themselves and not to each other."""
    g = nx.Graph()
    for group in nodes_groups:
        g = nx.compose(g, _complete(group))
    return g


def random_halves(nodes: Sequence[str], rng: random.Random) -> nx.Graph:
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    cut = len(shuffled) // 2
    return components([shuffled[:cut], shuffled[cut:]])


def isolate(nodes: Sequence[str], node: str) -> nx.Graph:
    return components([[node], [n for n in nodes if n != node]])


def majorities_ring(nodes: Sequence[str], rng: random.Random) -> nx.Graph:
    """Each node talks to the k nearest nodes on each side of a shuffled ring, k the least
    that makes its view (itself included) a majority. With an even number of nodes the view
    is one node larger than a bare majority: reachability is symmetric here, so a view is
    always odd-sized. Every node misses someone, and no two nodes share a view."""
    ring = list(nodes)
    rng.shuffle(ring)
    n = len(ring)
    majority = n // 2 + 1
    k = majority // 2  # 2k + 1 >= majority
    g = nx.Graph()
    g.add_nodes_from(ring)
    for i, node in enumerate(ring):
        for d in range(1, k + 1):
            g.add_edge(node, ring[(i + d) % n])
    return g


def bridge(nodes: Sequence[str], rng: random.Random) -> nx.Graph:
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    middle = shuffled[0]
    rest = shuffled[1:]
    half = len(rest) // 2
    a, b = rest[:half], rest[half:]
    g = components([a + [middle], b + [middle]])
    return g


def shape(name: str, nodes: Sequence[str], rng: random.Random, leader: str | None) -> nx.Graph:
    """The graph of `name` over `nodes`. isolate-leader without a known leader isolates a
    random node (and the event says so)."""
    if name == "random-halves":
        return random_halves(nodes, rng)
    if name == "isolate-leader":
        return isolate(nodes, leader if leader in nodes else rng.choice(list(nodes)))
    if name == "majorities-ring":
        return majorities_ring(nodes, rng)
    if name == "bridge":
        return bridge(nodes, rng)
    raise ValueError(f"unknown partition shape {name!r}; known: {', '.join(SHAPES)}")


def cuts(graph: nx.Graph) -> list[tuple[str, str]]:
    """Directed links to cut: every ordered pair of distinct nodes that is not an edge."""
    return [(a, b) for a in graph.nodes for b in graph.nodes
            if a != b and not graph.has_edge(a, b)]


def cut_off(nodes: Sequence[str], away: Sequence[str]) -> list[tuple[str, str]]:
    """Every directed link between a node of `away` and any other node: each of them alone."""
    rest = [n for n in nodes if n not in away]
    return cuts(components([*([n] for n in away), rest]))


def to_json(graph: nx.Graph) -> dict[str, list[str]]:
    """node -> sorted nodes it can reach (an adjacency list a report can draw)."""
    return {node: sorted(graph.neighbors(node)) for node in sorted(graph.nodes)}


def describe(graph: nx.Graph) -> str:
    """Short text: the connected groups, e.g. `n1 | n2 n3 n4 n5`, or the ring's adjacency
    when the groups overlap."""
    comps = [sorted(c) for c in nx.connected_components(graph)]
    if all(graph.subgraph(c).number_of_edges() == len(c) * (len(c) - 1) // 2 for c in comps):
        return " | ".join(" ".join(c) for c in sorted(comps))
    return "; ".join(f"{n}->{','.join(sorted(graph.neighbors(n)))}" for n in sorted(graph.nodes))
