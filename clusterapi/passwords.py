"""Broker users' password hashes are write-only in the console (issue 46).

A configuration document may define the brokers' AMQP users, each with a
``password_hash`` (``brokerd hash-password``). Brokers need the hash, and get it
over the broker link (``config.apply``); nobody else does. A PBKDF2 hash is an
offline guessing target, so no API response, page, command shown to a user,
audit entry or log line carries one, whatever the reader's role, as DRF's
password fields are write-only:

- :func:`hidden` is what every reader gets: each user without its hash;
- :func:`kept` is what every writer gives: a user sent without a hash keeps the
  one the current version has for that name (the editor and the API round-trip a
  document they were shown without hashes); a new user needs one.
"""

from __future__ import annotations

import copy
from typing import Any

HASH_KEY = "password_hash"


def hidden(document: Any) -> Any:
    """``document`` with every user's password hash removed (a copy; anything that is
    not a document is returned as it is)."""
    if not isinstance(document, dict) or not isinstance(document.get("users"), list):
        return document
    out = dict(document)
    out["users"] = [
        {k: v for k, v in user.items() if k != HASH_KEY} if isinstance(user, dict) else user
        for user in document["users"]
    ]
    return out


def kept(document: Any, previous: dict[str, Any] | None) -> Any:
    """``document`` with each user that has no hash given the one ``previous`` has for
    that user name (a copy); users still without one are left for validation to refuse."""
    if not isinstance(document, dict) or not isinstance(document.get("users"), list):
        return document
    known = {
        user.get("name"): user.get(HASH_KEY)
        for user in (previous or {}).get("users") or []
        if isinstance(user, dict)
    }
    out = copy.copy(document)
    out["users"] = []
    for user in document["users"]:
        if isinstance(user, dict) and HASH_KEY not in user and known.get(user.get("name")):
            user = {**user, HASH_KEY: known[user.get("name")]}
        out["users"].append(user)
    return out


def hidden_args(name: str, args: Any) -> Any:
    """A command's arguments as users see them: a ``config.apply``'s document without
    hashes (the broker link sends the stored arguments, hashes and all)."""
    if name != "config.apply" or not isinstance(args, dict) or "config" not in args:
        return args
    return {**args, "config": hidden(args["config"])}
