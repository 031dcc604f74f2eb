"""Errors the service functions raise for bad requests (the API turns them into 400s)."""

from __future__ import annotations


class InvalidRequest(ValueError):
    """The request cannot be carried out; ``message`` says why, naming the bad field."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class Conflict(InvalidRequest):
    """The request is well-formed but the target cannot do it now (a secondary asked to
    be root, a command to a broker that is down, a version that is no longer current);
    the API answers 409 with ``message`` as the reason."""


class InvalidDocument(InvalidRequest):
    """A configuration document that is well-formed JSON but breaks the document's rules
    (docs/protocol.md: a timeout not above the interval, a permission for an unknown
    user ...); the API answers 422 with ``message`` naming the key."""


class Unavailable(InvalidRequest):
    """Nothing can answer the request now: no broker that could carry it out is linked
    to the console; the API answers 503 with ``message``."""


class NoAnswer(InvalidRequest):
    """The broker did not answer a command the request waits for in time (it may still
    carry it out: the command stays open); the API answers 504 with ``message``."""
