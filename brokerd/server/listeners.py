"""The AMQP listeners: plain (``--port``) and AMQPS (``--tls-port``).

Either may be off, not both. The TLS listener's context is built once and
reloaded in place on SIGHUP, so established connections keep their session
and new handshakes get the new certificate. When the cluster runs its links
over TLS, this server's certificate and the cluster CA come from the cluster
file (``ClusterTLS``): one certificate serves the TLS port to clients and to
peers, and the listener asks every client for a certificate so a link can
present its own.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from brokerd.cluster.config import ClusterConfig
from brokerd.cluster.linktls import LinkTLS
from brokerd.tls import TLSConfigError, TLSSettings, reload_context, server_context

log = logging.getLogger("brokerd.listeners")


class ListenerError(Exception):
    """The listeners' settings do not fit together; the message says why."""


class ListenerOptions(Protocol):
    bind: str
    port: int | None
    tls_port: int | None
    #: a worker of ``brokerd --workers``: its siblings bind the same ports
    reuse_port: bool
    #: a worker's link socket, where its siblings link to it (None: not a worker)
    link_socket: Path | None
    #: in a cluster of hosts, every worker's TCP link port, and which worker this is
    link_ports: tuple[int, ...]
    worker_index: int


def make_listeners(
    options: ListenerOptions, tls: TLSSettings | None, cluster: ClusterConfig | None
) -> Listeners:
    """The listeners for these options, brokerd.toml's ``[tls]`` and the cluster file."""
    if cluster is None or cluster.tls is None:
        if cluster is not None and options.port is None:
            raise ListenerError(
                "this cluster's links are plain: they need the plain --port "
                "(or [tls] links = 'required' in the cluster file)"
            )
        return Listeners(
            options.bind,
            options.port,
            options.tls_port,
            tls,
            reuse_port=options.reuse_port,
            link_socket=options.link_socket,
            link_port=options.link_ports[options.worker_index] if options.link_ports else None,
        )
    if options.tls_port is None:
        raise ListenerError("the cluster file runs links over TLS: this server needs --tls-port")
    address = f"{host_name(options.bind)}:{options.tls_port}"
    LinkTLS(cluster.tls).check_own(address)
    return Listeners(
        options.bind,
        options.port,
        options.tls_port,
        tls,
        cluster_cafile=cluster.tls.cafile,
        cluster_cert=cluster.tls.certificate_for(address),
        reuse_port=options.reuse_port,
    )


def host_name(bind: str) -> str:
    """The name a server bound to ``bind`` is reached by."""
    return socket.getfqdn() if bind in ("0.0.0.0", "::", "") else bind


class Listeners:
    def __init__(
        self,
        bind: str,
        port: int | None,
        tls_port: int | None,
        tls: TLSSettings | None,
        *,
        cluster_cafile: Path | None = None,
        cluster_cert: tuple[Path, Path] | None = None,
        reuse_port: bool = False,
        link_socket: Path | None = None,
        link_port: int | None = None,
    ) -> None:
        if port is None and tls_port is None:
            raise ListenerError("no listener: --port is off and there is no --tls-port")
        if tls_port is not None and tls is None and cluster_cert is None:
            raise ListenerError("--tls-port needs a [tls] table in the --config file")
        if tls is not None and cluster_cert is not None:
            certfile, keyfile = cluster_cert
            if (tls.certfile, tls.keyfile) != (certfile, keyfile):
                raise ListenerError(
                    "the cluster file names this server's certificate for its TLS port; "
                    f"brokerd.toml's [tls] names another ({tls.certfile}): "
                    "leave certfile and keyfile out of [tls] or name the same files"
                )
        if cluster_cert is not None:
            base = tls or TLSSettings(*cluster_cert)
            tls = replace(base, certfile=cluster_cert[0], keyfile=cluster_cert[1])
        self.bind = bind
        self.port = port
        self.tls_port = tls_port
        #: the settings in force for the TLS listener (None: no TLS listener)
        self.tls = tls if tls_port is not None else None
        self._extra_cas = (cluster_cafile,) if cluster_cafile is not None else ()
        self.context: ssl.SSLContext | None = None
        if self.tls is not None:
            try:
                self.context = server_context(self.tls, self._extra_cas)
            except TLSConfigError as exc:
                raise ListenerError(str(exc)) from None
        self.reuse_port = reuse_port
        self.link_socket = link_socket
        #: a worker of a host in a cluster: where the other hosts' workers link to it
        #: (its parent holds the port, so it refuses while this worker is down)
        self.link_port = link_port
        self._link_tcp: asyncio.AbstractServer | None = None
        self._plain: asyncio.AbstractServer | None = None
        self._secure: asyncio.AbstractServer | None = None
        self._links: asyncio.AbstractServer | None = None

    async def start(self, factory: Callable[[], asyncio.Protocol]) -> None:
        loop = asyncio.get_running_loop()
        options: dict[str, Any] = {"reuse_address": True, "backlog": 1024}
        if self.reuse_port:
            # the workers of one host share the ports; the kernel spreads connections
            options["reuse_port"] = True
        if self.link_socket is not None:
            # a stale socket file from a worker that was killed would refuse the bind
            self.link_socket.unlink(missing_ok=True)
            self._links = await loop.create_unix_server(
                factory, str(self.link_socket), backlog=1024
            )
            self.link_socket.chmod(0o600)
        if self.link_port is not None:
            self._link_tcp = await loop.create_server(factory, self.bind, self.link_port, **options)
        if self.port is not None:
            self._plain = await loop.create_server(factory, self.bind, self.port, **options)
            self.port = self._plain.sockets[0].getsockname()[1]
        if self.tls_port is not None:
            self._secure = await loop.create_server(
                factory,
                self.bind,
                self.tls_port,
                ssl=self.context,
                ssl_handshake_timeout=10.0,
                **options,
            )
            self.tls_port = self._secure.sockets[0].getsockname()[1]

    def reload(self, tls: TLSSettings | None) -> None:
        """SIGHUP: the certificate, key and CAs again, from the settings just read.

        Only the files are reloaded: a changed ``verify``, version or cipher list
        takes a restart (it would change what established clients agreed to)."""
        if self.context is None or self.tls is None:
            return
        settings = self.tls
        if tls is not None and not self._extra_cas:  # else the cluster file names them
            settings = replace(
                self.tls, certfile=tls.certfile, keyfile=tls.keyfile, cafile=tls.cafile
            )
        try:
            reload_context(self.context, settings, self._extra_cas)
        except TLSConfigError as exc:
            log.error("TLS reload failed, the previous certificate stays in force: %s", exc)
            return
        self.tls = settings
        log.info("TLS certificates reloaded certfile=%s", settings.certfile)

    def host(self) -> str:
        """The name this server's listeners are reached by."""
        return host_name(self.bind)

    def describe(self) -> dict[str, Any]:
        return {
            "port": self.port,
            "tls_port": self.tls_port,
            "tls_verify": self.tls.verify if self.tls is not None else None,
        }

    def close(self) -> None:
        for server in (self._plain, self._secure, self._links, self._link_tcp):
            if server is not None:
                server.close()
        if self._links is not None and self.link_socket is not None:
            # gone at once: a sibling's link attempt is refused, which says we are down
            self.link_socket.unlink(missing_ok=True)
