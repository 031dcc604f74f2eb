"""The asyncio shell: sockets, timers and signals around the sans-IO machines."""
