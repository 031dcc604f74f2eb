"""``brokerd ctl status``: what a server says of itself (identity, cluster view,
counts, store, resources, the loop, the configuration in force, the console link).

Split from ``app.py``: the server answers with it (``Server.status``), the
control socket, the dumps and tests read it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from brokerd.server.app import Server


def server_status(server: Server) -> dict[str, Any]:
    counts = {
        "port": server.port,
        "tls_port": server.tls_port,
        "address": server.address,
        "started": server.started,
        "rates": server.rates,
        **server.counts(),  # the broker's totals() and the connection counts
        "totals": server.broker.counters(),
        "store": server.store.describe(),
        "blocked": server.blocks,
        "resources": server.resources.status(),
        "loop": server.loopwatch.describe(),
        "settings": server.settings_in_force(),
        "console": None
        if server.console is None
        else {
            "url": server.console.url,
            "connected": server.console.connected,
            "config_version": server.console.commands.config_version,
            "config_checksum": server.console.commands.config_checksum,
        },
    }
    if server.cluster is not None:
        config = server.cluster.config
        heartbeat = {
            "interval": config.heartbeat_interval,
            "timeout": config.heartbeat_timeout,
            "open_timeout": config.open_timeout,
        }
        status = server.cluster.status()
        alarms = status.get("alarms", []) + server.resources.alarm_list()
        return {**status, "alarms": alarms, "heartbeat": heartbeat, **counts}
    return {
        "alarms": server.resources.alarm_list(),
        "spid": server.spid,
        "type": "standalone",
        "is_root": False,
        "root": None,
        "ready": True,
        "root_enabled": False,
        "peers": [],
        "checksum": None,
        **counts,
    }
