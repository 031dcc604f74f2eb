"""One websocket connection's worth of the console link, without the socket.

The shell (``brokerd.consolelink.link``) sends ``hello()`` first, then
``status()`` every interval, and passes every received text to ``receive``,
sending back what it returns (a command that waits, cluster.forget or
queues.grow|shrink, is a future of its ack: the shell sends it once resolved). ``receive`` raises
``MalformedMessage`` for a message that breaks the protocol; the shell then
closes with 4400.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from brokerd.consolelink import messages
from brokerd.consolelink.commands import Answer, ConsoleCommands
from brokerd.consolelink.tracker import SnapshotTracker, collect

if TYPE_CHECKING:
    from brokerd.consolelink.host import ConsoleHost

log = logging.getLogger("brokerd.console")


class ConsoleSession:
    def __init__(self, host: ConsoleHost, commands: ConsoleCommands) -> None:
        self.host = host
        self.commands = commands
        self.tracker = SnapshotTracker()
        self.seq = 0
        #: the configuration version the console holds (from ``welcome``)
        self.console_version: int | None = None
        #: the configuration in force last sent (a status carries it again on change)
        self._in_force: dict[str, Any] | None = None

    def hello(self) -> dict[str, Any]:
        message = messages.hello(self.host, *self.commands.running())
        self._in_force = message["in_force"] = self.commands.in_force()
        return message

    def status(self, now: float | None = None) -> dict[str, Any]:
        host = self.host
        cluster_vhost = host.cluster_config.vhost if host.cluster_config is not None else None
        full, sections = self.tracker.next(collect(host.broker, cluster_vhost, host.spid))
        self.seq += 1
        running = self.commands.running()
        message = messages.status(host, self.seq, full, sections, now, running)
        in_force = self.commands.in_force()
        if in_force != self._in_force:  # an apply, a SIGHUP, a cluster change
            self._in_force = message["in_force"] = in_force
        return message

    def receive(self, text: str | bytes) -> list[Answer]:
        """Handle one console message; returns the messages to send back (or to send
        once they resolve)."""
        message = messages.parse(text)
        kind = message["type"]
        if kind == "command":
            return [self.commands.handle(message)]
        if kind == "resync":
            self.tracker.request_full()
            return []
        if kind == "welcome":
            version = message.get("config_version")
            self.console_version = version if isinstance(version, int) else None
            log.info(
                "console welcome config_version=%s (applied here: %s)",
                self.console_version,
                self.commands.config_version,
            )
            return []
        log.warning("console sent an unknown message type %r: ignored", kind)
        return []
