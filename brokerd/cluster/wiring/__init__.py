"""The replicated cluster state (seed 000): exchanges, shared queues and
bindings, ordered by the root in the state log, and how a change travels."""
