"""Applying replicated wiring entries (``cluster.wiring.entries.apply_entry``) to a
server's model, as the root and then every server does."""

from __future__ import annotations

import pytest
from pamqp import commands

from brokerd.cluster.wiring.entries import apply_entry, entry_for
from brokerd.config import default_config
from brokerd.model.broker import Broker
from brokerd.model.errors import AMQPError

_CONFIG = default_config()
_USERS = _CONFIG.user_database()


def broker() -> Broker:
    return Broker(_USERS, _CONFIG.vhosts, _CONFIG.limits)


def test_an_unbind_of_a_queue_already_gone_is_unbind_ok() -> None:
    """aio-pika's RPC.close() cancels the consumer of its auto-delete reply queue,
    then unbinds it: through a server that is not the root, the queue is gone at
    the root by then. RabbitMQ and a single broker answer unbind-ok."""
    b = broker()
    for method in (
        commands.Queue.Unbind(queue="rpc-replies", exchange="amq.direct", routing_key="key"),
        commands.Queue.Unbind(queue="q", exchange="no-such-exchange", routing_key="key"),
    ):
        assert apply_entry(b, entry_for(method, "/")) == (False, None)


def test_an_unbind_removes_the_binding_and_a_bind_to_nothing_is_404() -> None:
    b = broker()
    apply_entry(b, entry_for(commands.Queue.Declare(queue="q"), "/"))
    assert apply_entry(
        b, entry_for(commands.Queue.Bind(queue="q", exchange="amq.direct", routing_key="k"), "/")
    )[0]
    assert apply_entry(
        b, entry_for(commands.Queue.Unbind(queue="q", exchange="amq.direct", routing_key="k"), "/")
    )[0]
    assert not b.vhosts["/"].queues["q"].bindings
    with pytest.raises(AMQPError) as caught:
        apply_entry(
            b,
            entry_for(
                commands.Queue.Bind(queue="gone", exchange="amq.direct", routing_key="k"), "/"
            ),
        )
    assert caught.value.reply_code == 404
