"""Cluster links over mutual TLS (cluster file ``[tls] links = "required"``).

The routing and failover suites run with TLS links too (their fixtures take
``tls``); here: what only TLS brings, a primary with a certificate the
cluster CA did not issue, a plain link into a TLS cluster, and the checksum
that keeps a plain server out of a TLS cluster.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import ssl
import threading
from pathlib import Path

import pika
import pytest

from brokerd.cluster.config import ClusterConfigError, load_cluster_config
from brokerd.cluster.linktls import LinkTLS
from tests.cluster_harness import Cluster, write_cluster_file
from tests.support.certs import Pki
from tests.support.eventually import eventually

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(120)]


def alarms(cluster: Cluster, index: int) -> dict[str, str]:
    view = cluster.status(index) or {}
    return {a["kind"]: a["message"] for a in view.get("alarms", []) if "kind" in a}


def test_links_run_over_tls_and_carry_messages(make_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(3, 0, tls=True)
    root = cluster.start_settled()
    a, b = cluster.followers(root)
    # the known hosts are the AMQPS ports, and every server links to the others there
    view = cluster.status(a)
    assert view is not None
    assert view["address"] == f"127.0.0.1:{cluster.nodes[a].tls_port}"
    assert {p["spid"] for p in view["peers"] if p["active"]} == {
        cluster.spid(root),
        cluster.spid(b),
    }
    # a shared queue declared on one server, fed on another, drained on the third
    body = bytes(range(256)) * 40
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.ports[a])) as c:
        c.channel().queue_declare("tls.shared", durable=True)
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.ports[b])) as c:
        channel = c.channel()
        channel.confirm_delivery()
        for i in range(200):
            channel.basic_publish(
                "", "tls.shared", body + b"%d" % i, pika.BasicProperties(delivery_mode=2)
            )
    got: list[bytes] = []
    with pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", cluster.ports[root])) as c:
        channel = c.channel()
        for _ in range(400):
            method, _props, message = channel.basic_get("tls.shared", auto_ack=True)
            if method is None:
                if len(got) == 200:
                    break
                c.sleep(0.05)
                continue
            got.append(message)
    assert got == [body + b"%d" % i for i in range(200)]
    # the peers' certificates were checked: a TLS handshake with the cluster CA works,
    # and each server serves its own certificate from the cluster file
    assert cluster.pki is not None
    context = cluster.pki.client_context()
    with (
        socket.create_connection(("127.0.0.1", cluster.nodes[a].tls_port or 0), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as sock,
    ):
        subject = dict(x[0] for x in sock.getpeercert()["subject"])  # type: ignore[index]
        assert subject["commonName"] == cluster.nodes[a].tls_name


def test_a_primary_with_a_certificate_from_another_ca_is_refused_with_alarms(
    make_cluster,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    """A server whose certificate the cluster CA did not issue does not start (it
    says why); and a peer address that serves such a certificate (here a plain TLS
    server in its place) is refused by every link to it, with an alarm."""
    cluster = make_cluster(3, 0, tls=True)
    rogue_ca = Pki(tmp_path / "rogue", name="rogue")
    rogue = rogue_ca.issue("rogue-n2", "127.0.0.1", common_name="rogue")
    port2 = cluster.nodes[2].tls_port
    text = cluster.file.read_text()
    own = re.search(
        rf'\[tls\.servers\."127\.0\.0\.1:{port2}"\]\ncertfile = "[^"]*"\nkeyfile = "[^"]*"\n',
        text,
    )
    assert own is not None
    bad_file = tmp_path / "cluster-rogue.toml"
    bad_file.write_text(
        text.replace(
            own.group(0),
            f'[tls.servers."127.0.0.1:{port2}"]\ncertfile = "{rogue.certfile}"\n'
            f'keyfile = "{rogue.keyfile}"\n',
        )
    )
    cluster._spawn(2, file=bad_file)
    process = cluster.servers[2]
    assert process.proc is not None and process.proc.wait(30) == 2
    assert "would be refused by its peers for 127.0.0.1" in process.log_text()
    assert "unable to get local issuer certificate" in process.log_text()

    # something answers at node 2's address with the rogue certificate
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(rogue.certfile, rogue.keyfile)
    impostor = socket.create_server(("127.0.0.1", port2 or 0))
    stop = threading.Event()

    def serve() -> None:
        impostor.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = impostor.accept()
            except TimeoutError:
                continue
            with contextlib.suppress(OSError), conn, context.wrap_socket(conn, server_side=True):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        cluster.start(0)
        cluster.start(1)
        cluster.wait_until(lambda: cluster.settled_root([0, 1]), timeout=30, what="a root")
        address2 = f"127.0.0.1:{port2}"
        eventually(
            lambda: all(
                "failed verification against the cluster CA"
                in alarms(cluster, i).get(f"link:{address2}", "")
                for i in (0, 1)
            ),
            timeout=20,
            what="the link alarms",
            explain=lambda: json.dumps({i: alarms(cluster, i) for i in (0, 1)}, indent=1),
        )
        assert "TLS: the peer's certificate failed verification" in cluster.servers[0].log_text()
    finally:
        stop.set()
        thread.join(5)
        impostor.close()


def test_a_plain_link_into_a_tls_cluster_is_refused(make_cluster) -> None:  # type: ignore[no-untyped-def]
    """A link that presents no certificate (over TLS) is refused at admission, with
    an alarm naming why, even with the right secret and checksum."""
    cluster = make_cluster(2, 0, tls=True)
    cluster.start_settled()
    assert cluster.pki is not None
    view = cluster.status(0)
    assert view is not None
    props = {
        "rookery_link": {
            "spid": "intruder",
            "type": "secondary",
            "callback": "",
            "start_time": 0,
            "checksum": view["checksum"],
            "lane": "control",
        }
    }
    params = pika.ConnectionParameters(
        "127.0.0.1",
        cluster.nodes[0].tls_port,
        credentials=pika.PlainCredentials("cluster", "cluster-secret-123"),
        ssl_options=pika.SSLOptions(cluster.pki.client_context(), server_hostname="127.0.0.1"),
        client_properties=props,
        connection_attempts=1,
    )
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        connection = pika.BlockingConnection(params)
        connection.channel()
    eventually(
        lambda: any("presented no client certificate" in m for m in alarms(cluster, 0).values()),
        timeout=10,
        what="the inbound-tls alarm",
        explain=lambda: json.dumps(alarms(cluster, 0)),
    )
    # over the plain port it is refused for that
    params = pika.ConnectionParameters(
        "127.0.0.1",
        cluster.ports[0],
        credentials=pika.PlainCredentials("cluster", "cluster-secret-123"),
        client_properties=props,
        connection_attempts=1,
    )
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        connection = pika.BlockingConnection(params)
        connection.channel()
    eventually(
        lambda: any("came over plain TCP" in m for m in alarms(cluster, 0).values()),
        timeout=10,
        what="the plain-link alarm",
    )


def test_tls_on_links_is_part_of_the_checksum(tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    server = pki.server()
    plain = write_cluster_file(tmp_path / "plain.toml", [5671, 5672])
    tls = write_cluster_file(
        tmp_path / "tls.toml",
        [5671, 5672],
        tls=f'[tls]\nlinks = "required"\ncafile = "{pki.cafile}"\n'
        f'certfile = "{server.certfile}"\nkeyfile = "{server.keyfile}"\n',
    )
    off = write_cluster_file(tmp_path / "off.toml", [5671, 5672], tls='[tls]\nlinks = "off"\n')
    assert load_cluster_config(plain).checksum == load_cluster_config(off).checksum
    assert load_cluster_config(plain).checksum != load_cluster_config(tls).checksum
    # a cluster CA that cannot be read stops the server with the reason
    config = load_cluster_config(tls)
    assert config.tls is not None
    shutil.rmtree(tmp_path / "pki")
    with pytest.raises(ClusterConfigError, match="cannot read CA file"):
        LinkTLS(config.tls)
