"""What stands between the dashboard and a stranger: HTTP Basic
authentication, CSRF tokens on every form, security headers on every
response, and the rule that only loopback may be served without a password.

- **Authentication** (:class:`BasicAuth`): one user and password, from
  ``--auth USER:PASSWORD`` or ``GRAPHILE_WORKER_DASHBOARD_AUTH``. Every path
  but ``/healthz`` asks for it (a load balancer's health check carries no
  credentials, and ``/healthz`` says nothing but ``ok``). Mounted in an
  application, the dashboard can be left without it, behind the
  application's own authentication.
- **CSRF** (:class:`Csrf`): each browser gets a random nonce in a cookie
  (``HttpOnly``, ``SameSite=Strict``, on the dashboard's path); every form
  carries ``HMAC(secret, nonce)``; a POST whose token does not match its
  cookie, or that a browser marks as cross-site (``Sec-Fetch-Site``), is
  refused before anything runs. The HMAC means a cookie planted by a sibling
  subdomain is of no use without the server's secret. The same secret signs
  the one-time notice cookie an action leaves for its page
  (:meth:`Csrf.sign`, under a key derived for that use; see ``notices``).
- **Hosts** (:class:`AllowedHosts`): a request whose ``Host`` header is not
  the address it reached, ``localhost`` or a configured name gets a plain
  400, before anything else. Without it, a web page whose host name is
  rebound to 127.0.0.1 (DNS rebinding) would be same-origin with a
  loopback-only dashboard, and read it. ``graphile-worker dashboard`` always
  checks; a mounted dashboard checks when given ``allowed_hosts`` (else the
  application in front decides).
- **Origin**: a POST whose ``Origin`` (or, without one, ``Referer``) names
  another host than its ``Host`` or an allowed name, or that the browser
  marks as from another site (``Sec-Fetch-Site``), is refused
  (:func:`foreign_post`).
- **Headers** (:class:`SecurityHeaders`): a Content-Security-Policy allowing
  nothing but the dashboard's own script, stylesheet and icon (no inline
  script or style, no other origin: the pages work offline), no framing, no
  MIME sniffing, no referrer to other sites; pages are not cached.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import re
import secrets
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "ALLOWED_HOSTS_ENVVAR",
    "AUTH_ENVVAR",
    "CONTENT_SECURITY_POLICY",
    "AllowedHosts",
    "BasicAuth",
    "Csrf",
    "SecurityHeaders",
    "foreign_post",
    "host_name",
    "is_loopback",
    "route_path",
]

#: The environment variable holding ``USER:PASSWORD`` (``--auth``'s).
AUTH_ENVVAR = "GRAPHILE_WORKER_DASHBOARD_AUTH"
#: The environment variable of ``--allowed-host`` (names separated by spaces or commas).
ALLOWED_HOSTS_ENVVAR = "GRAPHILE_WORKER_DASHBOARD_ALLOWED_HOSTS"

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    ]
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class BasicAuth:
    """One user name and password for HTTP Basic authentication."""

    username: str
    password: str

    def __repr__(self) -> str:  # never print the password
        return f"BasicAuth(username={self.username!r}, password='***')"

    @classmethod
    def parse(cls, text: str) -> BasicAuth:
        """``USER:PASSWORD`` (split at the first colon; the password may hold
        more); ValueError naming what is wrong."""
        username, colon, password = text.partition(":")
        if not colon or not username or not password:
            raise ValueError("expected USER:PASSWORD, with a non-empty user and password")
        return cls(username, password)

    def accepts(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header carries these credentials
        (compared in constant time)."""
        if not authorization:
            return False
        scheme, _, encoded = authorization.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        expected = f"{self.username}:{self.password}".encode()
        return hmac.compare_digest(decoded, expected)


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback address
    (``127.0.0.1``, ``::1``, ``localhost``); a name that does not resolve is not."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    addresses = {info[4][0] for info in infos}
    return bool(addresses) and all(
        ipaddress.ip_address(str(address).split("%")[0]).is_loopback for address in addresses
    )


_NAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*")


def host_name(value: str | None) -> str | None:
    """The host of a ``Host`` header (``name:port``, ``[::1]:port``) or of a
    URL: lowercased, without port, brackets or a final dot; None when it is
    not a host name or an IP address."""
    if not value:
        return None
    if "//" not in value:  # a Host header: nothing but the host and port
        if re.search(r"[/?#@\\\s]", value):
            return None
        value = "//" + value
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 (a port that is not a number raises ValueError)
    except ValueError:
        return None
    name = (parts.hostname or "").rstrip(".")
    if parts.username is not None or parts.password is not None:
        return None
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        pass
    return name if _NAME.fullmatch(name) else None


class AllowedHosts:
    """The host names a dashboard answers to: ``localhost``, the names given,
    and the address each request reached (its listening address: ``[::1]``,
    ``127.0.0.1``, or the machine's address on a wildcard ``--host``)."""

    def __init__(self, names: Iterable[str]) -> None:
        """``names``: host names or addresses, each ``name`` or ``name:port``
        (the port is not compared), several in one string separated by
        spaces or commas; ValueError naming one that is not a host."""
        self.names = {"localhost"}
        for text in names:
            for item in re.split(r"[\s,]+", text.strip()):
                if not item:
                    continue
                try:  # an IPv6 address without its brackets too
                    name: str | None = str(ipaddress.ip_address(item.strip("[]")))
                except ValueError:
                    name = host_name(item)
                if name is None or "/" in item:
                    raise ValueError(f"{item!r} is not a host name or address (no scheme, no path)")
                self.names.add(name)

    def allows(self, name: str | None, scope: Scope) -> bool:
        """Whether ``name`` (from :func:`host_name`) is one of them."""
        if name is None:
            return False
        if name in self.names:
            return True
        server = scope.get("server")
        return server is not None and host_name(str(server[0])) == name


def foreign_post(headers: Mapping[str, str], hosts: AllowedHosts | None) -> str | None:
    """Why a POST comes from another site (the browser says so, or its
    ``Origin``, else its ``Referer``, names another host than the request's
    ``Host`` or an allowed name), or None. A request with neither header is
    no browser's form post: its CSRF token decides. ``X-Forwarded-Host`` is
    not read: any client may send it, and no setting says which proxy to
    trust (uvicorn's ``--forwarded-allow-ips`` covers only the client's
    address and scheme); behind a proxy that rewrites ``Host``, the name the
    browser uses is an allowed name (``--allowed-host``, ``allowed_hosts``)."""
    if headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return "a form posted from another site is refused"
    source = headers.get("origin") or headers.get("referer")
    if source is None:
        return None
    name = host_name(source) if source != "null" else None
    own = host_name(headers.get("host"))
    if name is not None and (name == own or (hosts is not None and name in hosts.names)):
        return None
    return "a form posted from another site (its Origin or Referer names another host) is refused"


def route_path(scope: Scope) -> str:
    """The request's path inside the dashboard (without the prefix it is mounted at)."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        return path[len(root) :] or "/"
    return path


class Csrf:
    """Tokens for the forms: ``HMAC(secret, nonce)``, the nonce in a cookie."""

    COOKIE = "graphile_worker_dashboard_csrf"
    FIELD = "csrf_token"

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    @staticmethod
    def new_nonce() -> str:
        return secrets.token_urlsafe(32)

    def token(self, nonce: str) -> str:
        return hmac.new(self._secret, nonce.encode(), hashlib.sha256).hexdigest()

    def sign(self, purpose: str, message: str) -> str:
        """``message``'s signature for one ``purpose`` (the flash notice):
        under a key derived from the secret for it, so that no signature of
        one use (a form's token) is one of another."""
        key = hmac.new(
            self._secret, b"graphile-worker dashboard: " + purpose.encode(), hashlib.sha256
        )
        return hmac.new(key.digest(), message.encode(), hashlib.sha256).hexdigest()

    def signed(self, purpose: str, message: str, signature: str) -> bool:
        """Whether ``signature`` is :meth:`sign`'s of ``message`` (constant time)."""
        return hmac.compare_digest(self.sign(purpose, message).encode(), signature.encode())

    def valid(self, nonce: str | None, token: str | None) -> bool:
        """Whether a form's token belongs to the browser's nonce."""
        if not nonce or not token:
            return False
        # As bytes: compare_digest refuses a str that is not ASCII (TypeError).
        return hmac.compare_digest(self.token(nonce).encode(), token.encode())


class SecurityHeaders:
    """ASGI middleware: the Host checked first (when ``hosts`` is given), then
    authentication (unless ``/healthz``), and the security headers on every
    response, the 400 and 401 included."""

    def __init__(
        self, app: ASGIApp, auth: BasicAuth | None, hosts: AllowedHosts | None = None
    ) -> None:
        self.app = app
        self.auth = auth
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        static = route_path(scope).startswith("/static/")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.extend(_HEADERS)
                if not static:
                    headers.append((b"cache-control", b"no-store"))
                message["headers"] = headers
            await send(message)

        if self.hosts is not None:
            host = None
            for name, value in scope.get("headers", []):
                if name == b"host":
                    host = value.decode("latin-1")
            # No Host at all: no browser (HTTP/1.0); nothing to rebind.
            if host is not None and not self.hosts.allows(host_name(host), scope):
                await _plain(send_with_headers, 400, _BAD_HOST)
                return
        if self.auth is not None and route_path(scope) != "/healthz":
            authorization = None
            for name, value in scope.get("headers", []):
                if name == b"authorization":
                    authorization = value.decode("latin-1")
            if not self.auth.accepts(authorization):
                await _unauthorized(send_with_headers)
                return
        await self.app(scope, receive, send_with_headers)


_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
]


_BAD_HOST = (
    b"Bad Request: this dashboard does not answer to the host name in the Host header "
    b"(it answers to its own address, localhost and the names given with --allowed-host).\n"
)


async def _unauthorized(send: Send) -> None:
    challenge = (b"www-authenticate", b'Basic realm="graphile-worker dashboard", charset="UTF-8"')
    await _plain(send, 401, b"Authentication required.\n", [challenge])


async def _plain(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """A short text/plain response."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
