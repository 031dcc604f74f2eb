"""Hostile requests against the real console process (issue 46; DESIGN.md §10).

Daphne serving ``console.asgi`` with Redis and Celery (``tests/console_stack.py``).
Every URL pattern the console has (each filled in with sample arguments), and the
two websocket paths, anonymous and logged in (a session cookie, and an API token),
gets a query string of 1,001 and of 10,000 parameters, a request line of 16 KB and a
header of 200 KB. Each must be answered with a 4xx within a second: never a 5xx,
never a connection dropped without an answer, never a hang. Before issue 46, 1,001
parameters gave Daphne's "500 Exception inside application" on the API, the schema,
the login page, every dashboard page and the ``/ws/dashboard/`` handshake, and the
16 KB line and 200 KB header had their connection closed without a word.
"""

from __future__ import annotations

import contextlib
import re
import socket
import time
from collections import Counter

import pytest
import requests

from tests.console_stack import OPERATOR, ConsoleStack, console_stack  # noqa: F401
from tests.support.urls import every_path

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ANSWER_WITHIN = 1.0


class Visitor:
    """Raw HTTP/1.1 requests on a fresh socket each: what came back first, and when."""

    def __init__(self, port: int, headers: list[str]) -> None:
        self.port = port
        self.headers = headers

    def send(self, path: str, query: str = "", extra: list[str] | None = None) -> str:
        target = path + (f"?{query}" if query else "")
        lines = [f"GET {target} HTTP/1.1", f"Host: 127.0.0.1:{self.port}", *self.headers]
        if path.startswith("/ws/"):
            lines += [
                "Upgrade: websocket",
                "Connection: Upgrade",
                "Sec-WebSocket-Version: 13",
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
                f"Origin: http://127.0.0.1:{self.port}",
            ]
        else:
            lines.append("Connection: close")
        raw = ("\r\n".join([*lines, *(extra or [])]) + "\r\n\r\n").encode("latin-1")
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", self.port), timeout=ANSWER_WITHIN) as sock:
            # the server may answer and close before it has read everything
            with contextlib.suppress(OSError):
                sock.sendall(raw)
            got = b""
            try:
                while b"\r\n" not in got:
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    got += chunk
            except TimeoutError:
                return f"no answer within {ANSWER_WITHIN} s"
            except ConnectionResetError:
                pass
        elapsed = time.monotonic() - started
        status = got.split(b"\r\n", 1)[0].decode("latin-1")
        if not status:
            return "closed without an answer"
        if elapsed > ANSWER_WITHIN:
            return f"{status} after {elapsed:.2f} s"
        return status


def hostile_kinds() -> dict[str, tuple[str, list[str]]]:
    return {
        "1,001 parameters": ("&".join(f"p{i}=1" for i in range(1001)), []),
        "10,000 parameters": ("&".join(f"p{i}=1" for i in range(10_000)), []),
        "a 16 KB request line": ("q=" + "x" * 16 * 1024, []),
        "a 200 KB header": ("", ["X-Padding: " + "y" * 200 * 1024]),
    }


@pytest.fixture(scope="module")
def visitors(console_stack: ConsoleStack) -> dict[str, Visitor]:  # noqa: F811
    port = int(console_stack.http_url.rsplit(":", 1)[1])
    session = requests.Session()
    login = f"{console_stack.http_url}/accounts/login/"
    session.get(login, timeout=10)
    answer = session.post(
        login,
        data={
            "username": OPERATOR[0],
            "password": OPERATOR[1],
            "csrfmiddlewaretoken": session.cookies["csrftoken"],
        },
        headers={"Referer": login},
        timeout=10,
    )
    assert answer.ok and "sessionid" in session.cookies, answer.status_code
    cookie = "; ".join(f"{k}={v}" for k, v in session.cookies.items())
    token = console_stack.api().token
    return {
        "anonymous": Visitor(port, []),
        "logged in": Visitor(port, [f"Cookie: {cookie}", f"Authorization: Token {token}"]),
    }


def test_no_hostile_request_gets_a_5xx_a_silent_close_or_a_hang(
    console_stack: ConsoleStack,  # noqa: F811
    visitors: dict[str, Visitor],
) -> None:
    paths = [*every_path(), "/ws/dashboard/", "/ws/brokers/"]
    assert "/api/v1/schema/" in paths and "/accounts/login/" in paths and len(paths) > 100
    bad: list[str] = []
    for who, visitor in visitors.items():
        for kind, (query, extra) in hostile_kinds().items():
            for path in paths:
                status = visitor.send(path, query, extra)
                match = re.match(r"HTTP/1\.[01] (\d{3})", status)
                if match is None or not match.group(1).startswith("4") or " after " in status:
                    bad.append(f"{who}, {kind}: {path} -> {status}")
    tally = Counter(line.split(" -> ", 1)[1] for line in bad)
    examples = "\n".join(bad[:: max(1, len(bad) // 30)][:30])
    assert not bad, f"{len(bad)} bad answers {dict(tally)}, e.g.:\n{examples}"
    # and the console is still fine
    assert requests.get(f"{console_stack.http_url}/healthz", timeout=5).status_code == 200
    daphne = console_stack.services["daphne"].log_text()
    assert "Exception inside application" not in daphne


def test_a_query_string_under_the_limits_is_served(
    console_stack: ConsoleStack,  # noqa: F811
) -> None:
    api = console_stack.api()
    query = "&".join(f"p{i}=1" for i in range(999))
    status, _body = api.get(f"/api/v1/brokers/?{query}")
    assert status == 200
    status, body = api.get("/api/v1/brokers/?" + "&".join(f"p{i}=1" for i in range(1001)))
    assert status == 400 and body["error"] == "query string with more than 1000 fields", body
