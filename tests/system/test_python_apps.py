"""The "Python applications" guide (docs/guides/python-apps.md), run as written.

Each code block that starts with ``# <file>`` is written to that file; the
quickstart's shell block is run with bash; the recipes run with the real
Django, SQLAlchemy, FastAPI and uvicorn (test dependencies only): a view
inside ``transaction.atomic()``, a ``Session`` transaction, and an app whose
lifespan runs the worker. Each checks that a committed transaction adds a job
that runs, and that a rolled-back one adds none.
"""

from __future__ import annotations

import importlib.util
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import psycopg
import pytest
from dbhelpers import rows, run_cli, value
from pg_server import PgServer
from psycopg.conninfo import conninfo_to_dict
from readme_blocks import BIN, app_env, blocks, write_files

pytestmark = pytest.mark.db

ROOT = Path(__file__).resolve().parents[2]
JOBS = "graphile_worker._private_jobs"


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ORDERS = (
    "create table orders (id serial primary key, item text not null, receipt_sent_at timestamptz)"
)


def test_the_web_app_quickstart_as_written(empty_db: str, tmp_path: Path) -> None:
    files = write_files("### Quickstart: a web app", tmp_path)
    assert set(files) == {"tasks/send_receipt.py", "app.py"}
    [commands] = blocks("### Quickstart: a web app", "bash")
    result = subprocess.run(
        ["bash", "-e", "-c", commands],
        cwd=tmp_path,
        env=app_env(empty_db),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "order 1\n"
    assert "Sending the receipt for order 1" in result.stderr
    assert value(empty_db, "select count(*) from orders") == 1
    assert value(empty_db, f"select count(*) from {JOBS}") == 0


# --- Django ---------------------------------------------------------------------

URLS = """
import psycopg
from django.db import transaction
from django.urls import path

from shop import views
from shop.jobs import worker_utils
from shop.models import Order

OTHER_SESSION: list[str] = []  # the test's database URL
SEEN_BEFORE_COMMIT: list[int] = []


def place_order_then_fail(request):
    with transaction.atomic():
        order = Order.objects.create(item=request.POST["item"])
        with worker_utils() as utils:
            utils.add_job("send_receipt", {"order_id": order.pk})
        with psycopg.connect(OTHER_SESSION[0]) as other:
            (count,) = other.execute("select count(*) from graphile_worker.jobs").fetchone()
        SEEN_BEFORE_COMMIT.append(count)
        raise RuntimeError("payment refused")


urlpatterns = [
    path("orders", views.place_order),
    path("orders-failing", place_order_then_fail),
]
"""


@pytest.fixture(scope="module")
def django_site(
    pg: PgServer, migrated_template: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, ModuleType]]:
    """Django configured on a fresh database, with the guide's shop app."""
    import django
    from django.conf import settings

    site = tmp_path_factory.mktemp("django_site")
    files = write_files("## Django views and models", site)
    assert set(files) == {"shop/models.py", "shop/jobs.py", "shop/views.py"}
    (site / "shop" / "__init__.py").write_text("")
    (site / "shop_urls.py").write_text(URLS)
    sys.path.insert(0, str(site))
    with pg.database(template=migrated_template) as db:
        params = conninfo_to_dict(db)
        settings.configure(
            SECRET_KEY="test",
            ALLOWED_HOSTS=["testserver"],
            ROOT_URLCONF="shop_urls",
            INSTALLED_APPS=["shop"],
            MIDDLEWARE=[],
            USE_TZ=True,
            DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
            DATABASES={
                "default": {
                    "ENGINE": "django.db.backends.postgresql",
                    "NAME": params["dbname"],
                    "USER": params.get("user", ""),
                    "PASSWORD": params.get("password", ""),
                    "HOST": params.get("host", ""),
                    "PORT": params.get("port", ""),
                }
            },
        )
        django.setup()
        import shop_urls  # type: ignore[import-not-found]
        from django.db import connection, connections
        from shop.models import Order  # type: ignore[import-not-found]

        with connection.schema_editor() as editor:
            editor.create_model(Order)
        shop_urls.OTHER_SESSION.append(db)
        try:
            yield db, shop_urls
        finally:
            connections.close_all()
            sys.path.remove(str(site))


def test_django_view_in_atomic_commits_the_job_with_the_order(
    django_site: tuple[str, ModuleType], tmp_path: Path
) -> None:
    from django.db import connection
    from django.test import Client

    db, _ = django_site
    response = Client().post("/orders", {"item": "book"})
    assert response.status_code == 200, response.content
    order_id = response.json()["order_id"]
    assert isinstance(connection.connection, psycopg.Connection)  # Django's, psycopg 3
    [job] = rows(db, "select task_identifier from graphile_worker.jobs")
    assert job == {"task_identifier": "send_receipt"}
    assert value(db, f"select payload from {JOBS}") == {"order_id": order_id}

    # The job runs: the quickstart's task, in a worker.
    write_files("### Quickstart: a web app", tmp_path)
    result = run_cli("-c", db, "--once", "--tasks", str(tmp_path / "tasks"))
    assert result.returncode == 0, result.stderr
    assert f"Sending the receipt for order {order_id}" in result.stderr
    assert value(db, f"select count(*) from {JOBS}") == 0


def test_django_view_that_raises_adds_no_job(django_site: tuple[str, ModuleType]) -> None:
    from django.test import Client

    db, urls = django_site
    orders = value(db, "select count(*) from shop_order")
    jobs = value(db, f"select count(*) from {JOBS}")
    with pytest.raises(RuntimeError, match="payment refused"):
        Client().post("/orders-failing", {"item": "lamp"})
    seen: list[int] = urls.SEEN_BEFORE_COMMIT
    assert seen == [jobs]  # not visible to others before the commit
    assert value(db, "select count(*) from shop_order") == orders
    assert value(db, f"select count(*) from {JOBS}") == jobs


# --- SQLAlchemy -----------------------------------------------------------------


@pytest.fixture
def orders_module(db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    files = write_files("### SQLAlchemy", tmp_path)
    assert set(files) == {"orders.py"}
    monkeypatch.setenv("SQLALCHEMY_URL", re.sub(r"^postgres(ql)?://", "postgresql+psycopg://", db))
    module = load(files["orders.py"], "readme_orders")
    module.Base.metadata.create_all(module.engine)
    try:
        yield module
    finally:
        module.engine.dispose()


def test_sqlalchemy_session_commit_and_rollback(db: str, orders_module: Any) -> None:
    from sqlalchemy import text
    from sqlalchemy.orm import Session

    [usage] = [b for b in blocks("### SQLAlchemy", "python") if not b.startswith("# ")]
    sys.modules["orders"] = orders_module
    try:
        exec(usage, {})  # as written: `with Session(engine) as session, session.begin(): ...`
    finally:
        del sys.modules["orders"]
    assert value(db, f"select payload from {JOBS}") == {
        "order_id": value(db, "select id from orders")
    }

    with pytest.raises(RuntimeError), Session(orders_module.engine) as session, session.begin():
        orders_module.place_order(session, "lamp")
        assert value(db, f"select count(*) from {JOBS}") == 1  # the new one: not yet
        raise RuntimeError("rolled back")
    assert value(db, "select count(*) from orders") == 1
    assert value(db, f"select count(*) from {JOBS}") == 1

    # A Core connection's transaction, as the guide says.
    from worker_cli import make_sync_worker_utils

    with orders_module.engine.begin() as conn:
        conn.execute(text("insert into orders (item) values ('pen')"))
        with make_sync_worker_utils(connection=conn.connection.driver_connection) as utils:
            utils.add_job("send_receipt", {"order_id": 99})
        assert value(db, f"select count(*) from {JOBS}") == 1
    assert value(db, f"select count(*) from {JOBS}") == 2


# --- FastAPI --------------------------------------------------------------------


class Lines:
    """The lines a process writes to stderr, read by a thread as they come."""

    def __init__(self, stream: Any) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, text: str, within: float = 60.0) -> None:
        deadline = time.monotonic() + within
        while not any(text in line for line in self.seen):
            line = self._queue.get(timeout=max(deadline - time.monotonic(), 0.001))
            assert line is not None, f"the process ended before {text!r}:\n{''.join(self.seen)}"
            self.seen.append(line)


def test_fastapi_lifespan_runs_the_worker_and_requests_add_jobs(db: str, tmp_path: Path) -> None:
    files = write_files("### FastAPI", tmp_path)
    assert set(files) == {"app.py"}
    [command] = blocks("### FastAPI", "bash")
    assert command.strip() == "uvicorn app:app"
    rows(db, ORDERS)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = subprocess.Popen(
        [f"{BIN}/uvicorn", "app:app", "--fd", str(listener.fileno())],
        cwd=tmp_path,
        env=app_env(db),
        pass_fds=[listener.fileno()],
        stderr=subprocess.PIPE,
        text=True,
    )
    listener.close()
    assert server.stderr is not None
    lines = Lines(server.stderr)
    try:
        lines.wait_for("Application startup complete")
        response = httpx.post(f"http://127.0.0.1:{port}/orders", params={"item": "book"})
        assert response.status_code == 200, response.text
        order_id = response.json()["order_id"]
        # The task's update commits inside the task; the job row is deleted
        # later, when the worker writes the result: wait for that.
        deadline = time.monotonic() + 30
        while jobs := rows(db, f"select attempts, last_error from {JOBS}"):
            assert time.monotonic() < deadline, f"the job was not completed: {jobs}"
            time.sleep(0.02)
        receipt = "select receipt_sent_at from orders where id = %s"
        assert value(db, receipt, (order_id,)) is not None
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=30)
    lines.wait_for("Application shutdown complete")
    # uvicorn ends a clean shutdown by raising the signal it caught again.
    assert code in (0, -signal.SIGTERM), "".join(lines.seen)
    # runner.stop() ran: the worker removed its heartbeat row and left nothing locked.
    assert value(db, "select count(*) from graphile_worker._private_py_heartbeats") == 0
