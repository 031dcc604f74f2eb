"""Queue x-arguments: which this broker understands, and RabbitMQ's 406 texts for bad ones.

Clients compare these texts (and tests written against RabbitMQ assert
them), so they are RabbitMQ 3.10's, down to the Erlang term printing.
"""

from __future__ import annotations

from typing import Any

from brokerd.model.errors import precondition_failed
from brokerd.model.expiry import MAX_EXPIRY

#: the queue arguments this broker understands, with the types they accept
QUEUE_ARGUMENTS: dict[str, tuple[type, ...]] = {
    "x-max-length": (int,),
    "x-max-length-bytes": (int,),
    "x-overflow": (str,),
    "x-message-ttl": (int,),
    "x-expires": (int,),
    "x-dead-letter-exchange": (str,),
    "x-dead-letter-routing-key": (str,),
}
#: drop-head dead-letters what it drops (maxlen); reject-publish-dlx dead-letters
#: the refused publish, reject-publish only refuses it
OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
#: arguments RabbitMQ bounds by its timer limit (check_expiry)
_TIMED = ("x-message-ttl", "x-expires")


def amqp_type_name(value: Any) -> str:
    """The AMQP field type a client most likely sent ``value`` as, named as RabbitMQ does."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -(2**31) <= value < 2**31 else "long"
    if isinstance(value, str | bytes):
        return "longstr"
    if isinstance(value, float):
        return "double"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    if value is None:
        return "void"
    return {"Decimal": "decimal", "datetime": "timestamp"}.get(type(value).__name__, "longstr")


def validate_queue_arguments(name: str, vhost: str, arguments: dict[str, Any]) -> None:
    """Refuse mistyped or out-of-range x-arguments with 406 and RabbitMQ's texts."""
    for key, value in arguments.items():
        types = QUEUE_ARGUMENTS.get(key)
        if types is None:
            continue
        invalid = f"invalid arg '{key}' for queue '{name}' in vhost '{vhost}'"
        if isinstance(value, bool) or not isinstance(value, types):
            got = amqp_type_name(value)
            if key == "x-dead-letter-exchange":
                raise precondition_failed(
                    f"invalid type '{got}' for arg '{key}' in queue '{name}' in vhost '{vhost}'"
                )
            if int in types:
                raise precondition_failed(f'{invalid}: "expected integer, got {got}"')
            raise precondition_failed(f"{invalid}: {{unacceptable_type,{got}}}")
        if key == "x-expires" and value == 0:
            raise precondition_failed(f"{invalid}: {{value_zero,{value}}}")
        if key in _TIMED and value > MAX_EXPIRY:
            raise precondition_failed(f"{invalid}: {{value_too_large,{value}}}")
        if isinstance(value, int) and value < 0:
            raise precondition_failed(f"{invalid}: {{value_negative,{value}}}")
    if "x-dead-letter-routing-key" in arguments and "x-dead-letter-exchange" not in arguments:
        raise precondition_failed(
            f"invalid arg 'x-dead-letter-routing-key' for queue '{name}' in vhost '{vhost}': "
            "routing_key_but_no_dlx_defined"
        )
    overflow = arguments.get("x-overflow")
    if overflow is not None and overflow not in OVERFLOW_MODES:
        raise precondition_failed(
            f"invalid arg 'x-overflow' for queue '{name}' in vhost '{vhost}': invalid_overflow"
        )
