"""Certificates for TLS tests, made on the spot with ``trustme``.

A ``Pki`` writes a CA and the certificates a test asks for as PEM files in a
folder, and builds the client contexts pika and aio-pika take.
"""

from __future__ import annotations

import datetime
import ssl
from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass(frozen=True)
class CertFiles:
    certfile: Path
    keyfile: Path


class Pki:
    """One CA and the certificates it issued, as files under ``folder``."""

    def __init__(self, folder: Path, name: str = "rookery-test") -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.ca = trustme.CA(organization_name=name)
        self.cafile = folder / f"{name}-ca.pem"
        self.ca.cert_pem.write_to_path(str(self.cafile))

    def issue(
        self,
        name: str,
        *identities: str,
        common_name: str | None = None,
        expired: bool = False,
    ) -> CertFiles:
        """A certificate for ``identities`` (host names, IPs, e-mail addresses);
        ``expired`` makes one that ended yesterday."""
        now = datetime.datetime.now(datetime.UTC)
        dates = {}
        if expired:
            dates = {
                "not_before": now - datetime.timedelta(days=30),
                "not_after": now - datetime.timedelta(days=1),
            }
        leaf = self.ca.issue_cert(*(identities or (name,)), common_name=common_name, **dates)
        files = CertFiles(self.folder / f"{name}.pem", self.folder / f"{name}.key")
        leaf.cert_chain_pems[0].write_to_path(str(files.certfile))
        leaf.private_key_pem.write_to_path(str(files.keyfile))
        return files

    def server(self, name: str = "server") -> CertFiles:
        """A server certificate for loopback (127.0.0.1, ::1, localhost)."""
        return self.issue(name, "127.0.0.1", "::1", "localhost")

    def client_context(self, client: CertFiles | None = None) -> ssl.SSLContext:
        """A client context trusting this CA, presenting ``client`` if given."""
        context = ssl.create_default_context(cafile=str(self.cafile))
        if client is not None:
            context.load_cert_chain(client.certfile, client.keyfile)
        return context
