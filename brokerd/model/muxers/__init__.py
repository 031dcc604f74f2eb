"""Muxers: the routing behaviours behind exchange types (seed 004).

Each exchange type is a ``Muxer`` subclass registered under its AMQP type
name; an exchange owns one muxer instance holding its bindings. New types
(x-wild-headers, x-selector, x-lossy, ...) plug in with ``@register``.
"""

from brokerd.model.muxers import (  # noqa: F401  (registration)
    direct,
    fanout,
    federation,
    headers,
    lossy,
    topic,
    wildheaders,
    xselector,
)
from brokerd.model.muxers.base import MUXERS, Binding, Muxer, lookup, register

__all__ = ["MUXERS", "Binding", "Muxer", "lookup", "register"]
