"""The wire: AMQP 0-9-1 frame codec.

pamqp decodes and encodes every method; the hot frames (basic.publish in,
basic.deliver out, content headers and bodies) take a hand-written path
that never builds pamqp objects. Nothing here knows about channels,
queues or sockets.
"""

from brokerd.wire.codec import (
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    FrameError,
    SyntaxError_,
    UnknownMethod,
    content_frames,
    decode_header,
    decode_method,
    decode_properties,
    decode_publish,
    deliver_frame,
    encode_properties,
    method_frame,
    split_frames,
)

__all__ = [
    "FRAME_BODY",
    "FRAME_END",
    "FRAME_HEADER",
    "FRAME_HEARTBEAT",
    "FRAME_METHOD",
    "FRAME_MIN_SIZE",
    "HEARTBEAT_FRAME",
    "PROTOCOL_HEADER",
    "FrameError",
    "SyntaxError_",
    "UnknownMethod",
    "content_frames",
    "decode_header",
    "decode_method",
    "decode_properties",
    "decode_publish",
    "deliver_frame",
    "encode_properties",
    "method_frame",
    "split_frames",
]
