"""brokerd: Rookery's AMQP 0-9-1 broker daemon (pure asyncio, never imports Django)."""

__version__ = "0.1.0"
PRODUCT = "Rookery"
