"""A workflow's graph as the dashboard lays it out (no database): depths are
the longest paths from a root, a depth keeps the steps' order and wraps,
links only go down, and a link across depths goes round the boxes between."""

from __future__ import annotations

import re
from typing import Any

import pytest

from worker_cli.dashboard.workflow_graph import (
    NODE_HEIGHT,
    NODE_WIDTH,
    PER_LINE,
    depths,
    layout,
)

pytestmark = pytest.mark.unit


def steps(*refs: str) -> list[dict[str, Any]]:
    return [
        {"ref": ref, "state": "blocked", "position": n, "task_identifier": "t", "job_id": None}
        for n, ref in enumerate(refs, 1)
    ]


def test_a_depth_is_the_longest_path_from_a_root() -> None:
    edges = [("a", "b"), ("b", "c"), ("a", "c"), ("c", "d"), ("x", "d")]
    assert depths(["a", "b", "c", "d", "x"], edges) == {"a": 0, "b": 1, "c": 2, "d": 3, "x": 0}
    # A link to a step not drawn counts for nothing; a cycle (no workflow has
    # one) goes below the rest rather than loop.
    assert depths(["a", "b"], [("a", "b"), ("gone", "a")]) == {"a": 0, "b": 1}
    assert depths(["a", "b", "c"], [("a", "b"), ("b", "c"), ("c", "b")]) == {
        "a": 0,
        "b": 2,
        "c": 2,
    }


def test_a_depth_keeps_the_order_of_the_steps_and_wraps() -> None:
    refs = ["root", *(f"p{n}" for n in range(PER_LINE + 2)), "end"]
    edges = [("root", ref) for ref in refs[1:-1]] + [("p0", "end")]
    graph = layout(steps(*refs), edges, total=len(refs) + 5)
    by_ref = {node.ref: node for node in graph.nodes}
    first_line = [by_ref[f"p{n}"] for n in range(PER_LINE)]
    assert [node.x for node in first_line] == sorted(node.x for node in first_line)
    assert len({node.y for node in first_line}) == 1
    wrapped = by_ref[f"p{PER_LINE}"]
    assert wrapped.level == 1 and wrapped.y > first_line[0].y
    assert by_ref["end"].level == 2 and by_ref["end"].y > wrapped.y + NODE_HEIGHT
    assert graph.width == pytest.approx(max(n.x for n in graph.nodes) + NODE_WIDTH + 10)
    assert graph.left_out == 5 and graph.levels == 3
    assert {(e.parent, e.child) for e in graph.edges} == set(edges)


def test_a_link_across_depths_goes_round_the_boxes_between() -> None:
    graph = layout(steps("a", "b", "c"), [("a", "b"), ("b", "c"), ("a", "c")], total=3)
    a, b = ({node.ref: node for node in graph.nodes}[ref] for ref in ("a", "b"))
    [long] = [e for e in graph.edges if (e.parent, e.child) == ("a", "c")]
    # Past b's box beside it (a straight link would go down its middle): a
    # line from above its top to below its bottom, outside it.
    [(x, end)] = [(float(x), float(y)) for x, y in re.findall(r"L([\d.]+),([\d.]+)", long.path)]
    before = long.path.split(" L")[0].split()[-1]
    assert float(before.split(",")[0]) == x and float(before.split(",")[1]) < b.y
    assert end > b.y + NODE_HEIGHT
    assert not b.x <= x <= b.x + NODE_WIDTH, (x, b.x)
    # A link to the next depth: one segment, bottom middle to top middle (a
    # line here: the boxes are one above the other).
    [short] = [e for e in graph.edges if (e.parent, e.child) == ("a", "b")]
    bottom = a.y + NODE_HEIGHT
    assert short.path == f"M{a.center:.1f},{bottom:.1f} L{b.center:.1f},{b.y - 1:.1f}"


def test_long_refs_are_shortened_and_unknown_states_get_a_colour() -> None:
    rows = steps("a" * 40, "b")
    rows[1]["state"] = "something new"
    graph = layout(rows, [], total=2)
    assert graph.nodes[0].label == "a" * 18 + "…"
    assert graph.nodes[1].css == "node-other"
    assert layout([], [], total=0).nodes == []
