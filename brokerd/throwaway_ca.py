"""A throwaway CA and loopback certificates: ``ROOKERY_TLS=1 make run``, the TLS benchmarks.

Made once in ``DATA_DIR/tls/`` and reused while valid: ``ca.pem`` (the CA
anyone trying it points a client at), ``server.pem``/``server.key`` (every
broker's AMQPS port, the cluster links and the console, all on 127.0.0.1 and
localhost) and ``client.pem``/``client.key`` (CN ``guest``: logs in with SASL
EXTERNAL as the quickstart's guest user). Keys are written mode 0600. The CA's
key is kept only so the files can be renewed; nothing here is fit for a real
deployment, which brings its own CA.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: certificates are made for this long and renewed when less than a week is left
LIFETIME = datetime.timedelta(days=90)
RENEW_BEFORE = datetime.timedelta(days=7)


@dataclass(frozen=True)
class ThrowawayPki:
    folder: Path

    @property
    def cafile(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def server(self) -> tuple[Path, Path]:
        return self.folder / "server.pem", self.folder / "server.key"

    @property
    def client(self) -> tuple[Path, Path]:
        return self.folder / "client.pem", self.folder / "client.key"


def ensure(folder: Path) -> tuple[ThrowawayPki, bool]:
    """The PKI in ``folder``, made (or renewed) when missing or near its end;
    also says whether it was made now."""
    pki = ThrowawayPki(folder)
    files = [pki.cafile, *pki.server, *pki.client, folder / "ca.key"]
    if all(f.exists() for f in files) and not _ending(pki.server[0]):
        return pki, False
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Rookery throwaway CA")])
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(folder / "ca.key", ca_key)
    pki.cafile.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    for (certfile, keyfile), common_name, usages in (
        (
            pki.server,
            "localhost",
            [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
        ),
        (pki.client, "guest", [ExtendedKeyUsageOID.CLIENT_AUTH]),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        cert = (
            _builder(subject, ca_name, key.public_key(), now)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        _write_key(keyfile, key)
        certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return pki, True


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    now: datetime.datetime,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + LIFETIME)
    )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _ending(certfile: Path) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(certfile.read_bytes())
    except (OSError, ValueError):
        return True
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    return left < RENEW_BEFORE
