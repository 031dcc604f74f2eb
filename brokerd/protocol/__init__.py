"""AMQP 0-9-1 state machines, sans-IO.

``Connection`` takes bytes (``receive_data``) and clock ticks (``tick``) and
produces bytes (``data_to_send``); it never touches a socket. It drives the
broker model directly: routing and delivery are synchronous calls, and
deliveries to other connections land in their output buffers.
"""

from brokerd.protocol.connection import Connection, ConnectionState

__all__ = ["Connection", "ConnectionState"]
