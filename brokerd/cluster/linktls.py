"""Cluster links over mutual TLS: our side's client context, the check of theirs.

With ``[tls] links = "required"`` in the cluster file, every link connects to
its peer's AMQPS port presenting this server's certificate, and checks the
peer's against the cluster CA (``client_context``: CA-only trust, host names
checked). An inbound link is admitted only if it came over TLS with a
certificate the cluster CA issued: the listener's handshake verified the
signature, and the issuer names which of the trusted CAs it was (the
listener may trust client CAs from brokerd.toml too).
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

from brokerd.cluster.config import ClusterConfigError, ClusterTLS
from brokerd.tls import TLSConfigError, ca_subjects, check_certificate, client_context

if TYPE_CHECKING:
    from brokerd.protocol.connection import Connection


class LinkTLS:
    def __init__(self, settings: ClusterTLS) -> None:
        self.settings = settings
        try:
            self.cluster_cas = ca_subjects(settings.cafile)
        except TLSConfigError as exc:
            raise ClusterConfigError(f"cluster file [tls]: {exc}") from None
        self._context: ssl.SSLContext | None = None

    def context(self, address: str) -> ssl.SSLContext:
        """Our links' client context, with the certificate of this server (by the
        address it is known by); made once."""
        if self._context is None:
            certfile, keyfile = self.settings.certificate_for(address)
            try:
                context = client_context(self.settings.cafile, certfile, keyfile)
            except TLSConfigError as exc:
                raise ClusterConfigError(f"cluster file [tls]: {exc}") from None
            # TLS 1.2: a peer refusing our certificate says so in the handshake, so the
            # link can report it; under 1.3 the refusal comes after the handshake and
            # reaches us as a bare close (its ciphers are still ECDHE with AEAD only)
            context.maximum_version = ssl.TLSVersion.TLSv1_2
            self._context = context
        return self._context

    def check_own(self, address: str) -> None:
        """Refuse to start with a certificate our peers would refuse (another CA,
        expired, not for this host): said at once, here, rather than as links that
        never come up."""
        certfile, keyfile = self.settings.certificate_for(address)
        host = address.rpartition(":")[0].strip("[]")
        try:
            why = check_certificate(certfile, keyfile, self.settings.cafile, host)
        except TLSConfigError as exc:
            raise ClusterConfigError(f"cluster file [tls]: {exc}") from None
        if why is not None:
            raise ClusterConfigError(
                f"cluster file [tls]: this server's certificate {certfile} would be refused "
                f"by its peers for {host}: {why} (links trust only {self.settings.cafile})"
            )

    def refusal(self, conn: Connection) -> str | None:
        """Why an inbound link may not be admitted (None: it may)."""
        cert = conn.peer_certificate
        if cert is not None and cert.issuer in self.cluster_cas:
            return None
        if not conn.tls:
            return "came over plain TCP, but this cluster's links run over TLS"
        if cert is None:
            return "presented no client certificate"
        return f"presented a certificate issued by {cert.issuer}, not by the cluster CA"

    def check(self, conn: Connection, spid: str) -> str:
        """The refusal's text for an inbound link that may not be admitted (for the
        alarm and the 403), empty when it may."""
        why = self.refusal(conn)
        if why is None:
            return ""
        return f"cluster link from {spid or conn.name} refused: it {why}"
