"""``brokerd ctl status`` and ``ctl queues`` as an operator reads them: candidacy in
words, every server with its address, one link row per server across restarts."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from brokerd.cluster.operations import address_of, retired_spids
from brokerd.ctl import host, text
from tests.unit.test_cluster_controller import link_from, make, status


def printed(capsys: pytest.CaptureFixture[str], result: dict[str, Any]) -> list[str]:
    text.print_status(result)
    return capsys.readouterr().out.splitlines()


def row(lines: list[str], label: str) -> list[str]:
    return [line[11:] for line in lines if line.startswith(f"{label:<11}")]


def cluster_status(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "spid": "s1",
        "address": "127.0.0.1:5701",
        "type": "primary",
        "is_root": False,
        "root": "s2",
        "ready": True,
        "root_enabled": True,
        "checksum": "abcd",
        "peers": [
            {"spid": "s2", "type": "primary", "active": True, "address": "127.0.0.1:5702"},
            {"spid": "s3", "type": "secondary", "active": False, "address": ""},
        ],
    }
    base.update(over)
    return base


@pytest.mark.parametrize(
    ("over", "text"),
    [
        ({"root_enabled": True}, "root candidacy enabled"),
        ({"root_enabled": False}, "root candidacy disabled"),
        ({"type": "secondary", "root_enabled": False}, "never root (a secondary)"),
        ({"type": "standalone", "root_enabled": False, "peers": []}, "- (not clustered)"),
    ],
)
def test_candidacy_is_said_in_words(
    capsys: pytest.CaptureFixture[str], over: dict[str, Any], text: str
) -> None:
    lines = printed(capsys, cluster_status(**over))
    assert row(lines, "candidacy")[0].startswith(text)
    assert not [line for line in lines if line.startswith("root ok")]


def test_servers_are_named_with_their_address(capsys: pytest.CaptureFixture[str]) -> None:
    lines = printed(capsys, cluster_status())
    assert row(lines, "spid") == ["s1 (127.0.0.1:5701)"]
    assert row(lines, "root") == ["s2 (127.0.0.1:5702)"]
    assert row(lines, "peer") == [
        "s2 (127.0.0.1:5702) primary active",
        "s3 secondary inactive",  # a peer whose address is not known yet: its spid alone
    ]


def test_queue_owners_are_named_with_their_address(capsys: pytest.CaptureFixture[str]) -> None:
    base = {"vhost": "/", "type": "quorum", "consumers": 0, "replicas": None, "messages": 3}
    text.print_queues(
        {
            "spid": "s1",
            "queues": [
                {**base, "name": "mine", "role": "master", "owner": "s1"},
                {
                    **base,
                    "name": "theirs",
                    "role": "proxy",
                    "owner": "s2",
                    "owner_address": "127.0.0.1:5702",
                    "moving": "s3",
                    "moving_address": "127.0.0.1:5703",
                    "messages": None,
                },
                {**base, "name": "away", "role": "proxy", "owner": None, "messages": None},
            ],
        }
    )
    lines = {line.split()[1]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert "s1 (here)" in lines["mine"]
    assert "s2 (127.0.0.1:5702) -> s3 (127.0.0.1:5703)" in lines["theirs"]
    assert "- (away)" in lines["away"]


def test_a_restarted_peer_keeps_one_link_row(capsys: pytest.CaptureFixture[str]) -> None:
    """The peer at h2:2 ran as s2, then restarted as s2b: the old spid's link is down
    for good and stays in membership (a lost owner's queues wait there), but the
    views show the server once, under its new spid, as its peer row does."""
    controller, _clock = make("s1", 1.0)
    link_from(controller, 11, "s2", 2.0)
    status(controller, 11, "s2", 2.0, address="h2:2")
    link_from(controller, 12, "s2b", 5.0)
    status(controller, 12, "s2b", 5.0, address="h2:2")
    link_from(controller, 13, "s3", 3.0)
    status(controller, 13, "s3", 3.0, address="h3:3")
    assert retired_spids(controller) == {"s2"}
    assert address_of(controller, "s2b") == "h2:2" and address_of(controller, "s1") == "h1:1"
    assert address_of(controller, "s2") == "h2:2"  # where the earlier run was
    assert address_of(controller, "nobody") is None

    result = controller.status()
    assert set(result["lanes"]) >= {"s2b", "s3"}
    lines = printed(capsys, result)
    links = row(lines, "link")
    assert [line.split()[:2] for line in links] == [["s2b", "(h2:2)"], ["s3", "(h3:3)"]]
    assert row(lines, "peer")[0].startswith("s2b (h2:2) primary active (restarted; was s2)")
    # the JSON keeps its keys (DESIGN.md section 9)
    for key in ("spid", "type", "is_root", "root", "ready", "root_enabled", "peers", "checksum"):
        assert key in result


def test_link_rows_of_several_restarts_do_not_pile_up() -> None:
    result = {
        "peers": [{"spid": "s2c", "address": "h2:2", "replaces": ["s2", "s2b"]}],
        "lanes": {spid: {"state": "down"} for spid in ("s2", "s2b")} | {"s2c": {"state": "up"}},
    }
    assert [spid for spid, _lane in text.link_rows(result)] == ["s2c"]


def test_a_hosts_bridge_status_joins_every_workers_rows(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Each worker of a host runs the bridges placed on it: all are asked, a silent one
    is named, and every row says its worker."""
    answers = {
        0: {"bridges": [{"name": "a", "state": "running"}]},
        1: "not answering: timed out",
        2: {"bridges": [{"name": "b", "state": "starting"}]},
    }
    monkeypatch.setattr(host, "ask_worker", lambda _d, index, *_a: answers[index])
    workers = [{"index": i, "state": "running"} for i in range(3)] + [
        {"index": 3, "state": "stopped"}
    ]
    args = argparse.Namespace(command="bridges", action="status", json=True, data_dir=tmp_path)
    assert host.host_bridge_status(args, workers, 1.0) == 0
    out = capsys.readouterr()
    rows = json.loads(out.out)["bridges"]
    assert [(r["name"], r["worker"]) for r in rows] == [("a", "worker-0"), ("b", "worker-2")]
    assert "worker-1: not answering" in out.err
