"""How a link classifies a failed connection attempt, with real sockets on loopback:
a closed port refuses (the peer's process has ended), a listener that accepts and
drops the connection is a reset (a process being killed), neither is the other."""

from __future__ import annotations

import asyncio

import aiormq

from brokerd.cluster.link import Link, is_refused, is_reset
from tests.brokerd_process import free_port


def link_to(port: int) -> Link:
    return Link(
        f"127.0.0.1:{port}",
        user="cluster",
        secret="secret",
        vhost="/",
        identity=dict,
        on_up=lambda link: None,
        on_down=lambda link, reason: None,
    )


async def attempt(port: int) -> BaseException:
    link = link_to(port)
    link.connect_timeout = 2.0
    try:
        await link._connect()
    except Exception as exc:
        return exc
    raise AssertionError("connected to nothing")


async def test_a_port_nobody_listens_on_refuses() -> None:
    exc = await attempt(free_port())
    assert is_refused(exc) and not is_reset(exc), repr(exc)


async def test_a_listener_that_drops_connections_is_a_reset_not_a_refusal() -> None:
    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.transport.abort()  # RST, as a process being killed does

    server = await asyncio.start_server(drop, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        exc = await attempt(port)
    finally:
        server.close()
        await server.wait_closed()
    assert is_reset(exc) and not is_refused(exc), repr(exc)


def test_wrapped_causes_count_and_other_errors_do_not() -> None:
    def wrapped(cause: BaseException) -> BaseException:
        try:
            try:
                raise cause
            except OSError as exc:
                raise aiormq.exceptions.AMQPConnectionError("wrapped") from exc
        except aiormq.exceptions.AMQPConnectionError as outer:
            return outer

    assert is_refused(wrapped(ConnectionRefusedError(111, "refused")))
    assert is_reset(wrapped(ConnectionResetError(104, "reset")))
    timeout = wrapped(TimeoutError("timed out"))
    assert not is_refused(timeout) and not is_reset(timeout)
