"""Publish flood: unconfirmed publishers against shared queues spread over three primaries.

    python -m brokerd.bench.flood                        # issue 21's flood on 3 primaries
    python -m brokerd.bench.flood --single               # the same load on one brokerd
    python -m brokerd.bench.flood --rabbitmq             # ... on a 3-node RabbitMQ cluster
    python -m brokerd.bench.flood --messages 5000 --confirm-window 1000 --json flood.json

Why: under a plain publish flood, with no fault at all, the cluster loses its
root's lease, drops its replicas, voids forwards and silently drops most
unconfirmed messages (issue 21). This reproduces exactly that load, counts
what was lost and where, and counts the failure signatures in every broker
log, so that a fix can be measured against the same figures.

Each run starts a fresh target on free loopback ports in a temporary
directory (all traffic to 127.0.0.1): three brokerd primaries
(``cluster.BrokerdCluster``, default heartbeat, ``--log-level info``), or one
standalone brokerd (``--single``), or three RabbitMQ nodes
(``cluster.RabbitCluster``, ``--rabbitmq``; skipped when rabbitmq-server is
not installed). Then:

1. declares N queues in the cluster vhost ``/`` as guest, queue i through
   server i mod 3 (where client-local placement puts it);
2. starts one no-ack consumer per queue i on server i+1 and P publishers
   (publisher j feeds queue i = j mod N from server i+2), each a process of
   its own; once all are connected the publishers start together and write M
   messages of B bytes each as fast as TCP takes them (``--confirm-window W``:
   with publisher confirms, at most W unconfirmed), then close their
   connection and wait for close-ok (the server has read every publish);
3. waits until every publisher is done and then until no delivery arrived
   for ``--quiet`` seconds (or a second after every queue delivered all it
   was sent), bounded by ``--timeout``; a consumer the server closes
   reconnects, as applications do, and the close is counted;
4. stops the consumers and counts what is left in each queue by a passive
   declare on every server;
5. (brokerd cluster) watches ``--after`` seconds more, then counts the
   failure signatures of issue 21 in every broker log, split into during and
   after the run, and keeps the first occurrence of each with context.

While the run lasts, every brokerd is asked for its status (control socket)
each ``--status-poll`` seconds: unanswered polls, role changes and the
status-echo round trip its peers report show the control plane under load.

Everything it started is stopped on the way out, however it ends (finally
blocks, SIGTERM/SIGHUP turned into an exit, and bench.failover's atexit hook
that kills any brokerd left). The workers speak AMQP over sockets only; the
coordinator imports bench.cluster (process starters) and the control-socket
client bench.failover's ``Node.status`` uses lazily, so the worker processes
never load any broker module.

Modules (imports run one way: ``cli`` -> ``run`` -> ``workers``, ``targets``,
``status``; ``plan``, ``logs`` and ``report`` are pure):

* ``plan``: the run's options and issue 21's placement of queues and clients
* ``logs``: issue 21's failure signatures and counting them in a broker log
* ``workers``: the counters shared with the workers, the publisher and consumer processes
* ``targets``: starting a brokerd cluster, a single brokerd or a RabbitMQ cluster
* ``status``: polling every brokerd's status while the flood runs
* ``run``: one run against one target, and its figures
* ``report``: the figures as Markdown and as a one-line summary
* ``cli``: arguments, the runs, JSON
"""
