"""Broker users' password hashes, and the passwords in bridges' URIs, are write-only
in the console (issues 46 and 42).

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

A bridge's URIs (``src-uri``, ``dest-uri``) and a federation upstream's
(``uri``) carry the far broker's password: readers get each as
``amqp://user:***@host``, and a writer sending a URI back so redacted keeps the
password the current version has for the same bridge or upstream and URI
(``hidden_uri``: one still hidden is refused by ``configs.validate``).
"""

from __future__ import annotations

import copy
from typing import Any

from brokerd.bridges.uri import REDACTED, redact

HASH_KEY = "password_hash"
URI_KEYS = ("src-uri", "dest-uri", "uri")
#: the document's parts whose entries' values carry URIs
URI_PARTS = ("bridges", "federation_upstreams")


def hidden(document: Any) -> Any:
    """``document`` with every user's password hash removed and every bridge URI's
    password redacted (a copy; anything that is not a document is returned as it is)."""
    if not isinstance(document, dict):
        return document
    out = dict(document)
    if isinstance(document.get("users"), list):
        out["users"] = [
            {k: v for k, v in user.items() if k != HASH_KEY} if isinstance(user, dict) else user
            for user in document["users"]
        ]
    for part in URI_PARTS:
        if isinstance(document.get(part), list):
            out[part] = [_bridge(b, lambda _key, uri: redact(uri)) for b in document[part]]
    return out


def _bridge(bridge: Any, change: Any) -> Any:
    """``bridge`` with ``change(key, uri)`` applied to each of its URIs (a copy)."""
    if not isinstance(bridge, dict) or not isinstance(bridge.get("value"), dict):
        return bridge
    value = dict(bridge["value"])
    for key in URI_KEYS:
        uris = value.get(key)
        if isinstance(uris, str):
            value[key] = change(key, uris)
        elif isinstance(uris, list):
            value[key] = [change(key, u) if isinstance(u, str) else u for u in uris]
    return {**bridge, "value": value}


def _is_hidden(uri: str) -> bool:
    return f":{REDACTED}@" in uri


def hidden_uri(document: Any) -> str | None:
    """The first bridge or upstream URI still sent with its password hidden, as a
    field path."""
    if not isinstance(document, dict):
        return None
    for part in URI_PARTS:
        entries = document.get(part)
        for i, bridge in enumerate(entries if isinstance(entries, list) else ()):
            value = bridge.get("value") if isinstance(bridge, dict) else None
            for key in URI_KEYS if isinstance(value, dict) else ():
                uris = value.get(key)
                listed = [uris] if isinstance(uris, str) else uris if isinstance(uris, list) else []
                if any(isinstance(uri, str) and _is_hidden(uri) for uri in listed):
                    return f"{part}[{i}].value.{key}"
    return None


def kept(document: Any, previous: dict[str, Any] | None) -> Any:
    """``document`` with each user that has no hash given the one ``previous`` has for
    that user name, and each bridge URI sent redacted given back the password of the
    same bridge's URI in ``previous`` (a copy); what is still missing is left for
    validation to refuse."""
    if not isinstance(document, dict):
        return document
    document = _kept_uris(document, previous)
    if not isinstance(document.get("users"), list):
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


def _kept_uris(document: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any]:
    for part in URI_PARTS:
        document = _kept_part(document, previous, part)
    return document


def _kept_part(
    document: dict[str, Any], previous: dict[str, Any] | None, part: str
) -> dict[str, Any]:
    if not isinstance(document.get(part), list):
        return document
    before: dict[tuple[Any, Any, str], list[str]] = {}
    for bridge in (previous or {}).get(part) or []:

        def note(key: str, uri: str, bridge: dict[str, Any] = bridge) -> str:
            before.setdefault((bridge.get("vhost", "/"), bridge.get("name"), key), []).append(uri)
            return uri

        _bridge(bridge, note)
    out = dict(document)
    bridges = []
    for bridge in document[part]:
        where = (bridge.get("vhost", "/"), bridge.get("name")) if isinstance(bridge, dict) else None

        def back(key: str, uri: str, where: Any = where) -> str:
            if not _is_hidden(uri) or where is None:
                return uri
            for known in before.get((*where, key), []):
                if redact(known) == uri:
                    return known
            return uri

        bridges.append(_bridge(bridge, back))
    out[part] = bridges
    return out


def hidden_args(name: str, args: Any) -> Any:
    """A command's arguments as users see them: a ``config.apply``'s document without
    hashes (the broker link sends the stored arguments, hashes and all)."""
    if name != "config.apply" or not isinstance(args, dict) or "config" not in args:
        return args
    return {**args, "config": hidden(args["config"])}
