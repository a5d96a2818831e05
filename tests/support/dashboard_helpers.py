"""Serving the dashboard in tests and driving it with a real browser.

The browser is Debian's headless Chromium with its chromedriver, driven by
Selenium. Every wait waits for an event: the server is up when /healthz
answers 200 (polled, with a deadline), a page has loaded when the element a
test looks for is there (Selenium's explicit waits).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import uvicorn
from dbhelpers import cli_path
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from worker_cli.dashboard import create_app
from worker_cli.dashboard.security import Csrf

CHROMIUM = os.environ.get("GRAPHILE_WORKER_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("GRAPHILE_WORKER_CHROMEDRIVER", "/usr/bin/chromedriver")
#: Chromium's flags: headless, and nothing that reaches the network on its own
#: (a closed network refuses those connections, and they would slow it down).
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)
WAIT = 20.0

#: The CSRF secret of the dashboards the tests serve (:func:`dashboard`), a
#: browser's nonce, and the form token and cookie of that browser.
SECRET, NONCE = b"s" * 32, "a-browser"
TOKEN = Csrf(SECRET).token(NONCE)
COOKIE = f"{Csrf.COOKIE}={NONCE}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Reply:
    status: int
    headers: Any
    body: str


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirect)


def http(url: str, *, data: bytes | None = None, headers: dict[str, str] | None = None) -> Reply:
    """One request, redirects not followed, 4xx/5xx returned rather than raised."""
    request = urllib.request.Request(url, data=data, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/x-www-form-urlencoded")
    try:
        with _opener.open(request, timeout=WAIT) as response:
            return Reply(response.status, response.headers, response.read().decode())
    except urllib.error.HTTPError as error:
        return Reply(error.code, error.headers, error.read().decode())


def cookies_set(reply: Reply) -> dict[str, str]:
    """The cookies a response sets: name -> value ("" for one it clears)."""
    found = {}
    for header in reply.headers.get_all("set-cookie") or []:
        name, _, rest = header.partition("=")
        cleared = "max-age=0" in header.lower().replace(" ", "")
        found[name.strip()] = "" if cleared else rest.split(";")[0]
    return found


def with_cookies(cookie: str, reply: Reply) -> str:
    """A ``Cookie`` header: ``cookie``'s, updated with those ``reply`` set or cleared."""
    jar = dict(part.split("=", 1) for part in cookie.split("; ") if part)
    jar.update(cookies_set(reply))
    return "; ".join(f"{name}={value}" for name, value in jar.items() if value)


def follow(base: str, reply: Reply, cookie: str = "") -> Reply:
    """The page a 303 leads to, as a browser asks for it: with its cookies
    (``cookie``) and those the redirect set (an action's notice)."""
    assert reply.status == 303, (reply.status, reply.body[-600:])
    return http(base + reply.headers["location"], headers={"Cookie": with_cookies(cookie, reply)})


def wait_healthy(url: str, process: subprocess.Popen[str] | None = None) -> None:
    """Until ``url``/healthz answers 200 (the server is up and sees the schema)."""
    deadline = time.monotonic() + WAIT
    while True:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the dashboard exited: {process.communicate()}")
        try:
            if http(url + "/healthz").status == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{url}/healthz did not answer 200 within {WAIT}s")
        time.sleep(0.05)


@contextmanager
def serve_cli(db: str, *args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """``graphile-worker dashboard`` on a port the system picks (``--port
    0``: never a fixed one, nor one chosen here and freed again); yields the
    base URL its log line names."""
    process = subprocess.Popen(
        [cli_path(), "dashboard", "-c", db, "--port", "0", "--refresh", "0", *args],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        said = ""
        while (line := process.stderr.readline()) and " on http://" not in line:
            said += line
        found = re.search(r" on (http://[^/ ]+)/", line)
        assert found, f"the dashboard did not say where it listens: {said + line}"
        url = found.group(1)
        wait_healthy(url, process)
        yield url
    finally:
        process.terminate()
        try:
            process.communicate(timeout=WAIT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


@contextmanager
def serve_app(app: Any) -> Iterator[str]:
    """An ASGI app under uvicorn in a thread of this process, on a socket
    bound here to a port the system picks; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + WAIT
        while not server.started:
            assert thread.is_alive(), "uvicorn stopped"
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        yield url
    finally:
        server.should_exit = True
        thread.join(WAIT)
        sock.close()


@contextmanager
def dashboard(db: str, **options: Any) -> Iterator[str]:
    """The dashboard of ``db`` (``create_app`` with ``options``) served with
    the tests' CSRF secret, for the block: its base URL."""
    with serve_app(create_app(db, csrf_secret=SECRET, **options)) as base:
        yield base


def require_browser() -> None:
    """Skip (fail under CI) when Chromium or its driver is missing."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not shutil.which(path)]
    if missing:
        reason = (
            f"{' and '.join(missing)} not found: install Debian's chromium and chromium-driver "
            "(apt-get install chromium chromium-driver; .ci/run does)"
        )
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


@contextmanager
def chromium() -> Iterator[WebDriver]:
    require_browser()
    profile = tempfile.mkdtemp(prefix="dashboard-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for(driver: WebDriver, css: str) -> WebElement:
    """The element, once the page shows it."""
    return WebDriverWait(driver, WAIT).until(
        expected_conditions.presence_of_element_located((By.CSS_SELECTOR, css))
    )


def wait_for_text(driver: WebDriver, css: str, text: str) -> WebElement:
    WebDriverWait(driver, WAIT).until(
        expected_conditions.text_to_be_present_in_element((By.CSS_SELECTOR, css), text)
    )
    return driver.find_element(By.CSS_SELECTOR, css)


def click(driver: WebDriver, css: str) -> None:
    """Click an element and wait for the page it leads to replacing this one:
    a mark set on this page's window is gone from the next page's, once that
    page has loaded. (Waiting for this page's elements to go stale instead
    asked the old document about an element while Chromium tore it down, and
    chromedriver answered "Node with given id does not belong to the document".)
    While the document changes, a script may fail or find the old one; the
    wait asks again until the new one answers."""
    driver.execute_script("window.__leaving = true;")
    WebDriverWait(driver, WAIT).until(
        expected_conditions.element_to_be_clickable((By.CSS_SELECTOR, css))
    ).click()
    WebDriverWait(driver, WAIT, ignored_exceptions=(WebDriverException,)).until(
        lambda driver: driver.execute_script(
            "return window.__leaving !== true && document.readyState === 'complete';"
        )
    )
    wait_for(driver, "#content")


def console_errors(driver: WebDriver) -> list[str]:
    """The browser's console errors (a Content-Security-Policy violation is one)."""
    return [
        entry["message"]
        for entry in driver.get_log("browser")  # type: ignore[no-untyped-call]
        if entry["level"] == "SEVERE" and "favicon.ico" not in entry["message"]
    ]
