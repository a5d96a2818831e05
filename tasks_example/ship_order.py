"""Task `ship_order`: a typed payload, built from the job's JSON.

SELECT graphile_worker.add_job('ship_order', '{"order_id": 7, "lines": [{"sku": "A", "qty": 2}]}');

The task gets a `ShipOrder`, not a dict. From Python the class names its task:
`await utils.add_job(ShipOrder(order_id=7, lines=[Line("A", 2)]))`. A payload
that does not fit (`'{"lines": []}'`) never reaches the task: the job fails for
good with `PayloadError: payload.order_id: missing`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from worker_cli import Helpers


@dataclass
class Line:
    sku: str
    qty: int


@dataclass
class ShipOrder:
    IDENTIFIER: ClassVar[str] = "ship_order"
    order_id: int
    lines: list[Line]
    note: str | None = None


async def task(payload: ShipOrder, helpers: Helpers) -> None:
    items = sum(line.qty for line in payload.lines)
    helpers.logger.info(f"shipping order {payload.order_id}: {items} item(s)")
