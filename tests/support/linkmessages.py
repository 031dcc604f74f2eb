"""The broker link's messages as a broker sends them (docs/protocol.md, "Console
link"), for console tests that play a broker: one ``hello`` with every field, the
test overriding what it is about."""

from __future__ import annotations

import time
from typing import Any


def hello(name: str, spid: str = "spid-1", **over: Any) -> dict[str, Any]:
    """A primary's ``hello``, started now, running no console version yet."""
    message = {
        "v": 1,
        "type": "hello",
        "spid": spid,
        "name": name,
        "address": "10.0.0.1:5672",
        "broker_type": "primary",
        "version": "0.1.0",
        "start_time": time.time(),
        "cluster": "test",
        "checksum": "abcd",
        "heartbeat_interval": 1.0,
        "config_version": None,
        "config_checksum": None,
    }
    message.update(over)
    return message
