"""The broker model: virtual hosts, exchanges (muxers), queues, consumers, users.

Plain synchronous code with no I/O. The protocol layer calls into it; it
calls back into consumers only through the ``ConsumerSink`` interface.
"""
