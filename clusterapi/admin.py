"""Admin registrations for clusterapi's models (none yet)."""
