"""Bridges between clusters and brokers (seed 000's "WAN bridging"): shovels.

``uri`` and ``definitions`` read RabbitMQ's URIs and dynamic-shovel JSON, so a
definition made for ``rabbitmqctl set_parameter shovel`` works unchanged;
``transfer`` is a shovel's sans-IO core (what to publish, what to acknowledge);
the asyncio shell that connects both ends sits on top of these and is the only
part that does I/O. Nothing here imports the cluster: a bridge is a client of
brokers, this one included.
"""
