"""Logins off the event loop: the machine's login event, the throttle, the service,
and byte-exact reply texts."""

from __future__ import annotations

import asyncio
import time

import pytest
from pamqp import commands, frame

from brokerd.model.auth import User, UserDatabase, hash_password
from brokerd.model.errors import ChannelError, truncate_utf8
from brokerd.model.throttle import LoginThrottle
from brokerd.protocol.connection import Connection, ConnectionState
from brokerd.protocol.handshake import LoginCheck
from brokerd.server.login import LoginService
from brokerd.wire.codec import PROTOCOL_HEADER, method_frame
from tests.unit.test_connection_machine import FakeClock, make_broker, parse, start_ok

# -- the machine emits the check and waits -----------------------------------------------


class AsyncClient:
    def __init__(self) -> None:
        self.checks: list[LoginCheck] = []
        self.conn = Connection(
            make_broker(), ("127.0.0.1", 1), clock=FakeClock(), on_login=self.checks.append
        )

    def feed(self, data: bytes) -> list:
        self.conn.receive_data(data)
        return [m for _, m in parse(self.conn.data_to_send())]


def test_start_ok_emits_a_login_check_and_pipelined_frames_wait():
    client = AsyncClient()
    client.feed(PROTOCOL_HEADER)
    pipelined = b"".join(
        frame.marshal(m, 0) for m in (start_ok(), commands.Connection.TuneOk(2047, 131072, 0))
    ) + frame.marshal(commands.Connection.Open("/"), 0)
    assert client.feed(pipelined) == []  # nothing answered while the check runs
    assert client.conn.state is ConnectionState.AWAIT_LOGIN
    [check] = client.checks
    assert (check.kind, check.username, check.password, check.peer_host) == (
        "login",
        "guest",
        "guest",
        "127.0.0.1",
    )
    # frames arriving later wait too
    assert client.feed(frame.marshal(commands.Channel.Open(), 1)) == []
    user = client.conn.broker.users.users["guest"]
    client.conn.complete_login(check, user, "")
    out = [type(m) for _, m in parse(client.conn.data_to_send())]
    assert out == [
        commands.Connection.Tune,
        commands.Connection.OpenOk,
        commands.Channel.OpenOk,
    ]
    assert client.conn.state is ConnectionState.OPEN


def test_a_refused_check_closes_with_403_and_ignores_the_rest():
    client = AsyncClient()
    client.feed(PROTOCOL_HEADER)
    client.feed(frame.marshal(start_ok(password="bad"), 0))
    client.feed(frame.marshal(commands.Connection.TuneOk(2047, 131072, 0), 0))
    client.conn.complete_login(client.checks[0], None, "invalid credentials")
    out = [m for _, m in parse(client.conn.data_to_send())]
    assert [type(m) for m in out] == [commands.Connection.Close]
    assert out[0].reply_code == 403
    assert client.conn.closed


def test_a_stale_answer_is_ignored():
    client = AsyncClient()
    client.feed(PROTOCOL_HEADER)
    client.feed(frame.marshal(start_ok(), 0))
    client.conn.connection_lost()
    client.conn.complete_login(client.checks[0], object(), "")
    assert client.conn.data_to_send() == b""


def test_handshake_timeout_covers_a_slow_check():
    client = AsyncClient()
    client.feed(PROTOCOL_HEADER)
    client.feed(frame.marshal(start_ok(), 0))
    client.conn.tick(client.conn.created + 11)
    assert client.conn.closed


def open_async_client() -> AsyncClient:
    client = AsyncClient()
    client.feed(PROTOCOL_HEADER)
    client.feed(frame.marshal(start_ok(), 0))
    client.conn.complete_login(client.checks[0], client.conn.broker.users.users["guest"], "")
    client.feed(frame.marshal(commands.Connection.TuneOk(2047, 131072, 0), 0))
    client.feed(frame.marshal(commands.Connection.Open("/"), 0))
    assert client.conn.state is ConnectionState.OPEN
    return client


@pytest.mark.parametrize("verified", [True, False])
def test_update_secret_is_checked_off_loop_and_answered(verified):
    """Re-checked for the same user; answered update-secret-ok either way, as RabbitMQ
    3.10's internal backend does (a new secret changes no rights)."""
    client = open_async_client()
    request = frame.marshal(commands.Connection.UpdateSecret("new", "rotation"), 0)
    assert client.feed(request + frame.marshal(commands.Channel.Open(), 1)) == []
    check = client.checks[-1]
    assert (check.kind, check.username, check.password) == ("update-secret", "guest", "new")
    user = client.conn.user if verified else None
    client.conn.complete_login(check, user, "" if verified else "invalid credentials")
    out = [type(m) for _, m in parse(client.conn.data_to_send())]
    assert out == [commands.Connection.UpdateSecretOk, commands.Channel.OpenOk]
    assert client.conn.state is ConnectionState.OPEN


def test_update_secret_inline_without_a_shell():
    from tests.unit.test_connection_machine import Client

    client = Client()
    client.handshake()
    out = client.send(0, commands.Connection.UpdateSecret("guest", "same"))
    assert [type(m) for _, m in out] == [commands.Connection.UpdateSecretOk]


# -- the throttle ----------------------------------------------------------------------


def test_throttle_doubles_to_a_cap_and_forgives_success():
    t = LoginThrottle(base=0.1, cap=1.0)
    key = ("10.0.0.1", "alice")
    assert t.reserve(key, 0.0) == 0.0
    delays = [t.failed(key, float(i * 10)) for i in range(6)]
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    t.succeeded(key)
    assert t.reserve(key, 100.0) == 0.0 and len(t) == 0


def test_throttle_serialises_parallel_attempts_of_one_key():
    t = LoginThrottle(base=1.0, cap=8.0)
    key = ("10.0.0.1", "alice")
    t.failed(key, 0.0)  # not_before = 1.0
    waits = [t.reserve(key, 0.0) for _ in range(4)]
    assert waits == [1.0, 2.0, 3.0, 4.0]
    assert t.reserve(("10.0.0.1", "bob"), 0.0) == 0.0  # other keys are not held


def test_throttle_memory_is_bounded_and_forgets():
    t = LoginThrottle(max_entries=100, forget_after=60.0)
    for i in range(1000):
        t.failed((f"10.0.{i // 256}.{i % 256}", "u"), 0.0)
    assert len(t) == 100
    assert t.reserve(("10.0.3.231", "u"), 0.05) > 0  # the newest are kept
    assert t.reserve(("10.0.0.0", "u"), 0.05) == 0.0  # the oldest went
    assert t.reserve(("10.0.3.231", "u"), 1000.0) == 0.0  # forgotten after a quiet minute


# -- the service -------------------------------------------------------------------------

FAST = 2_000


def users() -> UserDatabase:
    db = UserDatabase()
    db.add_user(User("app", hash_password("pw", iterations=FAST)))
    return db


def test_unknown_user_pays_a_hash_like_a_wrong_password():
    db = users()
    db.add_user(User("slow", hash_password("pw", iterations=200_000)))
    db.add_user(User("slow2", hash_password("pw", iterations=200_000)))

    def timed(name: str) -> float:
        start = time.perf_counter()
        assert db.authenticate(name, "wrong", "127.0.0.1")[0] is None
        return time.perf_counter() - start

    wrong = min(timed("slow") for _ in range(3))
    unknown = min(timed("nobody") for _ in range(3))
    assert unknown > 0.5 * wrong  # the dummy uses the most common iteration count


async def test_service_checks_throttles_and_caches():
    db = users()
    clock = [0.0]
    throttle = LoginThrottle(base=0.05, cap=0.2)
    service = LoginService(lambda: db, concurrency=1, throttle=throttle, clock=lambda: clock[0])
    try:
        good = LoginCheck("login", "app", "pw", "10.0.0.1")
        user, _ = await service.check(good)
        assert user is db.users["app"] and service.checks == 1
        user, _ = await service.check(good)  # a verified login is remembered
        assert user is db.users["app"] and service.checks == 1
        bad = LoginCheck("login", "app", "nope", "10.0.0.2")
        loop = asyncio.get_running_loop()
        started = loop.time()
        results = [await service.check(bad) for _ in range(3)]
        assert all(u is None for u, _ in results)
        assert "invalid credentials" in results[0][1]
        # refusals were held 0.05 + 0.1 + 0.2 s (and the later attempts waited their turn)
        assert loop.time() - started >= 0.3
        assert service.refused == 3
    finally:
        service.close()


async def test_service_runs_checks_off_the_loop():
    db = UserDatabase()
    db.add_user(User("heavy", hash_password("pw", iterations=300_000)))
    service = LoginService(lambda: db, concurrency=1)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.005)
            ticks += 1

    task = asyncio.get_running_loop().create_task(ticker())
    try:
        start = time.perf_counter()
        user, _ = await service.check(LoginCheck("login", "heavy", "pw", "127.0.0.1"))
        elapsed = time.perf_counter() - start
        assert user is not None
        # the loop kept turning while the hash ran in the executor
        assert ticks >= 0.3 * elapsed / 0.005
    finally:
        task.cancel()
        service.close()


# -- reply texts are short strings: 255 bytes ------------------------------------------


def test_truncate_utf8_cuts_on_a_character_boundary():
    assert truncate_utf8("abc") == "abc"
    cut = truncate_utf8("é" * 200)
    assert len(cut.encode()) == 254 and cut == "é" * 127
    assert truncate_utf8("\ud800x") == "?x"  # a lone surrogate cannot be sent


@pytest.mark.parametrize("name", ["é" * 127, "✓" * 85, "x" * 255, "a" + "😀" * 63])
def test_error_with_a_long_non_ascii_name_encodes(name):
    error = ChannelError(404, f"no queue '{name}' in vhost '/'")
    text = error.reply_text
    assert len(text.encode()) <= 255 and text.startswith("NOT_FOUND - no queue '")
    method_frame(1, commands.Channel.Close(404, text, 50, 10))  # must not raise


def test_plain_credentials_outside_latin_1_are_read_not_crashed_on():
    """pamqp hands valid UTF-8 back as str; 'Božena' once crashed the handshake (541)."""
    from tests.unit.test_connection_machine import Client

    client = Client()
    client.feed(PROTOCOL_HEADER)
    out = client.send(0, start_ok(user="Božena", password="heslo✓"))
    closes = [m for _, m in out if isinstance(m, commands.Connection.Close)]
    assert closes and closes[0].reply_code == 403  # an unknown user, refused properly


def test_a_failing_close_path_still_closes_with_541(monkeypatch):
    """Even when sending the orderly close raises, the client hears 541 and the
    machine ends closed (never a silent reset)."""
    from tests.unit.test_connection_machine import Client

    client = Client()
    client.handshake()

    def broken(*args, **kwargs):
        raise RuntimeError("teardown bug")

    monkeypatch.setattr(client.conn, "_teardown", broken)
    client.conn.internal_error()
    out = client.replies()
    assert [m.reply_code for _, m in out if isinstance(m, commands.Connection.Close)] == [541]
    assert client.conn.closed
