"""clusterapi: the console's Django app for the cluster.

It will hold the broker link (websocket consumer for brokerd), the models of
brokers, heartbeats, configurations, commands and alarms, the REST admin API
under /api/v1/, management commands and Celery tasks.
"""
