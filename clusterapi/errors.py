"""Errors the service functions raise for bad requests (the API turns them into 400s)."""

from __future__ import annotations


class InvalidRequest(ValueError):
    """The request cannot be carried out; ``message`` says why, naming the bad field."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message
