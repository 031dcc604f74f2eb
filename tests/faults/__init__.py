"""Jepsen-style fault injection for the cluster's delivery guarantees (issue 13).

``history`` (what was observed), ``checker`` (what it means, pure code),
``workload`` (pika publishers and consumers), ``nemesis`` (the seeded
faults), ``run`` (one whole run) and ``__main__`` (the soak's command line:
``python -m tests.faults --help``). ``tests/integration/test_faults.py`` is
the short run in ``make test``.
"""
