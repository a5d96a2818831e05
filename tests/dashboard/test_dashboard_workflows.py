"""The Workflows pages over plain HTTP: the list (newest first, by state, by
keyset), a workflow's page (its steps drawn as an inline SVG graph, by depth,
coloured by state; a table of its steps a page at a time), values escaped,
a 10,000-step workflow drawn within bounds, and cancel and retry: CSRF,
confirmed, refused read-only."""

from __future__ import annotations

import asyncio
import html
import re
import time
from typing import Any
from urllib.parse import urlencode

import pytest
from dashboard_helpers import COOKIE, TOKEN, Reply, dashboard, follow, http
from dashboard_notices import assert_done, assert_refused
from dbhelpers import rows, value

from worker_cli import Helpers, WorkerUtils, Workflow, run_once
from worker_cli.dashboard import workflow_graph, workflow_pages

pytestmark = pytest.mark.db

WORKFLOWS = "graphile_worker._private_py_workflows"
STEPS = "graphile_worker._private_py_workflow_steps"


async def drain(db: str, tasks: dict[str, Any]) -> None:
    async with asyncio.timeout(60):
        assert await run_once(db, task_list=tasks, no_handle_signals=True) == 0


async def ok(payload: Any, helpers: Helpers) -> Any:
    return payload


def failing(message: str) -> Any:
    async def fail(payload: Any, helpers: Helpers) -> None:
        raise ValueError(message)

    return fail


def get(url: str, **headers: str) -> Reply:
    reply = http(url, headers=headers)
    assert reply.status == 200, (reply.status, reply.body[-600:])
    return reply


def post(url: str, fields: dict[str, str], cookie: str = COOKIE) -> Reply:
    return http(url, data=urlencode(fields).encode(), headers={"Cookie": cookie})


def listed(page: Reply) -> list[int]:
    """The ids of the workflows the list shows, in its order."""
    return [int(found) for found in re.findall(r'<tr data-workflow="(\d+)">', page.body)]


def graph_of(page: Reply) -> str:
    found = re.search(r'<svg class="workflow-graph".*?</svg>', page.body, re.S)
    assert found is not None, page.body[-2000:]
    return found.group(0)


def nodes(page: Reply) -> dict[str, tuple[str, str, int]]:
    """The graph's boxes: ref -> (state class, state, depth)."""
    return {
        html.unescape(ref): (css, state, int(level))
        for css, ref, state, level in re.findall(
            r'<g class="graph-node node-(\w+)" data-ref="([^"]*)" data-state="(\w+)" '
            r'data-level="(\d+)">',
            graph_of(page),
        )
    }


def edges(page: Reply) -> set[tuple[str, str]]:
    return {
        (html.unescape(parent), html.unescape(child))
        for parent, child in re.findall(
            r'<path class="graph-edge" d="M[^"]+" marker-end="url\(#graph-arrow\)" '
            r'data-parent="([^"]*)" data-child="([^"]*)">',
            graph_of(page),
        )
    }


def table_refs(page: Reply) -> list[str]:
    return [
        html.unescape(ref) for ref in re.findall(r'<tr data-ref="([^"]*)" data-position', page.body)
    ]


def order_workflow(name: str = "order") -> Workflow:
    """check, then charge and pack (both after check), then ship after both,
    and a refund if check fails; check fails when its task does."""
    wf = Workflow(name)
    check = wf.add("check", max_attempts=1)
    charge = wf.add("charge", after=[check], max_attempts=1)
    pack = wf.add("pack", after=[check])
    wf.add("ship", after=[charge, pack, check])
    wf.add("refund", after=[check], run_if="failed")
    return wf


# --- the list -------------------------------------------------------------------


async def test_the_list_newest_first_by_state_and_by_keyset(
    db: str, utils: WorkerUtils, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = await utils.add_workflow(order_workflow("done"))
    await drain(db, {"check": ok, "charge": ok, "pack": ok, "ship": ok, "refund": ok})
    broken = await utils.add_workflow(order_workflow("broken"))
    await drain(db, {"check": ok, "charge": failing("card declined"), "pack": ok, "ship": ok})
    waiting = [(await utils.add_workflow(order_workflow(f"w{n}"))).id for n in range(3)]

    page = get(url + "/workflows")
    assert 'id="nav-workflows" class="active"' in page.body
    assert listed(page) == [*reversed(waiting), broken.id, done.id]
    row = page.body.split(f'<tr data-workflow="{broken.id}">')[1].split("</tr>")[0]
    assert f'href="/workflows/{broken.id}"' in row and ">broken</a>" in row
    assert "badge-failed" in row
    # Its counts: check, pack succeeded, charge failed, ship cancelled, refund skipped.
    counts = dict(re.findall(r'data-count="(\w+)">([\d,]+)', row))
    assert counts == {
        "succeeded": "2",
        "failed": "1",
        "cancelled": "1",
        "skipped": "1",
        "left": "0",
        "total": "5",
    }

    assert listed(get(url + "/workflows?state=failed")) == [broken.id]
    assert listed(get(url + "/workflows?state=succeeded")) == [done.id]
    assert listed(get(url + "/workflows?state=running")) == list(reversed(waiting))
    bad = http(url + "/workflows?state=nope")
    assert bad.status == 400 and "unknown state &#39;nope&#39;" in bad.body
    assert len(listed(bad)) == 5

    # Pages of two, by keyset: the cursor is the last id shown.
    monkeypatch.setattr(workflow_pages, "WORKFLOWS_PAGE_SIZE", 2)
    seen: list[int] = []
    link: str | None = "/workflows"
    while link is not None:
        page = get(url + html.unescape(link))
        seen += listed(page)
        found = re.search(r'id="older-page" href="([^"]+)"', page.body)
        link = found.group(1) if found else None
    assert seen == [*reversed(waiting), broken.id, done.id]
    running = get(url + f"/workflows?state=running&before={waiting[2]}")
    assert listed(running) == [waiting[1], waiting[0]]
    assert 'id="older-page"' not in running.body

    # A rare state past the window: the page says how far it searched.
    monkeypatch.setattr(workflow_pages, "WINDOW", 3)
    rare = get(url + "/workflows?state=succeeded")
    assert listed(rare) == []
    assert "among the 3 workflows searched" in rare.body
    older = re.search(r'id="older-page" href="([^"]+)">Search older workflows', rare.body)
    assert older is not None
    assert listed(get(url + html.unescape(older.group(1)))) == [done.id]


# --- a workflow's page ----------------------------------------------------------


async def test_a_workflow_page_draws_its_steps_by_depth(
    db: str, utils: WorkerUtils, url: str
) -> None:
    added = await utils.add_workflow(order_workflow())
    await drain(db, {"check": ok, "charge": failing("card declined\nsecond line"), "pack": ok})
    page = get(f"{url}/workflows/{added.id}")
    assert 'id="nav-workflows" class="active"' in page.body
    assert "badge-failed" in page.body.split('id="workflow-state"')[1][:200]
    # Every step a box, coloured by its state, at its depth: the longest
    # path to it (ship waits for check directly, but for charge too).
    assert nodes(page) == {
        "check": ("succeeded", "succeeded", 0),
        "charge": ("failed", "failed", 1),
        "pack": ("succeeded", "succeeded", 1),
        "refund": ("skipped", "skipped", 1),
        "ship": ("cancelled", "cancelled", 2),
    }
    assert edges(page) == {
        ("check", "charge"),
        ("check", "pack"),
        ("check", "refund"),
        ("check", "ship"),
        ("charge", "ship"),
        ("pack", "ship"),
    }
    svg = graph_of(page)
    for ref in ("check", "charge", "pack", "refund", "ship"):
        assert f">{ref}</text>" in svg
    # Boxes with a job link to it; the table too, with the error's first line.
    jobs = {r["ref"]: r["job_id"] for r in rows(db, f"select ref, job_id from {STEPS}")}
    assert f'<a href="/jobs/{jobs["charge"]}">' in svg
    assert table_refs(page) == ["check", "charge", "pack", "ship", "refund"]
    charge = page.body.split('<tr data-ref="charge"')[1].split("</tr>")[0]
    assert f'<a href="/jobs/{jobs["charge"]}">charge</a>' in charge
    assert "ValueError: card declined</code>" in charge and "second line" not in charge
    assert jobs["ship"] is None
    assert ">ship</td>" in page.body.split('<tr data-ref="ship"')[1].split("</tr>")[0]
    assert "graph-left-out" not in page.body  # every step drawn
    assert 'id="next-steps"' not in page.body


async def test_unknown_and_bad_workflow_ids(db: str, url: str) -> None:
    unknown = http(url + "/workflows/12345")
    assert unknown.status == 404 and "no workflow has the id 12345" in unknown.body
    bad = http(url + "/workflows/12x")
    assert bad.status == 404 and "is not a workflow id" in bad.body
    assert http(url + "/workflows/12345/cancel").status == 404
    assert http(url + "/workflows/1/explode").status == 404


async def test_refs_names_and_errors_are_escaped(db: str, utils: WorkerUtils, url: str) -> None:
    wf = Workflow("<b>bold</b>")
    evil = wf.add("evil", ref="<script>alert(1)</script>", max_attempts=1)
    wf.add("after", ref='"><img src=x onerror=alert(2)>', after=[evil], run_if="finished")
    added = await utils.add_workflow(wf)
    await drain(db, {"evil": failing("<img src=y onerror=alert(3)>"), "after": ok})
    await utils.retry_workflow(added.id)  # running again: the buttons show
    await utils.cancel_workflow(added.id, "<i>why</i>")
    for path in ("/workflows", f"/workflows/{added.id}", f"/workflows/{added.id}/retry"):
        body = get(url + path).body
        assert "<script>alert" not in body and "<b>bold" not in body, path
        assert "<img src=" not in body and "<i>why" not in body, path
        assert "&lt;b&gt;bold&lt;/b&gt;" in body, path
    page = get(f"{url}/workflows/{added.id}")
    svg = graph_of(page)
    assert 'data-ref="&lt;script&gt;alert(1)&lt;/script&gt;"' in svg
    assert ">&lt;script&gt;alert(1)&lt;/…</text>" in svg  # shortened to fit its box
    assert "<title>&lt;script&gt;alert(1)&lt;/script&gt;: " in svg  # whole in its title
    assert 'data-child="&#34;&gt;&lt;img src=x onerror=alert(2)&gt;"' in svg
    assert "&lt;i&gt;why&lt;/i&gt;" in page.body
    assert table_refs(page) == ["<script>alert(1)</script>", '"><img src=x onerror=alert(2)>']


async def test_a_10000_step_workflow_draws_a_bounded_graph_quickly(
    db: str, utils: WorkerUtils, url: str
) -> None:
    """A root, 9,998 steps after it, and a last one after them all: 500 boxes
    are drawn (the first by position), the rest are said to be left out, and
    the table pages through every step, 100 at a time."""
    wf = Workflow("big")
    root = wf.add("split")
    parts = [wf.add("part", {"n": n}, ref=f"part-{n}", after=[root]) for n in range(9_998)]
    wf.add("join", after=parts)
    added = await utils.add_workflow(wf)
    assert added.steps == 10_000
    get(f"{url}/workflows/{added.id}")  # the connection pool opened, the schema checked
    started = time.monotonic()
    page = get(f"{url}/workflows/{added.id}")
    took = time.monotonic() - started
    assert took < 1.0, took  # about 0.05 s here
    drawn = nodes(page)
    assert len(drawn) == workflow_graph.GRAPH_STEPS == 500
    assert drawn["split"] == ("waiting", "waiting", 0)
    assert drawn["part-498"] == ("blocked", "blocked", 1)
    assert "part-499" not in drawn and "join" not in drawn
    assert len(edges(page)) == 499
    assert re.search(r"the other\s+9,500 are not", page.body)
    assert len(table_refs(page)) == workflow_pages.STEPS_PAGE_SIZE == 100
    assert "(1\N{EN DASH}100 of 10,000," in page.body
    # The next pages: within the steps drawn, then past them, then the last.
    link = re.search(r'id="next-steps" href="([^"]+)"', page.body)
    assert link is not None and html.unescape(link.group(1)).endswith("?after=100")
    second = get(url + html.unescape(link.group(1)))
    assert table_refs(second)[0] == "part-99" and len(table_refs(second)) == 100
    deep = get(f"{url}/workflows/{added.id}?after=600")
    assert table_refs(deep)[:2] == ["part-599", "part-600"]
    last = get(f"{url}/workflows/{added.id}?after=9900")
    assert table_refs(last)[-1] == "join" and len(table_refs(last)) == 100
    assert 'id="next-steps"' not in last.body
    assert f'id="previous-steps" href="/workflows/{added.id}?after=9800"' in last.body
    assert http(f"{url}/workflows/{added.id}?after=-1").status == 400


# --- cancel and retry -----------------------------------------------------------


async def test_cancel_and_retry_confirmed_by_post_with_csrf(
    db: str, utils: WorkerUtils, url: str
) -> None:
    added = await utils.add_workflow(order_workflow())
    await drain(db, {"check": ok, "charge": failing("card declined"), "pack": ok})
    wf_url = f"{url}/workflows/{added.id}"
    page = get(wf_url)
    assert 'id="action-retry-workflow"' in page.body
    assert 'id="action-cancel-workflow"' not in page.body  # it has finished

    confirm = get(wf_url + "/retry")
    assert "Its 1 failed and 1 cancelled steps run again" in confirm.body
    cookie = confirm.headers["set-cookie"].split(";")[0]
    token = re.search(r'name="csrf_token" value="([0-9a-f]+)"', confirm.body)
    assert token is not None
    assert post(wf_url + "/retry", {}, cookie).status == 403  # no token
    assert post(wf_url + "/retry", {"csrf_token": "0" * 64}, cookie).status == 403
    assert value(db, f"select state from {WORKFLOWS}") == "failed"
    done = post(wf_url + "/retry", {"csrf_token": token.group(1)}, cookie)
    assert done.status == 303 and done.headers["location"] == f"/workflows/{added.id}"
    assert_done(follow(url, done, cookie), f"Workflow {added.id} runs again: 2 steps")
    assert value(db, f"select state from {WORKFLOWS}") == "running"
    states = {r["ref"]: r["state"] for r in rows(db, f"select ref, state from {STEPS}")}
    assert states == {
        "check": "succeeded",
        "pack": "succeeded",
        "refund": "skipped",
        "charge": "queued",
        "ship": "blocked",
    }
    again = post(wf_url + "/retry", {"csrf_token": TOKEN})
    assert_refused(follow(url, again, COOKIE), "has no failed or cancelled step to run again")

    page = get(wf_url)
    assert 'id="action-cancel-workflow"' in page.body
    assert 'id="action-retry-workflow"' not in page.body
    assert "It ends when they stop" in get(wf_url + "/cancel").body
    cancelled = post(wf_url + "/cancel", {"csrf_token": TOKEN, "reason": "customer left"})
    assert cancelled.status == 303
    assert_done(follow(url, cancelled, COOKIE), f"Workflow {added.id} was cancelled")
    row = rows(db, f"select state, cancel_reason from {WORKFLOWS}")[0]
    # charge, waiting again since the retry, is cancelled with it.
    assert (row["state"], row["cancel_reason"]) == ("cancelled", "customer left")
    assert "customer left" in get(wf_url).body
    twice = post(wf_url + "/cancel", {"csrf_token": TOKEN})
    finished = f"Workflow {added.id} had already finished (cancelled)"
    assert_refused(follow(url, twice, COOKIE), finished)
    gone = post(f"{url}/workflows/{added.id + 1}/retry", {"csrf_token": TOKEN})
    assert gone.headers["location"] == "/workflows"
    assert_refused(follow(url, gone, COOKIE), f"Workflow {added.id + 1} no longer exists")


async def test_read_only_refuses_the_workflow_actions(db: str, utils: WorkerUtils) -> None:
    added = await utils.add_workflow(order_workflow())
    with dashboard(db, refresh=0, read_only=True) as url:
        page = get(f"{url}/workflows/{added.id}")
        assert "workflow-actions" not in page.body
        assert http(f"{url}/workflows/{added.id}/cancel").status == 403
        for action in ("cancel", "retry"):
            reply = post(f"{url}/workflows/{added.id}/{action}", {"csrf_token": TOKEN})
            assert reply.status == 403 and "read-only" in reply.body
    assert value(db, f"select state from {WORKFLOWS}") == "running"
    assert value(db, f"select cancel_requested_at from {WORKFLOWS}") is None
    with dashboard(db, refresh=0) as url:
        assert 'id="action-cancel-workflow"' in get(f"{url}/workflows/{added.id}").body
        reply = post(f"{url}/workflows/{added.id}/cancel", {"csrf_token": TOKEN})
        assert reply.status == 303
    assert value(db, f"select state from {WORKFLOWS}") == "cancelled"
