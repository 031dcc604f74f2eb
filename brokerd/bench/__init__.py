"""``python -m brokerd.bench``: the throughput benchmark for brokerd (or any AMQP 0-9-1 server).

A client only: it never imports the broker (``brokerd.model``, ``brokerd.protocol``,
``brokerd.server``), so the same measurement points at brokerd or RabbitMQ.

* ``frames``: pamqp-encoded frames, the pre-built publish batches, frame scanning
* ``client``: a minimal blocking AMQP client (handshake, declares, close)
* ``workers``: the publisher and consumer processes
* ``scenarios``: queue-250, queue-1000, fanout-isr, fanout-consumers and the coordinator
* ``cli``: arguments, Markdown tables, JSON
"""
