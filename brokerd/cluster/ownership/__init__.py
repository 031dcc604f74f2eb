"""Where shared queues live: the rules, the root's placer, moves and rebalances."""
