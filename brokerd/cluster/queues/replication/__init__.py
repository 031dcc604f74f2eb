"""A shared queue's replication: the owner's stream, the replicas' copies, the quorum."""
