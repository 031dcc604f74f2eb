"""brokerd.tls, the cluster file's [tls] table, and EXTERNAL in the handshake (no sockets)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trustme
from cryptography import x509

from brokerd.cluster.config import ClusterConfigError, parse_cluster_config
from brokerd.config import ConfigError, parse_config
from brokerd.model.auth import User, UserDatabase, hash_password
from brokerd.model.errors import ConnectionError_
from brokerd.protocol.handshake import mechanisms, parse_credentials
from brokerd.tls import (
    MODERN_CIPHERS,
    TLSConfigError,
    TLSSettings,
    ca_subjects,
    check_certificate,
    login_name,
    parse_tls,
    reload_context,
    server_context,
)
from tests.support.certs import Pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


def test_parse_tls_defaults_and_relative_paths(tmp_path: Path) -> None:
    settings = parse_tls({"certfile": "s.pem", "keyfile": "/abs/s.key"}, "tls", tmp_path)
    assert settings.certfile == tmp_path / "s.pem"
    assert settings.keyfile == Path("/abs/s.key")
    assert (settings.verify, settings.min_version, settings.ciphers) == (
        "none",
        "1.2",
        MODERN_CIPHERS,
    )
    assert settings.login_from == "common_name"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"keyfile": "k"}, "'certfile' is required"),
        ({"certfile": "c", "keyfile": "k", "verify": "always"}, "verify: one of"),
        ({"certfile": "c", "keyfile": "k", "verify": "peer"}, "needs a 'cafile'"),
        ({"certfile": "c", "keyfile": "k", "min_version": "1.0"}, "min_version"),
        ({"certfile": "c", "keyfile": "k", "san_index": -1}, "san_index"),
        ({"certfile": "c", "keyfile": "k", "login_from": "email"}, "login_from"),
        ({"certfile": "c", "keyfile": "k", "port": 5671}, "unknown key"),
        ({"certfile": 5, "keyfile": "k"}, "must be a file path"),
    ],
)
def test_parse_tls_refuses_bad_tables(table: dict, message: str) -> None:
    with pytest.raises(TLSConfigError, match=message):
        parse_tls(table, "tls")


def test_brokerd_toml_tls_table_and_its_errors(tmp_path: Path, pki: Pki) -> None:
    server = pki.server()
    config = parse_config(
        {"tls": {"certfile": str(server.certfile), "keyfile": str(server.keyfile)}}, "b", tmp_path
    )
    assert config.tls is not None and config.tls.certfile == server.certfile
    with pytest.raises(ConfigError, match="b: tls: 'certfile' is required"):
        parse_config({"tls": {}}, "b")


def test_server_context_modes_and_a_missing_file(tmp_path: Path, pki: Pki) -> None:
    server = pki.server()
    none = server_context(TLSSettings(server.certfile, server.keyfile))
    assert none.verify_mode == ssl.CERT_NONE
    assert none.minimum_version == ssl.TLSVersion.TLSv1_2
    peer = server_context(TLSSettings(server.certfile, server.keyfile, pki.cafile, "peer"))
    assert peer.verify_mode == ssl.CERT_OPTIONAL
    # links need a certificate asked for, even where clients are not asked
    with_cluster = server_context(TLSSettings(server.certfile, server.keyfile), (pki.cafile,))
    assert with_cluster.verify_mode == ssl.CERT_OPTIONAL
    required = TLSSettings(server.certfile, server.keyfile, pki.cafile, "peer_required")
    assert server_context(required).verify_mode == ssl.CERT_REQUIRED
    with pytest.raises(TLSConfigError, match="no such file"):
        server_context(TLSSettings(tmp_path / "nope.pem", tmp_path / "nope.key"))
    with pytest.raises(TLSConfigError, match="OpenSSL knows none"):
        server_context(TLSSettings(server.certfile, server.keyfile, ciphers="NOT-A-CIPHER"))


def test_reload_keeps_the_running_context_when_a_file_is_bad(tmp_path: Path, pki: Pki) -> None:
    server = pki.server("reload")
    settings = TLSSettings(server.certfile, server.keyfile)
    context = server_context(settings)
    broken = tmp_path / "broken.pem"
    broken.write_text("junk")
    with pytest.raises(TLSConfigError):
        reload_context(context, TLSSettings(broken, server.keyfile))
    reload_context(context, settings)  # the same files again: fine


def _cert(ca: trustme.CA, *names: str, common_name: str | None = None) -> x509.Certificate:
    leaf = ca.issue_cert(*names, common_name=common_name)
    return x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes())


@pytest.mark.parametrize(
    ("login_from", "san_type", "san_index", "expected"),
    [
        ("common_name", "dns", 0, "app-user"),
        ("subject_alternative_name", "dns", 0, "svc.example.test"),
        ("subject_alternative_name", "dns", 1, "other.example.test"),
        ("subject_alternative_name", "dns", 2, None),
        ("subject_alternative_name", "email", 0, "ops@example.test"),
        ("subject_alternative_name", "ip", 0, "10.0.0.7"),
        ("subject_alternative_name", "uri", 0, None),
    ],
)
def test_login_name_as_rabbitmq_auth_mechanism_ssl(
    login_from: str, san_type: str, san_index: int, expected: str | None
) -> None:
    ca = trustme.CA()
    cert = _cert(
        ca,
        "svc.example.test",
        "other.example.test",
        "ops@example.test",
        "10.0.0.7",
        common_name="app-user",
    )
    settings = TLSSettings(
        Path("c"), Path("k"), login_from=login_from, san_type=san_type, san_index=san_index
    )
    assert login_name(cert, settings) == expected


def test_login_name_distinguished_name() -> None:
    ca = trustme.CA()
    cert = _cert(ca, "x.example.test", common_name="app-user")
    settings = TLSSettings(Path("c"), Path("k"), login_from="distinguished_name")
    name = login_name(cert, settings)
    assert name is not None and name.startswith("CN=app-user")


def test_check_certificate_against_a_ca(tmp_path: Path, pki: Pki) -> None:
    good = pki.issue("check-good", "127.0.0.1")
    assert check_certificate(good.certfile, good.keyfile, pki.cafile, "127.0.0.1") is None
    assert "mismatch" in (
        check_certificate(good.certfile, good.keyfile, pki.cafile, "10.1.1.1") or ""
    )
    other = Pki(tmp_path / "other", name="other")
    stranger = other.issue("stranger", "127.0.0.1")
    assert "issuer" in (
        check_certificate(stranger.certfile, stranger.keyfile, pki.cafile, "127.0.0.1") or ""
    )
    expired = pki.issue("check-old", "127.0.0.1", expired=True)
    assert "expired" in (
        check_certificate(expired.certfile, expired.keyfile, pki.cafile, "127.0.0.1") or ""
    )
    assert ca_subjects(pki.cafile) and all("O=" in s for s in ca_subjects(pki.cafile))


def test_cluster_file_tls_table(tmp_path: Path) -> None:
    base = {"secret": "secret-123", "known_hosts": ["h1:5671", "h2:5671"]}
    config = parse_cluster_config(
        {
            **base,
            "tls": {
                "links": "required",
                "cafile": "ca.pem",
                "certfile": "all.pem",
                "keyfile": "all.key",
                "servers": {"H1:5671": {"certfile": "h1.pem", "keyfile": "h1.key"}},
            },
        },
        "c",
        tmp_path,
    )
    assert config.tls is not None
    assert config.tls.cafile == tmp_path / "ca.pem"
    assert config.tls.certificate_for("h1:5671") == (tmp_path / "h1.pem", tmp_path / "h1.key")
    assert config.tls.certificate_for("h2:5671") == (tmp_path / "all.pem", tmp_path / "all.key")
    plain = parse_cluster_config(base, "c")
    assert plain.tls is None and plain.checksum != config.checksum
    off = parse_cluster_config({**base, "tls": {"links": "off"}}, "c")
    assert off.tls is None and off.checksum == plain.checksum
    for bad, message in (
        ({"links": "maybe"}, "'required' or 'off'"),
        ({"links": "required"}, "needs the cluster cafile"),
        ({"links": "required", "cafile": "ca", "verify": "x"}, "unknown"),
        ({"links": "required", "cafile": "ca", "servers": {"h1:1": {}}}, "needs a certfile"),
        ({"links": "required", "cafile": "ca", "keyfile": "k"}, "needs a certfile"),
    ):
        with pytest.raises(ClusterConfigError, match=message):
            parse_cluster_config({**base, "tls": bad}, "c")
    only_named = parse_cluster_config({**base, "tls": {"links": "required", "cafile": "ca"}}, "c")
    assert only_named.tls is not None
    with pytest.raises(ClusterConfigError, match="no certificate for this server"):
        only_named.tls.certificate_for("h1:5671")


def test_external_is_offered_and_read_only_with_a_certificate_login() -> None:
    assert mechanisms(None) == "PLAIN AMQPLAIN"
    assert mechanisms("app") == "PLAIN AMQPLAIN EXTERNAL"
    assert parse_credentials("EXTERNAL", b"", "app") == ("app", "")
    # the response (an authorisation identity) never chooses the user
    assert parse_credentials("EXTERNAL", b"admin", "app") == ("app", "")
    with pytest.raises(ConnectionError_, match="verified client certificate"):
        parse_credentials("EXTERNAL", b"", None)


def test_identify_checks_the_user_and_loopback_only() -> None:
    users = UserDatabase()
    users.add_user(User("app", hash_password("x"), ()))
    users.add_user(User("guest", hash_password("guest"), (), loopback_only=True))
    assert users.identify("app", "10.0.0.1")[0] is not None
    assert users.identify("nobody", "127.0.0.1") == (
        None,
        "user 'nobody' (from the client certificate) does not exist",
    )
    assert users.identify("guest", "10.0.0.1")[0] is None
    assert users.identify("guest", "127.0.0.1")[0] is not None
