"""The login a local bridge uses: every vhost, the clustered one too (a cluster's
bridges move its shared queues)."""

from __future__ import annotations

from types import SimpleNamespace

from brokerd.config import default_config
from brokerd.model.broker import Broker
from brokerd.server.bridging import BRIDGE_USER, install_user


def test_the_bridge_user_may_use_every_vhost_the_clustered_one_too() -> None:
    config = default_config()
    broker = Broker(config.user_database(), config.vhosts, config.limits)
    broker.add_vhost("orders")
    broker.add_vhost("rookery-cluster")
    server = SimpleNamespace(
        broker=broker,
        cluster_config=SimpleNamespace(vhost="rookery-cluster"),
        _bridge_password="",
        _bridge_password_hash="",
    )
    install_user(server)  # type: ignore[arg-type]
    users = broker.users
    user, reason = users.authenticate(BRIDGE_USER, server._bridge_password, "10.0.0.5")
    assert user is not None, reason
    assert users.can_access_vhost(BRIDGE_USER, "/") and users.can_access_vhost(
        BRIDGE_USER, "orders"
    )
    assert users.can_access_vhost(BRIDGE_USER, "rookery-cluster")
    assert len(server._bridge_password) >= 40  # 256 random bits, URL-safe
    first = server._bridge_password
    install_user(server)  # a reload: the same password, the user in the new database
    assert server._bridge_password == first
