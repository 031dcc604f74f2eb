"""One host's worker processes: the supervising parent of brokerd --workers."""
