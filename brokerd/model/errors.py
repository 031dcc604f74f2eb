"""AMQP reply codes and the exceptions the broker model raises.

The model raises these; the channel state machine turns them into
channel.close / connection.close with the same code and text, so the model
never needs to know about frames.
"""

from __future__ import annotations

# Reply codes of AMQP 0-9-1 (section 1.9 of the spec).
REPLY_SUCCESS = 200
CONTENT_TOO_LARGE = 311
NO_ROUTE = 312
NO_CONSUMERS = 313
CONNECTION_FORCED = 320
INVALID_PATH = 402
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
SYNTAX_ERROR = 502
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
RESOURCE_ERROR = 506
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541

REPLY_TEXT = {
    REPLY_SUCCESS: "REPLY_SUCCESS",
    CONTENT_TOO_LARGE: "CONTENT_TOO_LARGE",
    NO_ROUTE: "NO_ROUTE",
    NO_CONSUMERS: "NO_CONSUMERS",
    CONNECTION_FORCED: "CONNECTION_FORCED",
    INVALID_PATH: "INVALID_PATH",
    ACCESS_REFUSED: "ACCESS_REFUSED",
    NOT_FOUND: "NOT_FOUND",
    RESOURCE_LOCKED: "RESOURCE_LOCKED",
    PRECONDITION_FAILED: "PRECONDITION_FAILED",
    FRAME_ERROR: "FRAME_ERROR",
    SYNTAX_ERROR: "SYNTAX_ERROR",
    COMMAND_INVALID: "COMMAND_INVALID",
    CHANNEL_ERROR: "CHANNEL_ERROR",
    UNEXPECTED_FRAME: "UNEXPECTED_FRAME",
    RESOURCE_ERROR: "RESOURCE_ERROR",
    NOT_ALLOWED: "NOT_ALLOWED",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    INTERNAL_ERROR: "INTERNAL_ERROR",
}


#: a reply text is a short string: at most 255 bytes on the wire
MAX_REPLY_TEXT_BYTES = 255


def truncate_utf8(text: str, limit: int = MAX_REPLY_TEXT_BYTES) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, never inside a character.

    Reply texts echo client-chosen names (a queue of 255 bytes of 'é'), and a
    short string longer than 255 bytes cannot be encoded at all."""
    # 'replace' turns a lone surrogate (never valid UTF-8) into '?'; 'ignore'
    # drops the partial character a byte cut may leave at the end
    return text.encode("utf-8", "replace")[:limit].decode("utf-8", "ignore")


class AMQPError(Exception):
    """An AMQP exception: a reply code and a human-readable text."""

    reply_code: int = INTERNAL_ERROR
    #: connection-level errors close the whole connection, others the channel
    connection_level = False

    def __init__(self, reply_code: int, text: str) -> None:
        super().__init__(text)
        self.reply_code = reply_code
        self.text = text

    @property
    def reply_text(self) -> str:
        """The reply text as RabbitMQ formats it: ``NAME - detail``."""
        name = REPLY_TEXT.get(self.reply_code, "ERROR")
        return truncate_utf8(f"{name} - {self.text}")


class ChannelError(AMQPError):
    """Soft error: closes only the channel it happened on."""


class ConnectionError_(AMQPError):
    """Hard error: closes the connection (and every channel on it)."""

    connection_level = True


def not_found(text: str) -> ChannelError:
    return ChannelError(NOT_FOUND, text)


def precondition_failed(text: str) -> ChannelError:
    return ChannelError(PRECONDITION_FAILED, text)


def access_refused(text: str) -> ChannelError:
    return ChannelError(ACCESS_REFUSED, text)


def resource_locked(text: str) -> ChannelError:
    return ChannelError(RESOURCE_LOCKED, text)


def command_invalid(text: str) -> ConnectionError_:
    return ConnectionError_(COMMAND_INVALID, text)
