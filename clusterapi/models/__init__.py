"""Models of the cluster as the console sees it.

Brokers report themselves over the broker link (``clusterapi.consumers``): their
identity (``hello``), then a ``status`` every heartbeat, which is kept three ways:
the latest values on :class:`Broker`, a time series (:class:`HeartbeatSample`,
:class:`QueueSample`) for charts and the pipeline, and the current queues,
exchanges and bindings as snapshots. The console's own records are configuration
versions and their application per broker, commands, alarms and the audit log.

Field names are a contract with the REST API and the dashboard (see the
``clusterapi`` helpers' model contract); add, never rename.
"""

from __future__ import annotations

from clusterapi.models.brokers import Broker, BrokerEvent, BrokerQuerySet
from clusterapi.models.config import ConfigApplication, ConfigVersion, ConfigVersionQuerySet
from clusterapi.models.history import ArchiveBatch, ReportRun
from clusterapi.models.operations import Alarm, AuditEntry, Command, ConsoleProcess
from clusterapi.models.samples import HeartbeatSample, QueueSample
from clusterapi.models.snapshots import BindingSnapshot, ExchangeSnapshot, QueueSnapshot

__all__ = [
    "Alarm",
    "ArchiveBatch",
    "AuditEntry",
    "BindingSnapshot",
    "Broker",
    "BrokerEvent",
    "BrokerQuerySet",
    "Command",
    "ConfigApplication",
    "ConfigVersion",
    "ConfigVersionQuerySet",
    "ConsoleProcess",
    "ExchangeSnapshot",
    "HeartbeatSample",
    "QueueSample",
    "QueueSnapshot",
    "ReportRun",
]
