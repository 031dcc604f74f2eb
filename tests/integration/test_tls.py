"""AMQPS: brokerd's TLS listener with pika and aio-pika, certificate logins
(SASL EXTERNAL), refusals, SIGHUP reload and a TLS-only broker.

Certificates are made per test module with trustme (``tests/support/certs``).
"""

from __future__ import annotations

import asyncio
import signal
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pika
import pytest

from brokerd.model.auth import hash_password
from tests.brokerd_process import BrokerProcess, free_port, wait_for_port
from tests.support.certs import CertFiles, Pki
from tests.support.eventually import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

USERS = """
[[users]]
name = "guest"
password_hash = "{guest}"
tags = ["administrator"]

[[users]]
name = "app-client"
password_hash = "{guest}"

[[permissions]]
user = "guest"
vhost = "/"
configure = ".*"
write = ".*"
read = ".*"

[[permissions]]
user = "app-client"
vhost = "/"
configure = "^app\\\\."
write = "^(app\\\\..*)?$"
read = "^app\\\\."
"""


def write_config(
    folder: Path, server: CertFiles, cafile: Path, verify: str, extra: str = ""
) -> Path:
    path = folder / "brokerd.toml"
    path.write_text(
        USERS.format(guest=hash_password("guest"))
        + f"""
[tls]
certfile = "{server.certfile}"
keyfile = "{server.keyfile}"
cafile = "{cafile}"
verify = "{verify}"
{extra}
"""
    )
    return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[BrokerProcess]:
    """A broker whose TLS port asks for client certificates and checks those sent."""
    folder = tmp_path_factory.mktemp("tls-broker")
    config = write_config(folder, pki.server(), pki.cafile, "peer")
    tls_port = free_port()
    proc = BrokerProcess(folder / "data", extra_args=["--config", str(config)])
    proc.extra_args += ["--tls-port", str(tls_port)]
    proc.tls_port = tls_port  # type: ignore[attr-defined]
    proc.start()
    wait_for_port(tls_port, proc=proc.proc, log_path=proc.log_path)
    yield proc
    proc.stop()


def pika_params(port: int, context: ssl.SSLContext, **kwargs: object) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        "127.0.0.1",
        port,
        ssl_options=pika.SSLOptions(context, server_hostname="127.0.0.1"),
        connection_attempts=1,
        socket_timeout=10,
        **kwargs,  # type: ignore[arg-type]
    )


def roundtrip(connection: pika.BlockingConnection, queue: str) -> bytes:
    """Publish a message of every byte value and get it back."""
    body = bytes(range(256)) * 64
    channel = connection.channel()
    channel.queue_declare(queue, auto_delete=False)
    channel.basic_publish("", queue, body)
    method, _props, got = None, None, b""
    for _ in range(50):
        method, _props, got = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            break
        connection.sleep(0.05)
    channel.queue_delete(queue)
    assert method is not None, "the message did not come back"
    return got


def test_pika_over_tls_without_a_client_certificate(tls_broker: BrokerProcess, pki: Pki) -> None:
    params = pika_params(
        tls_broker.tls_port,  # type: ignore[attr-defined]
        pki.client_context(),
        credentials=pika.PlainCredentials("guest", "guest"),
    )
    connection = pika.BlockingConnection(params)
    try:
        body = bytes(range(256)) * 64
        assert roundtrip(connection, "tls.pika") == body
    finally:
        connection.close()


def test_pika_external_login_with_a_client_certificate(tls_broker: BrokerProcess, pki: Pki) -> None:
    client = pki.issue("app-client-cert", "app-client@example.test", common_name="app-client")
    params = pika_params(
        tls_broker.tls_port,  # type: ignore[attr-defined]
        pki.client_context(client),
        credentials=pika.credentials.ExternalCredentials(),
    )
    connection = pika.BlockingConnection(params)
    try:
        # the certificate's user has its permissions: app.* yes, anything else no
        assert roundtrip(connection, "app.external") == bytes(range(256)) * 64
        channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            channel.queue_declare("other.queue")
        assert refused.value.reply_code == 403
    finally:
        connection.close()
    assert "user=app-client" in tls_broker.log_text() or "app-client" in tls_broker.log_text()


def test_external_for_a_certificate_naming_no_user_is_refused(
    tls_broker: BrokerProcess, pki: Pki
) -> None:
    stranger = pki.issue("stranger", "stranger.example.test", common_name="stranger")
    params = pika_params(
        tls_broker.tls_port,  # type: ignore[attr-defined]
        pki.client_context(stranger),
        credentials=pika.credentials.ExternalCredentials(),
    )
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(params)
    assert "user 'stranger' (from the client certificate) does not exist" in (tls_broker.log_text())


def test_external_is_not_offered_without_a_certificate(tls_broker: BrokerProcess, pki: Pki) -> None:
    # over TLS without a certificate, and over plain TCP: pika finds no mechanism to use
    for params in (
        pika_params(
            tls_broker.tls_port,  # type: ignore[attr-defined]
            pki.client_context(),
            credentials=pika.credentials.ExternalCredentials(),
        ),
        pika.ConnectionParameters(
            "127.0.0.1",
            tls_broker.port,
            credentials=pika.credentials.ExternalCredentials(),
            connection_attempts=1,
        ),
    ):
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(params)
    assert start_mechanisms(tls_broker.port) == ["PLAIN", "AMQPLAIN"]


def start_mechanisms(port: int, context: ssl.SSLContext | None = None) -> list[str]:
    """The mechanisms connection.start offers, read off the wire."""
    from pamqp import commands, frame

    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        sock = context.wrap_socket(raw, server_hostname="127.0.0.1") if context else raw
        sock.sendall(b"AMQP\x00\x00\x09\x01")
        data = b""
        while True:
            data += sock.recv(4096)
            try:
                _, _, method = frame.unmarshal(data)
                break
            except Exception:
                continue
        assert isinstance(method, commands.Connection.Start)
        return str(method.mechanisms).split()


def test_start_offers_external_only_to_a_verified_certificate(
    tls_broker: BrokerProcess, pki: Pki
) -> None:
    client = pki.issue("offer-client", "offer.example.test", common_name="app-client")
    port = tls_broker.tls_port  # type: ignore[attr-defined]
    assert start_mechanisms(port, pki.client_context()) == ["PLAIN", "AMQPLAIN"]
    assert start_mechanisms(port, pki.client_context(client)) == ["PLAIN", "AMQPLAIN", "EXTERNAL"]


async def test_aio_pika_over_tls_with_external(tls_broker: BrokerProcess, pki: Pki) -> None:
    client = pki.issue("aio-client", "aio.example.test", common_name="app-client")
    port = tls_broker.tls_port  # type: ignore[attr-defined]
    connection = await aio_pika.connect(
        f"amqps://127.0.0.1:{port}/?auth=EXTERNAL",
        ssl_context=pki.client_context(client),
        timeout=10,
    )
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue("app.aio", auto_delete=True)
        body = bytes(range(256)) * 256
        await channel.default_exchange.publish(aio_pika.Message(body), "app.aio")
        got = await asyncio.wait_for(queue.get(timeout=5), 10)
        assert got.body == body
        await got.ack()


async def test_aio_pika_over_tls_with_a_password(tls_broker: BrokerProcess, pki: Pki) -> None:
    port = tls_broker.tls_port  # type: ignore[attr-defined]
    connection = await aio_pika.connect(
        f"amqps://guest:guest@127.0.0.1:{port}/", ssl_context=pki.client_context(), timeout=10
    )
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue("", exclusive=True)
        await channel.default_exchange.publish(aio_pika.Message(b"x" * 300_000), queue.name)
        got = await asyncio.wait_for(queue.get(timeout=5), 10)
        assert got.body == b"x" * 300_000


def test_refusals(tls_broker: BrokerProcess, pki: Pki, tmp_path: Path) -> None:
    """A client that trusts another CA, a server certificate for another host name,
    and an expired client certificate are all refused in the handshake."""
    port = tls_broker.tls_port  # type: ignore[attr-defined]
    other = Pki(tmp_path / "other", name="other-ca")
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        tls_handshake(port, other.client_context())
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        tls_handshake(port, pki.client_context(), server_hostname="broker.elsewhere.test")
    expired = pki.issue("expired-client", "old.example.test", expired=True)
    with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
        tls_handshake(port, pki.client_context(expired), read=True)
    # a certificate from a CA the broker does not trust
    stranger = other.issue("stranger-client", "stranger.example.test")
    context = pki.client_context()
    context.load_cert_chain(stranger.certfile, stranger.keyfile)
    with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
        tls_handshake(port, context, read=True)
    assert tls_broker.alive()
    # and the broker still serves
    tls_handshake(port, pki.client_context(), read=True)


def tls_handshake(
    port: int,
    context: ssl.SSLContext,
    *,
    server_hostname: str = "127.0.0.1",
    read: bool = False,
) -> dict:
    """Handshake (and, with ``read``, read connection.start: TLS 1.3 reports a refused
    client certificate only at the first read)."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=server_hostname) as sock,
    ):
        if read:
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            if not sock.recv(7):
                raise ConnectionResetError("closed")
        return sock.getpeercert() or {}


def common_name(cert: dict) -> str:
    return dict(x[0] for x in cert["subject"])["commonName"]


def test_sighup_reloads_the_certificate_and_keeps_connections(tmp_path: Path, pki: Pki) -> None:
    folder = tmp_path / "reload"
    folder.mkdir()
    first = pki.issue("reload-server", "127.0.0.1", common_name="first")
    config = write_config(folder, first, pki.cafile, "none")
    tls_port = free_port()
    proc = BrokerProcess(folder / "data", extra_args=["--config", str(config)])
    proc.extra_args += ["--tls-port", str(tls_port)]
    proc.start()
    try:
        wait_for_port(tls_port, proc=proc.proc, log_path=proc.log_path)
        assert common_name(tls_handshake(tls_port, pki.client_context())) == "first"
        params = pika_params(
            tls_port, pki.client_context(), credentials=pika.PlainCredentials("guest", "guest")
        )
        connection = pika.BlockingConnection(params)
        # the same files, new contents (as certbot renews)
        second = pki.issue("reload-server-2", "127.0.0.1", common_name="second")
        first.certfile.write_bytes(second.certfile.read_bytes())
        first.keyfile.write_bytes(second.keyfile.read_bytes())
        proc.signal(signal.SIGHUP)

        eventually(
            lambda: common_name(tls_handshake(tls_port, pki.client_context())) == "second",
            timeout=10,
            what="the new certificate served",
        )
        # the connection made before the reload is still up and working
        assert roundtrip(connection, "tls.reload") == bytes(range(256)) * 64
        connection.close()
        # a broken file leaves the running certificate in force
        first.certfile.write_text("not a certificate")
        proc.signal(signal.SIGHUP)
        eventually(lambda: "TLS reload failed" in proc.log_text(), timeout=10)
        assert common_name(tls_handshake(tls_port, pki.client_context())) == "second"
        assert proc.alive()
    finally:
        proc.stop()


def test_tls_only_broker_with_required_client_certificates(tmp_path: Path, pki: Pki) -> None:
    folder = tmp_path / "tls-only"
    folder.mkdir()
    config = write_config(folder, pki.server("only-server"), pki.cafile, "peer_required")
    tls_port = free_port()
    plain = free_port()
    proc = BrokerProcess(folder / "data", port=tls_port, extra_args=["--config", str(config)])
    proc.extra_args += ["--tls-port", str(tls_port), "--port", "off"]
    proc.start()
    try:
        client = pki.issue("only-client", "only.example.test", common_name="app-client")
        params = pika_params(
            tls_port, pki.client_context(client), credentials=pika.credentials.ExternalCredentials()
        )
        connection = pika.BlockingConnection(params)
        assert roundtrip(connection, "app.only") == bytes(range(256)) * 64
        connection.close()
        # no certificate: refused in the handshake (peer_required)
        with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
            tls_handshake(tls_port, pki.client_context(), read=True)
        assert "port=off" in proc.log_text()
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", plain)) != 0
    finally:
        proc.stop()


def test_bad_tls_settings_stop_the_broker_with_a_clear_error(tmp_path: Path, pki: Pki) -> None:
    folder = tmp_path / "bad"
    folder.mkdir()
    missing = CertFiles(folder / "missing.pem", folder / "missing.key")
    config = write_config(folder, missing, pki.cafile, "none")
    proc = BrokerProcess(folder / "data", extra_args=["--config", str(config)])
    proc.extra_args += ["--tls-port", str(free_port())]
    proc.spawn()
    assert proc.proc is not None
    assert proc.proc.wait(30) == 2
    assert "no such file" in proc.log_text()
    # --tls-port without a [tls] table
    plain = tmp_path / "plain"
    proc = BrokerProcess(plain / "data", extra_args=["--tls-port", str(free_port())])
    proc.spawn()
    assert proc.proc is not None
    assert proc.proc.wait(30) == 2
    assert "--tls-port needs a [tls] table" in proc.log_text()
