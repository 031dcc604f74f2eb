"""The ``user-id`` property names the user who published, as RabbitMQ checks it.

A consumer may trust ``user_id``: a publish whose ``user-id`` is not the
login's closes the channel with 406 and RabbitMQ's text; the login's own name
goes through untouched; a user tagged ``impersonator`` may set any.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pika
import pika.exceptions
import pytest

from brokerd.model.auth import hash_password
from tests.brokerd_process import BrokerProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root: Path = tmp_path_factory.mktemp("user-id")
    config = root / "brokerd.toml"
    users = [("app", []), ("relay", ["impersonator"])]
    hashed = hash_password("secret", iterations=1000)
    config.write_text(
        "".join(
            f'[[users]]\nname = "{name}"\npassword_hash = "{hashed}"\n'
            f"tags = {tags!r}\n\n"
            f'[[permissions]]\nuser = "{name}"\nvhost = "/"\n\n'
            for name, tags in users
        )
    )
    proc = BrokerProcess(root / "data", extra_args=["--config", str(config)]).start()
    try:
        yield proc
    finally:
        proc.stop()


def _channel(broker: BrokerProcess, user: str) -> tuple[pika.BlockingConnection, object]:
    url = f"amqp://{user}:secret@127.0.0.1:{broker.port}/"
    conn = pika.BlockingConnection(pika.URLParameters(url))
    return conn, conn.channel()


def _round_trip(broker: BrokerProcess, user: str, claimed: str) -> pika.BasicProperties:
    conn, ch = _channel(broker, user)
    try:
        queue = ch.queue_declare("", exclusive=True).method.queue
        ch.confirm_delivery()
        ch.basic_publish("", queue, b"x", pika.BasicProperties(user_id=claimed))
        method, props, body = ch.basic_get(queue, auto_ack=True)
        assert method is not None and body == b"x"
        return props
    finally:
        conn.close()


def test_own_name_goes_through(broker: BrokerProcess) -> None:
    assert _round_trip(broker, "app", "app").user_id == "app"


def test_another_name_is_406_and_the_connection_lives(broker: BrokerProcess) -> None:
    conn, ch = _channel(broker, "app")
    try:
        queue = ch.queue_declare("", exclusive=True).method.queue
        ch.confirm_delivery()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            ch.basic_publish("", queue, b"x", pika.BasicProperties(user_id="relay"))
        assert closed.value.reply_code == 406
        assert closed.value.reply_text == (
            "PRECONDITION_FAILED - user_id property set to 'relay' but authenticated user was 'app'"
        )
        again = conn.channel()  # only that channel closed
        assert again.queue_declare(queue, passive=True).method.message_count == 0
    finally:
        conn.close()


def test_an_impersonator_may_set_any(broker: BrokerProcess) -> None:
    assert _round_trip(broker, "relay", "someone-upstream").user_id == "someone-upstream"
