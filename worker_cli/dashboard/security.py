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
  subdomain is of no use without the server's secret.
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
import secrets
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AUTH_ENVVAR",
    "CONTENT_SECURITY_POLICY",
    "BasicAuth",
    "Csrf",
    "SecurityHeaders",
    "is_loopback",
    "route_path",
]

#: The environment variable holding ``USER:PASSWORD`` (``--auth``'s).
AUTH_ENVVAR = "GRAPHILE_WORKER_DASHBOARD_AUTH"

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

    def valid(self, nonce: str | None, token: str | None) -> bool:
        """Whether a form's token belongs to the browser's nonce."""
        if not nonce or not token:
            return False
        # As bytes: compare_digest refuses a str that is not ASCII (TypeError).
        return hmac.compare_digest(self.token(nonce).encode(), token.encode())


class SecurityHeaders:
    """ASGI middleware: authentication first (unless ``/healthz``), then the
    security headers on every response, the 401 included."""

    def __init__(self, app: ASGIApp, auth: BasicAuth | None) -> None:
        self.app = app
        self.auth = auth

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


async def _unauthorized(send: Send) -> None:
    body = b"Authentication required.\n"
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b'Basic realm="graphile-worker dashboard", charset="UTF-8"'),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
