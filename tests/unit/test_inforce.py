"""The configuration in force and its sources (brokerd/consolelink/inforce.py), as the
console link and ``brokerd ctl status`` report them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from brokerd.cluster.config import ClusterConfig, HostPort
from brokerd.config import BrokerConfig, default_config, parse_config
from brokerd.consolelink import inforce, messages
from brokerd.consolelink.commands import ConsoleCommands
from brokerd.model.auth import hash_password
from brokerd.server.app import Server, ServerOptions

HASH = hash_password("pw", iterations=1000)
CLUSTER = ClusterConfig("rk", "/", "secret!!", "cluster", (HostPort("b", 2), HostPort("a", 1)))


class Host:
    """What ConsoleCommands reads and applies through."""

    def __init__(self, config: BrokerConfig, cluster: ClusterConfig | None) -> None:
        self.config = config
        self.cluster_config = cluster
        self.worker_of = None

    def keep_console_config(self, record: dict[str, Any]) -> None:
        pass

    def configure_bridges(self, bridges: list[dict[str, Any]] | None) -> None:
        self.bridges = bridges

    def configure_federation(
        self, upstreams: list[dict[str, Any]] | None, policies: list[dict[str, Any]] | None
    ) -> None:
        self.federation = (upstreams, policies)

    def install_config(self, config: BrokerConfig) -> None:
        self.config = config

    def reconfigure_cluster(self, config: ClusterConfig) -> None:
        self.cluster_config = config


def test_defaults_file_and_console_are_told_apart() -> None:
    config = parse_config(
        {
            "limits": {"heartbeat": 30},
            "users": [{"name": "app", "password_hash": HASH, "tags": ["monitoring"]}],
        },
        "brokerd.toml",
    )
    result = inforce.in_force(config, CLUSTER, None)
    doc, sources = result["document"], result["sources"]
    assert doc["limits"]["heartbeat"] == 30 and sources["limits.heartbeat"] == "file"
    assert sources["limits.frame_max"] == "default"
    assert doc["users"] == [{"name": "app", "tags": ["monitoring"]}]  # never a hash
    assert "password_hash" not in str(result)
    assert sources["users"] == "file" and sources["vhosts"] == "default"
    assert doc["known_hosts"] == ["a:1", "b:2"] and sources["known_hosts"] == "file"
    assert doc["heartbeat"] == {"interval": 1.0, "timeout": 3.0, "open_timeout": 10.0}

    # a console document's parts are the console's, whole; the rest stays the file's
    host = Host(config, CLUSTER)
    commands = ConsoleCommands(host)  # type: ignore[arg-type]
    doc_in = {"limits": {"frame_max": 65536}, "heartbeat": {"interval": 0.5, "timeout": 2}}
    ack = commands.handle(
        {
            "type": "command",
            "id": "c1",
            "command": "config.apply",
            "args": {"version": 3, "config": doc_in},
        }
    )
    assert ack["ok"], ack
    applied = commands.in_force()
    assert applied["document"]["limits"]["frame_max"] == 65536
    assert applied["sources"]["limits.frame_max"] == "console"
    assert applied["sources"]["limits.heartbeat"] == "console"  # the part is whole
    assert applied["sources"]["heartbeat"] == "console"
    assert applied["sources"]["users"] == "file" and applied["sources"]["known_hosts"] == "file"
    assert commands.in_force() is applied  # cached while nothing was replaced


def test_standalone_has_no_cluster_parts() -> None:
    result = inforce.in_force(default_config(), None, None)
    assert "heartbeat" not in result["document"] and "known_hosts" not in result["sources"]
    assert result["sources"]["users"] == "default"


def test_hello_carries_it_and_a_status_only_when_it_changed() -> None:
    from brokerd.consolelink.session import ConsoleSession

    server = Server(ServerOptions(bind="127.0.0.1", port=5998, data_dir=Path("/nonexistent")))
    commands = ConsoleCommands(server)  # type: ignore[arg-type]
    session = ConsoleSession(server, commands)  # type: ignore[arg-type]
    hello = session.hello()
    assert hello["in_force"]["sources"]["limits.frame_max"] == "default"
    assert "in_force" not in session.status()
    server.install_config(parse_config({"limits": {"channel_max": 64}}, "brokerd.toml"))
    status = session.status()
    assert status["in_force"]["document"]["limits"]["channel_max"] == 64
    assert status["in_force"]["sources"]["limits.channel_max"] == "file"
    assert "in_force" not in session.status()
    assert server.status()["settings"]["sources"]["limits.channel_max"] == "file"


def test_stopping_message() -> None:
    assert messages.stopping("s1", "SIGTERM") == {
        "type": "stopping",
        "spid": "s1",
        "reason": "SIGTERM",
    }
