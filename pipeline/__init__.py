"""PySpark jobs over the heartbeat lake (imports neither Django nor brokerd)."""
