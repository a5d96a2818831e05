"""A workflow's steps drawn as a graph: the layout, computed here, that the
workflow page's template draws as an inline SVG (no script).

Each step is a box labelled with its ref and its state, coloured by its state
(the classes ``node-STATE`` of ``static/dashboard.css``, the badges' colours);
each link is a curve from the bottom of the parent's box to the top of the
child's, with an arrowhead. The steps go top to bottom by depth, the longest
path from a root to them among the steps drawn (so every link goes down), and
within a depth in the order they were added; a depth wider than
:data:`PER_LINE` boxes wraps onto more lines.

At most :data:`GRAPH_STEPS` steps are drawn (the first by position, with the
links among them, at most :data:`EDGES_READ` of those read): the page says how
many were left out; its table lists them all, a page at a time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

__all__ = [
    "EDGES_READ",
    "GRAPH_STEPS",
    "PER_LINE",
    "Edge",
    "Graph",
    "Node",
    "depths",
    "layout",
]

#: Steps drawn at most: the first by position (the order they were added).
GRAPH_STEPS = 500
#: Links into the steps drawn read at most (a step may wait for thousands).
EDGES_READ = 5_000
#: Boxes on one line; a depth with more wraps onto the next lines.
PER_LINE = 7
#: A box's size, the space between boxes, lines and depths, and around the
#: drawing (pixels).
NODE_WIDTH, NODE_HEIGHT = 150, 44
GAP_X, LINE_GAP, LEVEL_GAP, MARGIN = 16, 14, 44, 10
#: How far from the middle of a box a link may start or end; how far from a
#: box a link passing it keeps.
SPREAD = NODE_WIDTH * 0.3
CLEARANCE = 6
#: Lines of boxes the links are routed around at most, in all (beyond, a
#: link goes straight: the layout stays quick whatever the graph).
ROUTE_BUDGET = 20_000
#: The longest ref shown whole in a box (its title holds it all).
REF_SHOWN = 19

#: The states a box has a colour for (``node-STATE``), in the legend's order;
#: any other is ``node-other``.
STATE_ORDER = (
    "blocked",
    "waiting",
    "scheduled",
    "retrying",
    "paused",
    "running",
    "succeeded",
    "failed",
    "cancelled",
    "skipped",
    "unknown",
)
STATE_CLASSES = frozenset(STATE_ORDER)


@dataclass(frozen=True)
class Node:
    """A step's box: its top left corner at (x, y)."""

    ref: str
    state: str
    position: int
    task: str
    job_id: int | None
    level: int
    x: float
    y: float

    @property
    def label(self) -> str:
        """The ref, shortened to fit its box."""
        if len(self.ref) <= REF_SHOWN:
            return self.ref
        return self.ref[: REF_SHOWN - 1] + "…"

    @property
    def css(self) -> str:
        """The class of its colours."""
        return f"node-{self.state if self.state in STATE_CLASSES else 'other'}"

    @property
    def center(self) -> float:
        return self.x + NODE_WIDTH / 2


@dataclass(frozen=True)
class Edge:
    """A link, parent to child, as an SVG path."""

    parent: str
    child: str
    path: str


@dataclass
class Graph:
    """What the template draws."""

    nodes: list[Node] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    width: float = 0
    height: float = 0
    #: The workflow's steps not drawn (past GRAPH_STEPS).
    left_out: int = 0
    #: Some links into the steps drawn may be missing (EDGES_READ were read).
    edges_cut: bool = False
    #: The depths drawn.
    levels: int = 0

    node_width: int = NODE_WIDTH
    node_height: int = NODE_HEIGHT

    @property
    def states(self) -> list[str]:
        """The states of the boxes drawn, in the legend's order."""
        found = {node.state for node in self.nodes}
        return [state for state in STATE_ORDER if state in found]


def depths(refs: Sequence[str], edges: Iterable[tuple[str, str]]) -> dict[str, int]:
    """Each step's depth: the longest path to it from a root (a step none of
    ``refs`` is a parent of), over the ``edges`` (parent, child) among
    ``refs``. A workflow has no cycle; were there one, its steps go below
    the others."""
    known = set(refs)
    children: dict[str, list[str]] = {ref: [] for ref in refs}
    waiting = dict.fromkeys(refs, 0)
    for parent, child in dict.fromkeys(edges):  # a link once
        if parent in known and child in known and parent != child:
            children[parent].append(child)
            waiting[child] += 1
    depth = dict.fromkeys(refs, 0)
    ready = deque(ref for ref in refs if waiting[ref] == 0)
    done = 0
    while ready:
        ref = ready.popleft()
        done += 1
        for child in children[ref]:
            depth[child] = max(depth[child], depth[ref] + 1)
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    if done < len(refs):
        below = max(depth.values(), default=0) + 1
        for ref in refs:
            if waiting[ref] > 0:
                depth[ref] = below
    return depth


def layout(
    steps: Sequence[Mapping[str, Any]],
    edges: Iterable[tuple[str, str]],
    *,
    total: int,
    edges_cut: bool = False,
) -> Graph:
    """The drawing of ``steps`` (rows with ``ref``, ``state``, ``position``,
    ``task_identifier``, ``job_id``, in position order) and the links among
    them, of a workflow of ``total`` steps."""
    ordered = sorted(steps, key=lambda step: int(step["position"]))
    refs = [str(step["ref"]) for step in ordered]
    links = [(parent, child) for parent, child in dict.fromkeys(edges)]
    depth = depths(refs, links)
    levels: dict[int, list[Mapping[str, Any]]] = {}
    for step in ordered:
        levels.setdefault(depth[str(step["ref"])], []).append(step)
    widest = min(max((len(row) for row in levels.values()), default=0), PER_LINE)
    width = 2 * MARGIN + widest * NODE_WIDTH + max(widest - 1, 0) * GAP_X
    nodes: dict[str, Node] = {}
    #: Each line of boxes: its top, and the left of each of its boxes.
    lines: list[tuple[float, list[float]]] = []
    line_of: dict[str, int] = {}
    y = float(MARGIN)
    for level in sorted(levels):
        row = levels[level]
        for start in range(0, len(row), PER_LINE):
            line = row[start : start + PER_LINE]
            line_width = len(line) * NODE_WIDTH + (len(line) - 1) * GAP_X
            x = (width - line_width) / 2
            lines.append((y, []))
            for step in line:
                ref = str(step["ref"])
                nodes[ref] = Node(
                    ref=ref,
                    state=str(step["state"]),
                    position=int(step["position"]),
                    task=str(step["task_identifier"]),
                    job_id=step["job_id"],
                    level=level,
                    x=x,
                    y=y,
                )
                lines[-1][1].append(x)
                line_of[ref] = len(lines) - 1
                x += NODE_WIDTH + GAP_X
            y += NODE_HEIGHT + LINE_GAP
        y += LEVEL_GAP - LINE_GAP
    height = y - LEVEL_GAP + MARGIN if levels else 0
    budget = ROUTE_BUDGET
    drawn = []
    for parent, child in links:
        if parent not in nodes or child not in nodes:
            continue
        if nodes[child].level <= nodes[parent].level:
            continue
        between = lines[line_of[parent] + 1 : line_of[child]]
        if len(between) > budget:
            between = []
        budget -= len(between)
        drawn.append(Edge(parent, child, _route(nodes[parent], nodes[child], between)))
    return Graph(
        nodes=[nodes[ref] for ref in refs],
        edges=drawn,
        width=width if levels else 0,
        height=height,
        left_out=max(total - len(refs), 0),
        edges_cut=edges_cut,
        levels=len(levels),
    )


def _route(parent: Node, child: Node, between: Sequence[tuple[float, list[float]]]) -> str:
    """From the parent's bottom to the child's top (where the arrowhead
    ends): each end moved from the middle towards the other box, so that the
    links into one box arrive apart and those out of one leave apart; across
    each line of boxes ``between`` them, through the gap nearest to where a
    straight link would cross it when that is a box; bending between."""
    shift = max(-SPREAD, min(SPREAD, (child.center - parent.center) * 0.2))
    x1, y1 = parent.center + shift, parent.y + NODE_HEIGHT
    x2, y2 = child.center - shift, child.y - 1
    points = [(x1, y1)]
    for top, lefts in between:
        across = x1 + (x2 - x1) * (top + NODE_HEIGHT / 2 - y1) / (y2 - y1)
        if any(left - CLEARANCE <= across <= left + NODE_WIDTH + CLEARANCE for left in lefts):
            gaps = [left - GAP_X / 2 for left in lefts] + [lefts[-1] + NODE_WIDTH + GAP_X / 2]
            gap = min(gaps, key=lambda x: abs(x - across))
            points += [(gap, top - CLEARANCE), (gap, top + NODE_HEIGHT + CLEARANCE)]
    points.append((x2, y2))
    path = [f"M{x1:.1f},{y1:.1f}"]
    for (xa, ya), (xb, yb) in pairwise(points):
        if xa == xb:
            path.append(f"L{xb:.1f},{yb:.1f}")
        else:
            bend = min((yb - ya) / 2, LEVEL_GAP)
            path.append(f"C{xa:.1f},{ya + bend:.1f} {xb:.1f},{yb - bend:.1f} {xb:.1f},{yb:.1f}")
    return " ".join(path)
