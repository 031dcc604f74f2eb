"""Cluster membership and replication (seed 000). Identity lives here from day one."""
