"""Muxers: the routing behaviours behind exchange types (seed 004).

Each exchange type is a ``Muxer`` subclass registered under its AMQP type
name; an exchange owns one muxer instance holding its bindings. New types
(x-wild-headers, x-selector, x-lossy, ...) plug in with ``@register``.
"""

from brokerd.model.muxers.base import MUXERS, Binding, Muxer, lookup, register
from brokerd.model.muxers import direct, fanout, headers, topic  # noqa: F401  (registration)

__all__ = ["MUXERS", "Binding", "Muxer", "lookup", "register"]
