"""Hostile input on the web side (issue 24; DESIGN.md §10, "Web input").

JSON nesting and body size are limited before parsing (``console/bodylimits.py``,
``console/jsonlimits.py``), client JSON is read without RecursionError or absurd
numbers (``clusterapi/api/parsers.py``), and with DEBUG on only loopback clients
are served (``console/loopback.py``). In process with a test database; the last
part drives every operation of the API's OpenAPI schema with hostile bodies and
counts the 500s (there must be none).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from io import BytesIO
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import include, path
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from clusterapi import configs
from clusterapi.models import Alarm, Broker, ConfigVersion, QueueSnapshot
from console.bodylimits import BodyLimitsMiddleware, RefuseUnreadableContentType
from console.jsonlimits import MAX_INTEGER_DIGITS, JsonRefused, json_depth, load_json
from console.loopback import REFUSAL, LoopbackOnlyDebugApp, is_loopback
from console.urls import handler400, handler403, handler404, handler500  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("in_memory_layer", "scheduled")]

TOKEN_URL = "/api/v1/auth/token/"
CONFIGS_URL = "/api/v1/configs/"
REMOTE = "203.0.113.7"  # TEST-NET-3: never this machine
#: what only Django's debug pages print (the 500 traceback page, the 404 URL list)
DEBUG_MARKS = ("Traceback", "You're seeing this error because you have", "Using the URLconf")


def boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("a view that fails, with a secret in its locals")


# this module is also the URLconf of the DEBUG tests: the console's URLs and one that fails
urlpatterns = [path("boom/", boom), path("", include("console.urls"))]


def depth(n: int) -> str:
    return "[" * n + "]" * n


def objects_depth(n: int) -> str:
    return '{"a":' * n + "1" + "}" * n


def error_of(response: Any) -> str:
    """The API's error shape, checked: ``{"error": <text>, "detail": ...}``."""
    assert response["Content-Type"].startswith("application/json"), response.content[:200]
    body = json.loads(response.content)
    assert set(body) == {"error", "detail"} and isinstance(body["error"], str), body
    return body["error"]


@pytest.fixture
def anonymous() -> APIClient:
    return APIClient()


@pytest.fixture
def api(operator: User) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=operator).key}")
    return client


# -- the depth scan ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("1", 0),
        ("[]", 1),
        ('{"a": [{}, []]}', 3),
        ('["[[[[", "]]"]', 1),  # brackets in strings do not count
        (r'["\"[[[["]', 1),  # nor after an escaped quote
        (r'["\\", [[]]]', 3),  # an escaped backslash ends before the quote
        ('"unterminated [[[[', 0),
        ("[[[[", 4),  # never closed: a parser recurses this deep before failing
        # json reads one value and fails at the first stray closer: nothing after it
        # is ever parsed, so only the first value's nesting is bounded exactly
        ("]]][[[", 0),
        ("[[]][[[", 3),
    ],
)
def test_json_depth_counts_arrays_and_objects_outside_strings(text: str, expected: int) -> None:
    assert json_depth(text) == expected


def _reference_depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((_reference_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_reference_depth(v) for v in value.values()), default=0)
    return 0


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=40,
)


@given(value=_json_values, ascii_only=st.booleans(), indent=st.sampled_from([None, 0, 2]))
@hypothesis_settings(max_examples=300, deadline=None, derandomize=True)
def test_json_depth_agrees_with_the_parsed_value(
    value: Any, ascii_only: bool, indent: int | None
) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent)
    assert json_depth(text) == _reference_depth(value)


def test_load_json_refuses_past_the_depth_limit_and_reads_up_to_it(settings: Any) -> None:
    limit = settings.MAX_JSON_DEPTH
    assert load_json(depth(limit)) is not None
    for text in (depth(limit + 1), objects_depth(limit + 1), "[" * 100_000):
        with pytest.raises(JsonRefused, match=f"deeper than {limit} levels"):
            load_json(text)


@pytest.mark.parametrize(
    "literal",
    ["1e999999", "-1e400", "1E309", "NaN", "Infinity", "-Infinity", "9" * (MAX_INTEGER_DIGITS + 1)],
)
def test_load_json_refuses_numbers_no_response_can_carry(literal: str) -> None:
    with pytest.raises(JsonRefused):
        load_json(f'{{"n": [{literal}]}}')


def test_load_json_reads_big_but_representable_numbers() -> None:
    digits = "9" * MAX_INTEGER_DIGITS
    assert load_json(f"[{digits}, -{digits}, 1e308, 1e-999]") == [
        int(digits),
        -int(digits),
        1e308,
        0.0,
    ]


@pytest.mark.parametrize(
    "text", [r'"\ud800"', r'["ok", {"k": "\udfff"}]', r'{"\ud83d": 1}', r'["\ude00\ud83d"]']
)
def test_load_json_refuses_unpaired_surrogates(text: str) -> None:
    with pytest.raises(JsonRefused, match="surrogate"):
        load_json(text)


def test_load_json_reads_surrogate_pairs_and_escaped_backslashes() -> None:
    assert load_json(r'["\ud83d\ude00", "\\ud800"]') == ["\U0001f600", "\\ud800"]


# -- the API: deep nesting, size, encoding, numbers ---------------------------------------


@pytest.mark.parametrize("body", [depth(1000), objects_depth(1000), "[" * 5000])
def test_deep_json_is_a_400_on_the_login_free_token_endpoint(
    anonymous: APIClient, body: str, settings: Any
) -> None:
    response = anonymous.generic("POST", TOKEN_URL, body, content_type="application/json")
    assert response.status_code == 400
    assert f"deeper than {settings.MAX_JSON_DEPTH} levels" in error_of(response)
    assert response.json()["detail"] == {"max_depth": settings.MAX_JSON_DEPTH}


@pytest.mark.parametrize("body", [depth(1000), objects_depth(1000)])
def test_deep_json_is_a_400_on_configs(api: APIClient, body: str) -> None:
    wrapped = f'{{"document": {{"vhosts": {body}}}}}'
    response = api.generic("POST", CONFIGS_URL, wrapped, content_type="application/json")
    assert response.status_code == 400
    assert "deeper than" in error_of(response)
    assert not ConfigVersion.objects.exists()


def test_nesting_up_to_the_limit_reaches_the_documents_own_rules(
    api: APIClient, settings: Any
) -> None:
    # the body, "document" and "vhosts" are three levels: the rest fills the limit exactly
    inner = depth(settings.MAX_JSON_DEPTH - 3)
    body = f'{{"document": {{"vhosts": [{inner}]}}}}'
    assert json_depth(body) == settings.MAX_JSON_DEPTH
    response = api.generic("POST", CONFIGS_URL, body, content_type="application/json")
    assert response.status_code == 422, response.content
    legal = api.post(
        CONFIGS_URL,
        {"document": {"vhosts": ["/"], "vhost_limits": {"/": {"max_connections": 5}}}},
        format="json",
    )
    assert legal.status_code == 201, legal.content


def test_a_body_over_the_limit_is_a_400_before_it_is_read(
    anonymous: APIClient, api: APIClient, settings: Any
) -> None:
    limit = settings.MAX_REQUEST_BODY_BYTES
    assert limit == settings.DATA_UPLOAD_MAX_MEMORY_SIZE == 1024 * 1024
    padding = "a" * limit
    for client, url in ((anonymous, TOKEN_URL), (api, CONFIGS_URL)):
        body = f'{{"comment": "{padding}"}}'
        response = client.generic("POST", url, body, content_type="application/json")
        assert response.status_code == 400
        assert error_of(response) == f"request body larger than {limit} bytes"
        assert response.json()["detail"] == {"max_bytes": limit}
    # a declared length over the limit is refused without reading a byte
    lying = anonymous.generic(
        "POST", TOKEN_URL, b"{}", content_type="application/json", CONTENT_LENGTH=str(limit + 1)
    )
    assert lying.status_code == 400 and "larger than" in error_of(lying)
    unreadable = anonymous.generic(
        "POST", TOKEN_URL, b"{}", content_type="application/json", CONTENT_LENGTH="12ab"
    )
    assert unreadable.status_code == 400 and "Content-Length" in error_of(unreadable)


def test_a_body_without_a_length_is_held_to_the_limit_by_its_size(settings: Any) -> None:
    """Under ASGI a chunked body has no Content-Length: its buffered size counts."""
    settings.MAX_REQUEST_BODY_BYTES = settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    scope = {
        "type": "http",
        "method": "POST",
        "path": TOKEN_URL,
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"host", b"127.0.0.1")],
        "client": ("127.0.0.1", 40000),
    }
    seen: list[bytes] = []

    def view(request: HttpRequest) -> HttpResponse:
        seen.append(request.body)
        return HttpResponse("ok")

    middleware = BodyLimitsMiddleware(view)
    small = middleware(ASGIRequest(scope, BytesIO(b'{"username": "x"}')))
    assert small.status_code == 200 and seen == [b'{"username": "x"}']
    big = middleware(ASGIRequest(scope, BytesIO(b'{"a": "' + b"a" * 2000 + b'"}')))
    assert big.status_code == 400 and seen == [b'{"username": "x"}']
    assert error_of(big) == "request body larger than 1000 bytes"


@pytest.mark.parametrize(
    "bad",
    [b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\x80abc", b"\xf4\x90\x80\x80"],
    ids=["ff", "overlong", "encoded-surrogate", "truncated", "continuation", "above-10ffff"],
)
def test_invalid_utf8_is_a_400(anonymous: APIClient, api: APIClient, bad: bytes) -> None:
    for client, url in ((anonymous, TOKEN_URL), (api, CONFIGS_URL)):
        body = b'{"comment": "x' + bad + b'"}'
        response = client.generic("POST", url, body, content_type="application/json")
        assert response.status_code == 400
        assert "not valid UTF-8" in error_of(response)


def test_json_in_another_charset_is_refused(anonymous: APIClient) -> None:
    body = '{"username": "é", "password": "x"}'.encode("latin-1")
    response = anonymous.generic(
        "POST", TOKEN_URL, body, content_type="application/json; charset=latin-1"
    )
    assert response.status_code == 415
    assert "must be UTF-8" in error_of(response)


@pytest.mark.parametrize(
    "number",
    ["1e999999", "-1e400", "NaN", "Infinity", "1" * 100_000, "9" * (MAX_INTEGER_DIGITS + 1)],
    ids=["1e999999", "-1e400", "NaN", "Infinity", "100000-digits", "4301-digits"],
)
def test_huge_numbers_are_a_400(anonymous: APIClient, api: APIClient, number: str) -> None:
    cases = (
        (anonymous, TOKEN_URL, f'{{"username": {number}, "password": "x"}}'),
        (api, CONFIGS_URL, f'{{"document": {{"heartbeat": {{"interval": {number}}}}}}}'),
    )
    for client, url, body in cases:
        response = client.generic("POST", url, body, content_type="application/json")
        assert response.status_code == 400, response.content[:300]
        message = error_of(response)
        assert message.startswith("JSON parse error")
        assert "set_int_max_str_digits" not in message


def test_a_big_representable_number_gets_the_documents_own_answer(api: APIClient) -> None:
    body = f'{{"document": {{"limits": {{"channel_max": {"9" * MAX_INTEGER_DIGITS}}}}}}}'
    response = api.generic("POST", CONFIGS_URL, body, content_type="application/json")
    assert response.status_code == 422
    assert "channel_max" in error_of(response)


@pytest.mark.parametrize(
    "body",
    [r'{"document": {"\ud800": 1}}', r'{"document": {"vhosts": ["\udc00"]}}'],
)
def test_an_unpaired_surrogate_is_a_400_not_a_failure_to_encode(api: APIClient, body: str) -> None:
    response = api.generic("POST", CONFIGS_URL, body, content_type="application/json")
    assert response.status_code == 400
    assert "surrogate" in error_of(response)


async def test_an_unreadable_content_type_is_a_400_before_django() -> None:
    """Django's request constructor raises on an RFC 2231 charset it does not know,
    before any middleware; Daphne would answer that with a 500."""
    from console.asgi import application

    called: list[Any] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        called.append(scope)

    headers = [(b"content-type", b"application/json; charset*=bogus''x"), (b"host", b"x")]
    for app in (RefuseUnreadableContentType(inner), application):
        sent = await asgi_call(app, http_scope(headers=headers, method="POST"))
        assert sent[0]["status"] == 400
        assert b"unreadable Content-Type" in sent[1]["body"]
    assert called == []
    fine = await asgi_call(RefuseUnreadableContentType(inner), http_scope(headers=[]))
    assert fine == [] and len(called) == 1


# -- the dashboard: form and htmx posts ----------------------------------------------------


@pytest.fixture
def dashboard(operator: User) -> Client:
    client = Client()
    client.force_login(operator)
    return client


def test_a_deep_or_absurd_document_in_the_editor_is_a_form_error(dashboard: Client) -> None:
    for document, expected in (
        (depth(5000), "nested deeper than"),
        ('{"heartbeat": {"interval": 1e999}}', "out of range"),
        ('{"vhosts": ["\\ud800"]}', "surrogate"),
    ):
        for url in ("/config/", "/config/validate/"):
            response = dashboard.post(url, {"document": document}, HTTP_HX_REQUEST="true")
            assert response.status_code == 200
            assert expected in response.content.decode()
    assert not ConfigVersion.objects.exists()


def test_oversized_form_and_htmx_posts_are_a_400_not_a_500(
    dashboard: Client, settings: Any
) -> None:
    limit = settings.MAX_REQUEST_BODY_BYTES
    huge = {"document": "x" * limit}
    for headers in ({}, {"HTTP_HX_REQUEST": "true"}):
        response = dashboard.post("/config/", huge, **headers)
        assert response.status_code == 400
        assert response["Content-Type"].startswith("text/plain")
        assert f"larger than {limit} bytes" in response.content.decode()
    login = Client().post("/accounts/login/", {"username": "x" * limit, "password": "y"})
    assert login.status_code == 400


# -- DEBUG is for loopback clients only ----------------------------------------------------


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("10.0.0.1", False),
        ("0.0.0.0", False),
        ("::", False),
        ("::ffff:10.0.0.1", False),
        ("fe80::1%eth0", False),
        ("localhost", False),
        ("", False),
        (None, False),
    ],
)
def test_is_loopback(address: str | None, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def _debug_client(address: str, **headers: str) -> Client:
    return Client(raise_request_exception=False, REMOTE_ADDR=address, **headers)


def _shows_debug_page(response: Any) -> bool:
    text = response.content.decode(errors="replace")
    return any(mark in text for mark in DEBUG_MARKS)


@pytest.mark.urls(__name__)
def test_with_debug_a_remote_client_gets_a_plain_403_and_never_a_debug_page(
    settings: Any,
) -> None:
    settings.DEBUG = True
    remote = _debug_client(REMOTE)
    for url in ("/boom/", "/no-such-page/", "/healthz", "/accounts/login/"):
        response = remote.get(url)
        assert response.status_code == 403, url
        assert response.content.decode() == f"{REFUSAL}\n"
        assert not _shows_debug_page(response)
    api = remote.post(TOKEN_URL, depth(2000), content_type="application/json")
    assert api.status_code == 403 and error_of(api) == REFUSAL


@pytest.mark.urls(__name__)
def test_with_debug_loopback_still_gets_the_debug_pages(settings: Any) -> None:
    """The control: the pages the remote test looks for are there for this machine."""
    settings.DEBUG = True
    local = _debug_client("127.0.0.1")
    assert local.get("/healthz").status_code == 200
    failed = local.get("/boom/")
    assert failed.status_code == 500 and "Traceback" in failed.content.decode()
    missing = local.get("/no-such-page/")
    assert missing.status_code == 404 and "Using the URLconf" in missing.content.decode()
    deep = local.post(TOKEN_URL, depth(2000), content_type="application/json")
    assert deep.status_code == 400 and "deeper than" in error_of(deep)


@pytest.mark.urls(__name__)
@pytest.mark.parametrize(
    "header", ["HTTP_X_FORWARDED_FOR", "HTTP_X_REAL_IP", "HTTP_FORWARDED"], ids=str.lower
)
def test_with_debug_a_request_through_a_proxy_is_remote(settings: Any, header: str) -> None:
    settings.DEBUG = True
    proxied = _debug_client("127.0.0.1", **{header: "for=198.51.100.4"})
    response = proxied.get("/boom/")
    assert response.status_code == 403 and not _shows_debug_page(response)


@pytest.mark.urls(__name__)
def test_without_debug_remote_clients_are_served_and_failures_stay_plain(
    settings: Any,
) -> None:
    settings.DEBUG = False
    remote = _debug_client(REMOTE)
    assert remote.get("/healthz").status_code == 200
    failed = remote.get("/boom/")
    assert failed.status_code == 500 and not _shows_debug_page(failed)
    missing = remote.get("/no-such-page/")
    assert missing.status_code == 404 and not _shows_debug_page(missing)


def http_scope(
    *,
    client: tuple[str, int] | None = ("127.0.0.1", 40000),
    headers: list[tuple[bytes, bytes]] | None = None,
    method: str = "GET",
    path: str = "/healthz",
    kind: str = "http",
) -> dict[str, Any]:
    return {
        "type": kind,
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http" if kind == "http" else "ws",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers if headers is not None else [(b"host", b"127.0.0.1")],
        "client": client,
        "server": ("127.0.0.1", 8000),
    }


async def asgi_call(
    app: Callable[..., Awaitable[None]], scope: dict[str, Any]
) -> list[dict[str, Any]]:
    """Run ``app`` for one connection; what it sent."""
    incoming = [
        {"type": "websocket.connect"}
        if scope["type"] == "websocket"
        else {"type": "http.request", "body": b"", "more_body": False}
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


async def test_the_asgi_app_refuses_remote_http_and_websockets_with_debug(settings: Any) -> None:
    """Static files served under DEBUG and websockets never pass Django's middleware."""
    settings.DEBUG = True
    reached: list[str] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["type"])

    guarded = LoopbackOnlyDebugApp(inner)
    remote = ("198.51.100.4", 40000)
    sent = await asgi_call(guarded, http_scope(client=remote, path="/static/dashboard.js"))
    assert sent[0]["status"] == 403 and sent[1]["body"] == f"{REFUSAL}\n".encode()
    sent = await asgi_call(guarded, http_scope(client=None))
    assert sent[0]["status"] == 403
    sent = await asgi_call(guarded, http_scope(client=remote, kind="websocket", path="/ws/x/"))
    assert sent == [{"type": "websocket.close", "code": 1008}]
    assert reached == []
    await asgi_call(guarded, http_scope())
    await asgi_call(guarded, http_scope(kind="websocket", path="/ws/x/"))
    await guarded({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
    assert reached == ["http", "websocket", "lifespan"]
    settings.DEBUG = False
    await asgi_call(guarded, http_scope(client=remote))
    assert reached[-1] == "http"
    # and the console's application is the guarded one
    from console.asgi import application

    settings.DEBUG = True
    sent = await asgi_call(application, http_scope(client=remote))
    assert sent[0]["status"] == 403


# -- every operation of the schema, hostile bodies, no 500 ---------------------------------


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    fields: tuple[str, ...]  # its request body's properties, if it has one

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


def _operations() -> list[Operation]:
    """Every operation of the schema drf-spectacular generates, as the API serves it."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    components = schema["components"]["schemas"]
    out = []
    for route, item in schema["paths"].items():
        for method, operation in item.items():
            fields: tuple[str, ...] = ()
            for media in operation.get("requestBody", {}).get("content", {}).values():
                ref = media.get("schema", {}).get("$ref", "")
                fields = tuple(components.get(ref.rsplit("/", 1)[-1], {}).get("properties", {}))
            out.append(Operation(method.upper(), route, fields))
    return out


OPERATIONS = _operations()
#: hostile bodies refused at the door, before any view: always a 400
AT_THE_DOOR = ("deep", "invalid-utf8", "oversized")
#: hostile bodies a parser refuses: a 400 where the body is read, else the usual answer
PARSED = ("huge-number", "surrogate")


@pytest.fixture
def targets(operator: User) -> dict[str, str]:
    """One real object per resource whose operations read a body after finding it."""
    now = timezone.now()
    # linked, and reporting the members: /cluster/members/ answers them, not a 503
    broker = Broker.objects.create(
        name="127.0.0.1:5801",
        spid="spid-1",
        broker_type="primary",
        state="up",
        last_seen=now,
        connected=True,
        view={"members": {"version": 0, "members": [{"address": "127.0.0.1:5801"}]}},
    )
    queue = QueueSnapshot.objects.create(
        broker=broker, vhost="/", name="q", shared=True, master=True, updated_at=now
    )
    alarm = Alarm.objects.create(broker=broker, kind="checksum.mismatch", raised_at=now)
    version = configs.save({"vhosts": ["/"]}, operator, "first").version
    return {
        "brokers": str(broker.pk),
        "queues": str(queue.pk),
        "alarms": str(alarm.pk),
        "configs": str(version.number),
    }


def concrete(operation: Operation, targets: dict[str, str]) -> str:
    resource = operation.path.split("/")[3]
    return re.sub(r"\{[^}]+\}", targets.get(resource, "1"), operation.path)


def hostile_body(kind: str, field: str, size: int, variant: int) -> bytes:
    """One body of ``kind``; ``size`` and ``variant`` pick among its forms."""
    limit = django_settings.MAX_JSON_DEPTH
    if kind == "deep":
        n = limit + 1 + size % 20_000
        inner = [depth(n), objects_depth(n), "[" * n, '[{"a":' * n][variant % 4]
        return (inner if variant % 2 else f'{{"{field}": {inner}}}').encode()
    if kind == "invalid-utf8":
        bad = [b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\x80", b"\xf8\x88\x80\x80"]
        return b'{"' + field.encode() + b'": "' + b"a" * (size % 64) + bad[variant % 6] + b'"}'
    if kind == "oversized":
        padding = "a" * (django_settings.MAX_REQUEST_BODY_BYTES + 1 + size % 4096)
        return f'{{"{field}": "{padding}"}}'.encode()
    if kind == "huge-number":
        numbers = [
            f"1e{309 + size}",
            f"-1e{309 + size}",
            "9" * (MAX_INTEGER_DIGITS + 1 + size % 100_000),
            "NaN",
            "-Infinity",
        ]
        number = numbers[variant % 5]
        return (f"[{number}]" if variant % 7 == 6 else f'{{"{field}": {number}}}').encode()
    assert kind == "surrogate"
    half = ["\\ud800", "\\udfff", "\\udbff", "\\udc00"][variant % 4]
    return f'{{"{field}": ["{half}"], "{half}": 1}}'.encode()


def send_hostile(
    operation: Operation, targets: dict[str, str], body: bytes, content_type: str, token: str
) -> Any:
    client = APIClient()
    if token:
        client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    # raise_request_exception stays on: a view that fails fails the test with its traceback
    return client.generic(
        operation.method, concrete(operation, targets), body, content_type=content_type
    )


def check_answer(operation: Operation, kind: str, authenticated: bool, response: Any) -> str | None:
    """What is wrong with ``response`` to a hostile body of ``kind``, or None."""
    if response.status_code >= 500:
        return f"{response.status_code}: {response.content[:200]!r}"
    reads_body = operation.method == "POST" and (authenticated or operation.path == TOKEN_URL)
    if kind in AT_THE_DOOR or reads_body:
        if response.status_code != 400:
            return f"{response.status_code} where a 400 was due: {response.content[:200]!r}"
        error_of(response)
    return None


@pytest.mark.parametrize("kind", AT_THE_DOOR + PARSED)
def test_every_operation_answers_each_kind_of_hostile_body_without_a_500(
    kind: str, operator: User, targets: dict[str, str]
) -> None:
    token = Token.objects.create(user=operator).key
    assert len(OPERATIONS) > 30 and any(op.path == TOKEN_URL for op in OPERATIONS)
    wrong = {}
    for operation in OPERATIONS:
        field = operation.fields[0] if operation.fields else "x"
        body = hostile_body(kind, field, size=1000, variant=0)
        response = send_hostile(operation, targets, body, "application/json", token)
        problem = check_answer(operation, kind, True, response)
        if problem:
            wrong[str(operation)] = problem
    assert wrong == {}


@given(
    operation=st.sampled_from(OPERATIONS),
    kind=st.sampled_from(AT_THE_DOOR + PARSED),
    size=st.integers(min_value=0, max_value=200_000),
    variant=st.integers(min_value=0, max_value=1000),
    content_type=st.sampled_from(
        ["application/json", "application/json; charset=utf-8", "application/vnd.rookery+json"]
    ),
    authenticated=st.booleans(),
    field_choice=st.integers(min_value=0, max_value=10),
)
@hypothesis_settings(
    max_examples=300,
    derandomize=True,  # the same requests every run: a failure is a defect, not a draw
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_hostile_bodies_never_get_a_500_from_any_operation(
    operator: User,
    targets: dict[str, str],
    operation: Operation,
    kind: str,
    size: int,
    variant: int,
    content_type: str,
    authenticated: bool,
    field_choice: int,
) -> None:
    token, _ = Token.objects.get_or_create(user=operator)
    fields = (*operation.fields, "x")
    body = hostile_body(kind, fields[field_choice % len(fields)], size, variant)
    # DRF parses application/json alone: the +json type is refused (415) unless at the door
    parsed_type = content_type.startswith("application/json")
    response = send_hostile(
        operation, targets, body, content_type, token.key if authenticated else ""
    )
    if not parsed_type and kind in PARSED:
        assert response.status_code < 500, response.content[:200]
        return
    assert check_answer(operation, kind, authenticated, response) is None
