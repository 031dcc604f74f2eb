"""The REST admin API (``/api/v1/``): read the cluster as the console sees it, send commands.

DRF views over ``clusterapi.models``; writes go through the service functions
(``clusterapi.commands``, ``clusterapi.configs``) so that the API, the dashboard
and the admin all validate, audit and deliver the same way.
"""
