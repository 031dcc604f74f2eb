"""LOSSY muxer: ``x-lossy`` exchanges pass each message to all bindings, or drop it.

Seed 004's failure simulator. Exchange arguments: ``x-loss-rate`` (required;
a double, a decimal or a numeric string in 0..1, the fraction of messages
dropped) and ``x-loss-seed`` (optional integer or numeric string: the same
seed drops the same messages, for reproducible tests). One draw per message
decides for every binding. Chained by exchange-to-exchange bindings, it
steps in between a queue and another muxer.
"""

from __future__ import annotations

import decimal
import math
import random
from collections.abc import Collection
from typing import Any

from brokerd.model.errors import precondition_failed
from brokerd.model.message import Message
from brokerd.model.muxers.base import register
from brokerd.model.muxers.fanout import FanoutMuxer

RATE_ARGUMENT = "x-loss-rate"
SEED_ARGUMENT = "x-loss-seed"


def loss_rate(arguments: dict[str, Any]) -> float:
    """``x-loss-rate`` as a float in 0..1; 406 for anything else."""
    if RATE_ARGUMENT not in arguments:
        raise precondition_failed(f"exchange type 'x-lossy' needs the argument '{RATE_ARGUMENT}'")
    raw = arguments[RATE_ARGUMENT]
    rate: float | None = None
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    if isinstance(raw, bool):
        rate = None
    elif isinstance(raw, int | float | decimal.Decimal):
        rate = float(raw)
    elif isinstance(raw, str):
        try:
            rate = float(raw.strip()) if raw.strip().isascii() else None
        except ValueError:
            rate = None
    if rate is None or math.isnan(rate) or not 0.0 <= rate <= 1.0:
        raise precondition_failed(
            f"invalid '{RATE_ARGUMENT}' {raw!r}: expected a number from 0 to 1 "
            "(double, decimal or numeric string)"
        )
    return rate


def loss_seed(arguments: dict[str, Any]) -> int | None:
    raw = arguments.get(SEED_ARGUMENT)
    if raw is None:
        return None
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().isascii() and raw.strip().lstrip("-").isdigit():
        return int(raw.strip())
    raise precondition_failed(f"invalid '{SEED_ARGUMENT}' {raw!r}: expected an integer")


@register
class LossyMuxer(FanoutMuxer):
    type_name = "x-lossy"

    def __init__(self, arguments: dict[str, Any]) -> None:
        # validated here: VirtualHost.declare_exchange builds the muxer before storing
        # the exchange, so a bad argument is a 406 on exchange.declare
        self.rate = loss_rate(arguments)
        self.seed = loss_seed(arguments)
        super().__init__(arguments)
        self._random = random.Random(self.seed)
        self.dropped = 0

    def route(self, message: Message) -> Collection[Any]:
        routes = self._routes
        if not routes:
            return ()
        if self._random.random() < self.rate:
            self.dropped += 1
            return ()
        return routes
