"""The broker's side of the broker-to-console link (docs/protocol.md, "Console link").

host.py      ConsoleHost: what the link needs of the server, which it never imports
tracker.py   pure: queue/exchange/binding entries, full snapshots and deltas
messages.py  hello/status/ack builders and the parser of console messages
commands.py  config.apply, root.enable/disable, state.dump, queue.move, queues.rebalance;
             repeated ids answered once
session.py   one connection's state (seq, tracker), no socket
link.py      the asyncio websocket client: reconnect, backoff, status timer
tls.py       the context a wss:// link verifies the console with (--console-cafile)
"""
