"""The shared queues (seed 001): the queue as the channel sees it on every
server, its master and proxy sides, and its replication to the other primaries."""
