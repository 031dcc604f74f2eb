"""The console link without sockets: snapshots and deltas, messages, commands."""

from __future__ import annotations

import datetime
import decimal
import json
import random
from pathlib import Path
from typing import Any

import pytest

from brokerd.cluster.config import ClusterConfig, HostPort
from brokerd.config import BrokerConfig, default_config
from brokerd.configdoc import document_checksum, validate_document
from brokerd.consolelink import messages
from brokerd.consolelink.commands import (
    REMEMBERED_COMMANDS,
    ConsoleCommands,
    merge_broker_config,
    merge_cluster_config,
)
from brokerd.consolelink.link import backoff_delays
from brokerd.consolelink.session import ConsoleSession
from brokerd.consolelink.tracker import FULL_EVERY, SnapshotTracker, collect, delta, jsonable
from brokerd.model.auth import Permission, User, hash_password
from brokerd.model.message import Message
from brokerd.server.app import Server, ServerOptions

HASH = hash_password("pw", iterations=1000)


@pytest.fixture(scope="module")
def server() -> Server:
    """A real, never started server: its model is what the link reads."""
    return Server(ServerOptions(bind="127.0.0.1", port=5999, data_dir=Path("/nonexistent")))


@pytest.fixture
def fresh(server: Server) -> Server:
    vhost = server.broker.vhosts["/"]
    for name in list(vhost.queues):
        vhost.delete_queue(name)
    for name in [n for n in vhost.exchanges if n.startswith("t.")]:
        vhost.delete_exchange(name)
    return server


def command(command_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {"v": 1, "type": "command", "id": command_id, "command": name, "args": args}


# -- snapshots and deltas -------------------------------------------------------------


def test_collect_lists_queues_exchanges_bindings_with_protocol_fields(fresh: Server):
    vhost = fresh.broker.vhosts["/"]
    queue, _ = vhost.declare_queue("t.q", connection_id=1, durable=True, arguments={"x-a": b"b"})
    exchange, _ = vhost.declare_exchange("t.x", "topic")
    vhost.bind(exchange, queue, "a.#")
    snap = collect(fresh.broker)
    entry = snap["queues"][("/", "t.q")]
    assert entry == {
        "vhost": "/",
        "name": "t.q",
        "durable": True,
        "exclusive": False,
        "auto_delete": False,
        "shared": False,
        "master": True,
        "messages": 0,
        "unacked": 0,
        "consumers": 0,
        "enqueued": 0,
        "delivered": 0,
        "arguments": {"x-a": "b"},
        "type": "classic",
    }
    assert snap["exchanges"][("/", "t.x")]["type"] == "topic"
    assert snap["exchanges"][("/", "t.x")]["shared"] is False  # standalone: nothing shared
    assert snap["exchanges"][("/", "")]["name"] == ""
    assert snap["bindings"][("/", "t.x", "t.q", "queue", "a.#")]["destination_type"] == "queue"
    assert collect(fresh.broker, cluster_vhost="/")["queues"][("/", "t.q")]["shared"] is True


def test_queue_counters_follow_routing(fresh: Server):
    vhost = fresh.broker.vhosts["/"]
    queue, _ = vhost.declare_queue("t.count", connection_id=1)
    for _ in range(3):
        queue.push(Message("", "t.count", b"", b"x"))
    queue.take()
    entry = collect(fresh.broker)["queues"][("/", "t.count")]
    assert (entry["messages"], entry["enqueued"], entry["delivered"]) == (2, 3, 1)


def test_first_status_is_full_then_deltas_then_full_every_30th():
    tracker = SnapshotTracker()
    a = {"queues": {("/", "a"): {"name": "a", "messages": 0}}, "exchanges": {}, "bindings": {}}
    full, body = tracker.next(a)
    assert full and body["queues"] == [{"name": "a", "messages": 0}]
    full, body = tracker.next(a)
    assert not full
    assert body["queues"] == {"upsert": [], "remove": []}
    fulls = [tracker.next(a)[0] for _ in range(FULL_EVERY * 2)]
    # statuses 3..62: the 31st and 61st are full
    assert [i + 3 for i, f in enumerate(fulls) if f] == [31, 61]


def test_delta_upserts_changed_and_new_entries_and_removes_gone_ones():
    tracker = SnapshotTracker()
    before = {
        "queues": {("/", "a"): {"name": "a", "n": 0}, ("/", "b"): {"name": "b", "n": 0}},
        "exchanges": {},
        "bindings": {("/", "x", "a", "queue", "k"): {"source": "x"}},
    }
    tracker.next(before)
    after = {
        "queues": {("/", "a"): {"name": "a", "n": 5}, ("/", "c"): {"name": "c", "n": 0}},
        "exchanges": {},
        "bindings": {},
    }
    full, body = tracker.next(after)
    assert not full
    assert body["queues"]["upsert"] == [{"name": "a", "n": 5}, {"name": "c", "n": 0}]
    assert body["queues"]["remove"] == [["/", "b"]]
    assert body["bindings"] == {"upsert": [], "remove": [["/", "x", "a", "queue", "k"]]}
    assert body["exchanges"] == {"upsert": [], "remove": []}


def test_resync_makes_the_next_status_full_and_deltas_resume_from_it():
    tracker = SnapshotTracker()
    snap = {"queues": {("/", "a"): {"n": 0}}, "exchanges": {}, "bindings": {}}
    tracker.next(snap)
    tracker.next(snap)
    tracker.request_full()
    full, body = tracker.next({**snap, "queues": {("/", "a"): {"n": 1}}})
    assert full and body["queues"] == [{"n": 1}]
    full, body = tracker.next({**snap, "queues": {("/", "a"): {"n": 1}}})
    assert not full and body["queues"]["upsert"] == []


def test_delta_of_identical_sections_is_empty():
    section = {("/", "q"): {"a": 1}}
    assert delta(section, dict(section)) == {"upsert": [], "remove": []}


def test_jsonable_turns_amqp_values_into_json():
    value = {
        "b": b"text",
        "raw": b"\xff\x00",
        "d": decimal.Decimal("1.5"),
        "t": datetime.datetime(2024, 1, 2, 3, 4, 5),
        "nested": [{"x": (1, 2)}],
    }
    out = jsonable(value)
    json.dumps(out)
    assert out["b"] == "text"
    assert out["raw"] == "base64:/wA="
    assert out["d"] == "1.5"
    assert out["t"] == "2024-01-02T03:04:05"
    assert out["nested"] == [{"x": [1, 2]}]


# -- messages --------------------------------------------------------------------------


def test_hello_carries_identity_and_applied_config(server: Server):
    hello = messages.hello(server, 3, "abcd")
    assert hello["type"] == "hello"
    assert hello["spid"] == server.spid
    assert hello["name"] == hello["address"] == "127.0.0.1:5999"
    assert hello["broker_type"] == "standalone"
    assert hello["cluster"] is None and hello["checksum"] is None
    assert hello["heartbeat_interval"] == 1.0
    assert (hello["config_version"], hello["config_checksum"]) == (3, "abcd")
    assert json.loads(messages.encode(hello))["v"] == 1


def test_a_workers_hello_names_it_under_its_host() -> None:
    worker = Server(
        ServerOptions(
            bind="127.0.0.1",
            port=5998,
            data_dir=Path("/nonexistent"),
            host_address="10.0.0.5:5672",
            host_workers=4,
            worker_index=2,
        )
    )
    hello = messages.hello(worker, None, None)
    assert hello["name"] == "worker-2@10.0.0.5:5672"
    assert hello["address"] == hello["host"] == "10.0.0.5:5672"
    assert (hello["worker"], hello["workers"]) == (2, 4)
    assert hello["broker_type"] == "standalone" and hello["cluster"] is None
    assert json.loads(messages.encode(hello))["v"] == 1


def test_status_has_every_documented_part(fresh: Server):
    session = ConsoleSession(fresh, ConsoleCommands(fresh))
    first = json.loads(messages.encode(session.status(now=12.5)))
    assert first["seq"] == 1 and first["full"] is True and first["time"] == 12.5
    assert set(first["view"]) >= {
        "is_root",
        "root",
        "ready",
        "root_enabled",
        "peers",
        "alarms",
        "bridges",
    }
    assert set(first["counts"]) == {
        "connections",
        "channels",
        "consumers",
        "vhosts",
        "exchanges",
        "queues",
        "bindings",
        "messages_ready",
        "messages_unacked",
    }
    assert set(first["totals"]) == {
        "published",
        "routed",
        "delivered",
        "acked",
        "returned",
        "bridged",
    }
    assert set(first["rates"]) == {"published", "routed", "delivered"}
    # what the broker runs: nothing from the console yet, so its own files
    assert (first["config_version"], first["config_checksum"]) == (None, None)
    assert isinstance(first["queues"], list) and isinstance(first["exchanges"], list)
    fresh.broker.vhosts["/"].declare_queue("t.new", connection_id=1)
    second = session.status()
    assert second["seq"] == 2 and second["full"] is False
    assert [q["name"] for q in second["queues"]["upsert"]] == ["t.new"]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("not json", "not JSON"),
        (b"\xff", "not UTF-8"),
        ("[1]", "not a JSON object"),
        ('{"type": "resync"}', "version"),
        ('{"v": 2, "type": "resync"}', "version"),
        ('{"v": 1}', "no 'type'"),
        ('{"v": 1, "type": "command", "command": "state.dump"}', "'id'"),
        ('{"v": 1, "type": "command", "id": "", "command": "state.dump"}', "'id'"),
        ('{"v": 1, "type": "command", "id": "a"}', "'command'"),
        ('{"v": 1, "type": "command", "id": "a", "command": "x", "args": [1]}', "'args'"),
    ],
)
def test_malformed_console_messages_are_refused(text, problem):
    with pytest.raises(messages.MalformedMessage, match=problem):
        messages.parse(text)


def test_session_answers_commands_and_ignores_unknown_types(fresh: Server):
    session = ConsoleSession(fresh, ConsoleCommands(fresh))
    assert session.receive('{"v": 1, "type": "whatever"}') == []
    assert session.receive('{"v": 1, "type": "welcome", "config_version": 4}') == []
    assert session.console_version == 4
    [reply] = session.receive(json.dumps(command("c1", "state.dump")))
    assert (
        reply["type"] == "ack"
        and reply["ok"]
        and "=== brokerd state dump ===" in (reply["result"]["dump"])
    )
    session.status()
    session.receive('{"v": 1, "type": "resync"}')
    assert session.status()["full"] is True


# -- commands ---------------------------------------------------------------------------


def test_root_commands_on_a_standalone_broker_fail_with_a_reason(server: Server):
    commands = ConsoleCommands(server)
    ack = commands.handle(command("r1", "root.disable"))
    assert ack["ok"] is False and "needs a clustered broker" in ack["error"]
    assert ack["result"] is None


def test_unknown_command_is_refused(server: Server):
    ack = ConsoleCommands(server).handle(command("u1", "rm.rf"))
    assert not ack["ok"] and "unknown command 'rm.rf'" in ack["error"]


class RecordingServer:
    """Just what ConsoleCommands.apply touches, recording what it is asked to do."""

    def __init__(
        self, cluster_config: ClusterConfig | None, worker_of: tuple[str, int, int] | None = None
    ) -> None:
        self.config: BrokerConfig = default_config()
        self.cluster_config = cluster_config
        self.worker_of = worker_of
        self.installed: list[BrokerConfig] = []
        self.reconfigured: list[ClusterConfig] = []
        self.kept: list[dict[str, Any]] = []

    def keep_console_config(self, record: dict[str, Any]) -> None:
        self.kept.append(record)

    def configure_bridges(self, bridges: list[dict[str, Any]] | None) -> None:
        self.bridges = bridges

    def configure_federation(
        self, upstreams: list[dict[str, Any]] | None, policies: list[dict[str, Any]] | None
    ) -> None:
        self.federation = (upstreams, policies)

    def install_config(self, config: BrokerConfig) -> None:
        self.installed.append(config)
        self.config = config

    def reconfigure_cluster(self, config: ClusterConfig) -> None:
        self.reconfigured.append(config)
        self.cluster_config = config


CLUSTER = ClusterConfig("rk", "/", "secret!!", "cluster", (HostPort("a", 1), HostPort("b", 2)))
DOC = {
    "heartbeat": {"interval": 0.5, "timeout": 2},
    "known_hosts": ["A:1", "c:3"],
    "vhosts": ["/", "app"],
    "users": [{"name": "app", "password_hash": HASH, "tags": []}],
    "permissions": [{"user": "app", "vhost": "app"}],
}


def test_config_apply_applies_every_part_and_acks_the_checksum():
    fake = RecordingServer(CLUSTER)
    commands = ConsoleCommands(fake)  # type: ignore[arg-type]
    ack = commands.handle(command("c1", "config.apply", version=2, config=DOC))
    assert ack["ok"], ack
    result = ack["result"]
    assert result["config_version"] == 2
    assert result["config_checksum"] == document_checksum(validate_document(DOC))
    assert sorted(result["applied"]) == [
        "heartbeat",
        "known_hosts",
        "permissions",
        "users",
        "vhosts",
    ]
    assert (commands.config_version, commands.config_checksum) == (2, result["config_checksum"])
    [installed] = fake.installed
    assert [u.name for u in installed.users] == ["app"]
    assert installed.vhosts == ["/", "app"]
    [cluster] = fake.reconfigured
    assert cluster.heartbeat_interval == 0.5 and cluster.heartbeat_timeout == 2.0
    assert cluster.known_hosts == (HostPort("a", 1), HostPort("c", 3))
    assert cluster.secret == CLUSTER.secret
    # kept for the next start, as applied
    [kept] = fake.kept
    assert kept["version"] == 2 and kept["config"] == validate_document(DOC)


def test_config_apply_on_a_worker_keeps_its_hosts_own_cluster():
    """A worker's cluster is its host's local one (written at each start): pushed
    known hosts or heartbeat timing must not replace it."""
    fake = RecordingServer(CLUSTER, worker_of=("10.0.0.5:5672", 1, 2))
    ack = ConsoleCommands(fake).handle(command("c1", "config.apply", version=1, config=DOC))  # type: ignore[arg-type]
    assert ack["ok"]
    assert ack["result"]["skipped"] == ["heartbeat", "known_hosts"]
    assert fake.reconfigured == [] and fake.cluster_config is CLUSTER
    assert [u.name for u in fake.installed[0].users] == ["app"]  # the broker parts apply


def test_config_apply_on_a_standalone_broker_skips_the_cluster_parts():
    fake = RecordingServer(None)
    ack = ConsoleCommands(fake).handle(command("c1", "config.apply", version=1, config=DOC))  # type: ignore[arg-type]
    assert ack["ok"]
    assert ack["result"]["skipped"] == ["heartbeat", "known_hosts"]
    assert fake.reconfigured == []


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"config": {}}, "needs 'version'"),
        ({"version": "3", "config": {}}, "needs 'version'"),
        ({"version": True, "config": {}}, "needs 'version'"),
        ({"version": 3}, "needs 'config'"),
        ({"version": 3, "config": {"heartbeat": {"interval": 0}}}, "config: heartbeat.interval"),
        (
            {"version": 3, "config": {"users": [{"name": "a", "password_hash": "plain"}]}},
            "config: users[0].password_hash",
        ),
    ],
)
def test_bad_config_apply_is_refused_and_nothing_changes(args, error):
    fake = RecordingServer(CLUSTER)
    commands = ConsoleCommands(fake)  # type: ignore[arg-type]
    ack = commands.handle({"id": "x", "command": "config.apply", "args": args})
    assert ack["ok"] is False and error in ack["error"]
    assert fake.installed == [] and fake.reconfigured == []
    assert commands.config_version is None


def test_an_older_version_than_the_applied_one_is_refused():
    fake = RecordingServer(CLUSTER)
    commands = ConsoleCommands(fake)  # type: ignore[arg-type]
    assert commands.handle(command("a", "config.apply", version=5, config={}))["ok"]
    ack = commands.handle(command("b", "config.apply", version=4, config={"vhosts": ["x"]}))
    assert not ack["ok"] and "older than the applied version 5" in ack["error"]
    assert len(fake.installed) == 1  # version 5's, nothing after it
    assert commands.running() == (5, document_checksum({}))


def test_pushes_are_ordered_by_serial_so_an_older_version_can_be_pushed_again():
    fake = RecordingServer(CLUSTER)
    commands = ConsoleCommands(fake)  # type: ignore[arg-type]
    assert commands.handle(command("a", "config.apply", version=5, serial=5, config={}))["ok"]
    again = commands.handle(
        command("b", "config.apply", version=3, serial=6, config={"vhosts": ["/", "x"]})
    )
    assert again["ok"], again
    assert commands.running() == (3, document_checksum({"vhosts": ["/", "x"]}))
    late = commands.handle(command("c", "config.apply", version=5, serial=5, config={}))
    assert not late["ok"] and "older than the applied push 6" in late["error"]
    assert commands.running()[0] == 3


def test_a_missing_key_means_the_broker_files_value_whatever_an_earlier_version_set():
    fake = RecordingServer(CLUSTER)
    file_config = fake.config
    commands = ConsoleCommands(fake)  # type: ignore[arg-type]
    assert commands.handle(command("a", "config.apply", version=1, config=DOC))["ok"]
    assert fake.cluster_config.heartbeat_timeout == 2.0
    assert commands.handle(command("b", "config.apply", version=2, config={}))["ok"]
    # back to the cluster file's heartbeat and known hosts, and brokerd.toml's users
    assert fake.cluster_config.heartbeat_timeout == CLUSTER.heartbeat_timeout
    assert fake.cluster_config.known_hosts == CLUSTER.known_hosts
    assert fake.config.users == file_config.users
    assert commands.running() == (2, document_checksum({}))


def test_running_is_cleared_by_a_reload_that_replaces_the_documents_broker_parts():
    fake = RecordingServer(CLUSTER)
    commands = ConsoleCommands(fake)  # type: ignore[arg-type]
    assert commands.running() == (None, None)  # nothing applied: the broker's own files
    commands.handle(command("a", "config.apply", version=1, config={"heartbeat": {"timeout": 4}}))
    checksum = commands.running()[1]
    assert checksum is not None
    fake.config = default_config()  # SIGHUP: brokerd.toml read again
    # the document has no broker part: the reloaded file is what it says
    assert commands.running() == (1, checksum)
    commands.handle(command("b", "config.apply", version=2, config=DOC))
    assert commands.running()[0] == 2
    fake.config = default_config()  # SIGHUP again: users from the file, not version 2's
    assert commands.running() == (None, None)


def test_a_repeated_id_gets_the_first_answer_without_running_again():
    fake = RecordingServer(CLUSTER)
    commands = ConsoleCommands(fake)  # type: ignore[arg-type]
    first = commands.handle(command("same", "config.apply", version=1, config={"vhosts": ["/"]}))
    again = commands.handle(command("same", "config.apply", version=1, config={"vhosts": ["/"]}))
    assert again is first
    assert len(fake.installed) == 1


def test_only_the_last_256_ids_are_remembered():
    fake = RecordingServer(CLUSTER)
    commands = ConsoleCommands(fake)  # type: ignore[arg-type]
    doc = {"vhosts": ["/"]}
    for i in range(REMEMBERED_COMMANDS + 1):
        commands.handle(command(f"id{i}", "config.apply", version=1, config=doc))
    assert len(fake.installed) == REMEMBERED_COMMANDS + 1
    commands.handle(command(f"id{REMEMBERED_COMMANDS}", "config.apply", version=1, config=doc))
    assert len(fake.installed) == REMEMBERED_COMMANDS + 1  # still remembered
    commands.handle(command("id0", "config.apply", version=1, config=doc))
    assert len(fake.installed) == REMEMBERED_COMMANDS + 2  # forgotten: runs again


def test_merge_keeps_what_the_document_omits():
    current = BrokerConfig(
        vhosts=["/", "old"],
        users=[User("a", HASH), User("b", HASH)],
        permissions=[("a", "/", Permission()), ("b", "old", Permission())],
    )
    merged = merge_broker_config(current, validate_document({"limits": {"heartbeat": 5}}))
    assert merged.users == current.users and merged.permissions == current.permissions
    assert merged.limits.heartbeat == 5
    # users without permissions: the remaining users keep theirs
    doc = validate_document({"users": [{"name": "b", "password_hash": HASH}]})
    merged = merge_broker_config(current, doc)
    assert [u.name for u in merged.users] == ["b"]
    assert [(u, v) for u, v, _ in merged.permissions] == [("b", "old")]
    # vhosts are only added
    merged = merge_broker_config(current, validate_document({"vhosts": ["new"]}))
    assert merged.vhosts == ["/", "old", "new"]
    # guest from a document is loopback-only, as in brokerd.toml
    doc = validate_document({"users": [{"name": "guest", "password_hash": HASH}]})
    assert merge_broker_config(current, doc).users[0].loopback_only


def test_merge_cluster_config_keeps_identity():
    merged = merge_cluster_config(CLUSTER, validate_document({"known_hosts": ["[::1]:5701"]}))
    assert merged.known_hosts == (HostPort("::1", 5701),)
    assert (merged.name, merged.secret, merged.heartbeat_interval) == ("rk", "secret!!", 1.0)


def test_backoff_doubles_to_15s_with_jitter():
    delays = backoff_delays(rng=random.Random(7))
    values = [next(delays) for _ in range(10)]
    bases = [0.5, 1, 2, 4, 8, 15, 15, 15, 15, 15]
    for value, base in zip(values, bases, strict=True):
        assert 0.75 * base <= value <= 1.25 * base
    assert len(set(values[5:])) > 1  # jittered, not in step


def test_a_console_that_is_not_there_is_tried_again_within_seconds():
    """A restarted console is linked again in seconds, whatever the outage's length:
    its stale detection waits BROKER_RECONNECT_GRACE (6 s) for the brokers."""
    from brokerd.consolelink.link import ABSENT_MAX

    delays = backoff_delays(maximum=ABSENT_MAX, rng=random.Random(7))
    values = [next(delays) for _ in range(50)]
    assert max(values) <= 1.25 * ABSENT_MAX < 6 / 2


def test_config_apply_of_limits_and_vhost_limits_reaches_the_broker():
    """The console's limits (sizes included) and vhost limits, through a real server's
    install path: the model's checks and the resource monitor read them at once."""
    server = Server(ServerOptions(bind="127.0.0.1", port=5999, data_dir=Path("/nonexistent")))
    doc = {
        "limits": {"max_queues": 7, "vm_memory_high_watermark": "1GiB", "disk_free_limit": "2GB"},
        "vhosts": ["/", "app"],
        "vhost_limits": {"app": {"max_connections": 3}},
    }
    ack = ConsoleCommands(server).handle(command("c1", "config.apply", version=1, config=doc))
    assert ack["ok"], ack
    assert sorted(ack["result"]["applied"]) == ["limits", "vhost_limits", "vhosts"]
    assert server.broker.limits.max_queues == 7
    assert server.resources.memory_limit == 1024**3
    assert server.resources.status()["disk"]["limit"] == 2 * 10**9
    assert server.broker.vhost_limit("app", "max_connections") == 3
    # a later document without vhost_limits keeps them; one with an empty map clears them
    ConsoleCommands(server).handle(command("c2", "config.apply", version=2, config={}))
    assert server.broker.vhost_limit("app", "max_connections") == 3
    doc = {"vhosts": ["/", "app"], "vhost_limits": {}}
    assert ConsoleCommands(server).handle(command("c3", "config.apply", version=3, config=doc))[
        "ok"
    ]
    assert server.broker.vhost_limits == {}
