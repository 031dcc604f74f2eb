"""The cluster file: parsing, clear errors, and the known-hosts checksum."""

from __future__ import annotations

from pathlib import Path

import pytest

from brokerd.cluster.config import (
    ClusterConfigError,
    HostPort,
    known_hosts_checksum,
    load_cluster_config,
    parse_cluster_config,
)

GOOD = {"secret": "s3cret-s3cret", "known_hosts": ["h1:5672", "H2:5673"]}


def test_defaults_and_hosts() -> None:
    cfg = parse_cluster_config(GOOD)
    assert cfg.vhost == "/" and cfg.user == "cluster" and cfg.name == "rookery"
    assert cfg.known_hosts == (HostPort("h1", 5672), HostPort("h2", 5673))
    assert cfg.heartbeat_interval == 1.0 and cfg.heartbeat_timeout == 3.0


def test_checksum_ignores_order_case_and_duplicates() -> None:
    a = known_hosts_checksum([HostPort("h1", 1), HostPort("h2", 2)])
    b = parse_cluster_config({**GOOD, "known_hosts": ["H2:2", "h1:1", "h1:1"]}).checksum
    assert a == b
    assert a != known_hosts_checksum([HostPort("h1", 1), HostPort("h3", 2)])


def test_a_default_queue_type_is_kept_and_changes_the_checksum() -> None:
    plain = parse_cluster_config(GOOD)
    quorum = parse_cluster_config({**GOOD, "default_queue_type": "quorum"})
    assert plain.default_queue_type is None and quorum.default_queue_type == "quorum"
    # servers that resolve an untyped queue differently must not link
    assert quorum.checksum != plain.checksum
    assert plain.checksum == known_hosts_checksum(plain.known_hosts)  # unset: as before


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"known_hosts": ["h:1"]}, "'secret'"),
        ({"secret": "short", "known_hosts": ["h:1"]}, "at least 8"),
        ({"secret": "long-enough"}, "known_hosts"),
        ({**GOOD, "known_hosts": ["h:notaport"]}, "bad port"),
        ({**GOOD, "known_hosts": ["h:70000"]}, "out of range"),
        ({**GOOD, "type": "primary"}, "unknown key"),
        ({**GOOD, "heartbeat": {"interval": 2, "timeout": 1}}, "must exceed"),
        ({**GOOD, "heartbeat": {"interval": -1}}, "positive"),
        ({**GOOD, "secret_env": "ROOKERY_TEST_UNSET_VAR"}, "not set"),
        ({**GOOD, "default_queue_type": "stream"}, "default_queue_type must be one of"),
        ({**GOOD, "discovery": "rookery"}, r"\[discovery\] must be a table"),
        ({**GOOD, "discovery": {"dns": "a b"}}, "dns must be a host name"),
        ({**GOOD, "discovery": {"dns": "x", "port": 0}}, "port must be"),
        ({**GOOD, "discovery": {"dns": "x", "interval": 0}}, "interval must be"),
        ({**GOOD, "discovery": {"dns": "x", "srv": 1}}, "unknown \\[discovery\\] key"),
        ({**GOOD, "quorum_target_group_size": -1}, "whole number"),
        ({**GOOD, "quorum_target_group_size": True}, "whole number"),
    ],
)
def test_errors_name_the_problem(raw: dict, message: str) -> None:
    with pytest.raises(ClusterConfigError, match=message):
        parse_cluster_config(raw)


def test_secret_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROOKERY_TEST_SECRET", "from-the-env")
    raw = {"secret_env": "ROOKERY_TEST_SECRET", "known_hosts": ["h:1"]}
    assert parse_cluster_config(raw).secret == "from-the-env"


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ClusterConfigError, match="cannot read"):
        load_cluster_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("known_hosts = [")
    with pytest.raises(ClusterConfigError, match="not valid TOML"):
        load_cluster_config(bad)


def test_recovery_wait_defaults_to_thirty_seconds_and_must_be_positive() -> None:
    from brokerd.cluster.config import RECOVERY_WAIT, ClusterConfigError, parse_cluster_config

    base = {"secret": "s3cret-enough", "known_hosts": ["h1:5701"]}
    assert parse_cluster_config(base).recovery_wait == RECOVERY_WAIT == 30.0
    assert parse_cluster_config(base | {"recovery_wait": 5}).recovery_wait == 5.0
    for bad in (0, -1, True, "30"):
        with pytest.raises(ClusterConfigError, match="recovery_wait"):
            parse_cluster_config(base | {"recovery_wait": bad})


def test_the_default_leader_locator_is_client_local_and_takes_rabbitmqs_values() -> None:
    from brokerd.cluster.config import ClusterConfigError, parse_cluster_config

    base = {"secret": "s3cret-enough", "known_hosts": ["h1:5701"]}
    assert parse_cluster_config(base).queue_leader_locator == "client-local"
    config = parse_cluster_config(base | {"queue_leader_locator": "balanced"})
    assert config.queue_leader_locator == "balanced"
    for bad in ("min-masters", "Balanced", 1, None):
        with pytest.raises(ClusterConfigError, match="queue_leader_locator"):
            parse_cluster_config(base | {"queue_leader_locator": bad})


def test_discovery_and_the_target_group_size_stay_out_of_the_checksum() -> None:
    plain = parse_cluster_config(GOOD)
    found = parse_cluster_config(
        {**GOOD, "discovery": {"dns": "Rookery.Svc", "port": 5673}, "quorum_target_group_size": 3}
    )
    assert found.discovery is not None
    assert (found.discovery.name, found.discovery.port, found.discovery.interval) == (
        "rookery.svc",
        5673,
        10.0,
    )
    assert found.quorum_target_group_size == 3 and plain.quorum_target_group_size == 0
    assert found.checksum == plain.checksum, "they only find the cluster, or act on the root"
    # the settings checksum is what servers of different members' versions compare
    assert plain.settings_checksum == known_hosts_checksum([])
    assert parse_cluster_config({**GOOD, "default_queue_type": "quorum"}).settings_checksum != (
        plain.settings_checksum
    )
