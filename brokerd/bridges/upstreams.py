"""Federation upstreams, upstream sets and the policies that federate exchanges and
queues, in the JSON of RabbitMQ's ``federation-upstream`` and
``federation-upstream-set`` parameters and its policies. Pure: the runtime (one
link per federated object and upstream) builds on ``links_for``.

What RabbitMQ accepts is accepted here unchanged, with its defaults:
``prefetch-count`` 1000, ``reconnect-delay`` 5 s, ``ack-mode`` ``on-confirm``,
``max-hops`` 1, ``exchange``/``queue`` the federated object's own name,
``expires``/``message-ttl`` none (milliseconds, for the upstream's queue).
``ha-policy`` is read and ignored, as RabbitMQ 3.10 does for non-mirrored
queues. Anything else is refused with the key named (``DefinitionError``).

Which upstreams federate an object: the policy with the highest ``priority``
among those whose ``pattern`` matches its name and whose ``apply-to`` covers
its kind (ties: the first by name), if its definition says
``federation-upstream-set`` (``all``: every upstream of the vhost) or
``federation-upstream`` (one). A set's entries may override an upstream's
keys (``uri`` excepted), as RabbitMQ's do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from brokerd.bridges.definitions import (
    ACK_MODES,
    DEFAULT_PREFETCH,
    DEFAULT_RECONNECT_DELAY,
    ON_CONFIRM,
    PREFETCH_MAX,
    RECONNECT_DELAY_MAX,
    DefinitionError,
    integer_field,
    name_field,
    parse_name,
)
from brokerd.bridges.uri import AmqpUri, UriError, parse_uris

UPSTREAM_KEYS = (
    "uri",
    "prefetch-count",
    "reconnect-delay",
    "ack-mode",
    "trust-user-id",
    "exchange",
    "max-hops",
    "expires",
    "message-ttl",
    "ha-policy",
    "queue",
    "consumer-tag",
    "bind-nowait",
)
#: a hop count beyond this only delays the loop's end: RabbitMQ takes any, we bound it
MAX_HOPS_MAX = 255
#: a queue's x-expires and x-message-ttl (ms) take at most this (RabbitMQ's bound)
MILLISECONDS_MAX = 2**32 - 1
POLICY_KEYS = ("pattern", "apply-to", "priority", "definition")
APPLY_TO = ("exchanges", "queues", "all")
#: a policy pattern longer than this is refused (a regex over every object's name)
PATTERN_MAX = 255
ALL = "all"


@dataclass(frozen=True)
class Upstream:
    """One upstream: where to connect, and how its link behaves."""

    name: str
    vhost: str
    uris: tuple[AmqpUri, ...]
    prefetch: int = DEFAULT_PREFETCH
    reconnect_delay: float = DEFAULT_RECONNECT_DELAY
    ack_mode: str = ON_CONFIRM
    trust_user_id: bool = False
    exchange: str | None = None
    queue: str | None = None
    max_hops: int = 1
    expires: int | None = None
    message_ttl: int | None = None
    consumer_tag: str | None = None
    #: the definition as given (what the configuration stores)
    document: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Policy:
    """A policy that federates what its pattern matches."""

    name: str
    vhost: str
    pattern: re.Pattern[str]
    apply_to: str
    priority: int
    #: ``all``, a set's name, or None (with ``upstream``)
    upstream_set: str | None
    upstream: str | None

    def applies(self, kind: str, name: str) -> bool:
        """It covers object ``name`` of ``kind`` (``exchange`` or ``queue``)."""
        return self.apply_to in (ALL, kind + "s") and self.pattern.search(name) is not None


@dataclass(frozen=True)
class Link:
    """One upstream federating one object: what the runtime connects."""

    upstream: Upstream
    #: the upstream's exchange (or queue) the object federates from
    source: str


def parse_upstream(name: object, raw: object, vhost: str = "/") -> Upstream:
    """Check and normalise one ``federation-upstream`` value."""
    checked = parse_name(name)
    doc = _object("value", raw)
    unknown = sorted(set(doc) - set(UPSTREAM_KEYS))
    if unknown:
        raise DefinitionError(unknown[0], f"unknown key (known: {', '.join(UPSTREAM_KEYS)})")
    if "uri" not in doc:
        raise DefinitionError("uri", "is required")
    try:
        uris = parse_uris(doc["uri"], "uri")
    except UriError as exc:
        raise DefinitionError("uri", str(exc).split(": ", 1)[-1]) from None
    return _upstream(checked, vhost, uris, doc)


def _upstream(name: str, vhost: str, uris: tuple[AmqpUri, ...], doc: dict[str, Any]) -> Upstream:
    ack_mode = doc.get("ack-mode", ON_CONFIRM)
    if ack_mode not in ACK_MODES:
        raise DefinitionError("ack-mode", f"must be one of {', '.join(ACK_MODES)}")
    delay = doc.get("reconnect-delay", DEFAULT_RECONNECT_DELAY)
    if isinstance(delay, bool) or not isinstance(delay, int | float):
        raise DefinitionError("reconnect-delay", "must be a number of seconds")
    if not 0 <= delay <= RECONNECT_DELAY_MAX:
        raise DefinitionError("reconnect-delay", f"must be 0-{RECONNECT_DELAY_MAX:g} seconds")
    for key in ("trust-user-id", "bind-nowait"):
        if not isinstance(doc.get(key, False), bool):
            raise DefinitionError(key, "must be true or false")
    if "ha-policy" in doc and not isinstance(doc["ha-policy"], str):
        raise DefinitionError("ha-policy", "must be a string")
    return Upstream(
        name=name,
        vhost=vhost,
        uris=uris,
        prefetch=integer_field(doc, "prefetch-count", DEFAULT_PREFETCH, 1, PREFETCH_MAX),
        reconnect_delay=float(delay),
        ack_mode=ack_mode,
        trust_user_id=bool(doc.get("trust-user-id", False)),
        exchange=name_field(doc, "exchange"),
        queue=name_field(doc, "queue"),
        max_hops=integer_field(doc, "max-hops", 1, 1, MAX_HOPS_MAX),
        expires=_optional_ms(doc, "expires", low=1),
        message_ttl=_optional_ms(doc, "message-ttl", low=0),
        consumer_tag=name_field(doc, "consumer-tag"),
        document=doc,
    )


def parse_upstream_set(name: object, raw: object) -> tuple[str, list[dict[str, Any]]]:
    """Check one ``federation-upstream-set`` value: a list of ``{"upstream": NAME,
    ...overrides}``, each override an upstream key but ``uri``."""
    checked = parse_name(name)
    if not isinstance(raw, list) or not raw:
        raise DefinitionError("value", "an upstream set is a non-empty list of {upstream}")
    entries = []
    for i, entry in enumerate(raw):
        where = f"value[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("upstream"), str):
            raise DefinitionError(where, 'each entry is {"upstream": NAME, ...}')
        overrides = sorted(set(entry) - {"upstream"})
        for key in overrides:
            if key not in UPSTREAM_KEYS or key == "uri":
                raise DefinitionError(f"{where}.{key}", "not an upstream key a set overrides")
        entries.append(dict(entry))
    return checked, entries


def parse_policy(name: object, raw: object, vhost: str = "/") -> Policy:
    """Check one policy (RabbitMQ's ``pattern``, ``apply-to``, ``priority``,
    ``definition``) that federates: its definition names an upstream set or one
    upstream. Other policy keys are not Rookery's (yet), and are refused by name."""
    checked = parse_name(name)
    doc = _object("value", raw)
    unknown = sorted(set(doc) - set(POLICY_KEYS))
    if unknown:
        raise DefinitionError(unknown[0], f"unknown key (known: {', '.join(POLICY_KEYS)})")
    pattern = doc.get("pattern")
    if not isinstance(pattern, str) or len(pattern) > PATTERN_MAX:
        raise DefinitionError("pattern", f"a regular expression of at most {PATTERN_MAX} chars")
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise DefinitionError("pattern", f"not a regular expression: {exc}") from None
    apply_to = doc.get("apply-to", ALL)
    if apply_to not in APPLY_TO:
        raise DefinitionError("apply-to", f"must be one of {', '.join(APPLY_TO)}")
    priority = integer_field(doc, "priority", 0, -(2**31), 2**31 - 1)
    definition = _object("definition", doc.get("definition"))
    keys = set(definition)
    if keys not in ({"federation-upstream-set"}, {"federation-upstream"}):
        raise DefinitionError(
            "definition",
            "must be {'federation-upstream-set': NAME or 'all'} or {'federation-upstream': NAME}",
        )
    (key,) = keys
    value = definition[key]
    if not isinstance(value, str) or not value:
        raise DefinitionError(f"definition.{key}", "must be a name")
    set_name = value if key == "federation-upstream-set" else None
    one = value if key == "federation-upstream" else None
    return Policy(checked, vhost, compiled, apply_to, priority, set_name, one)


def policy_for(kind: str, name: str, policies: list[Policy]) -> Policy | None:
    """The policy that applies to object ``name`` of ``kind``: the highest priority
    among those covering it, the first by name among equals."""
    best = None
    for policy in sorted(policies, key=lambda p: p.name):
        if policy.applies(kind, name) and (best is None or policy.priority > best.priority):
            best = policy
    return best


def links_for(
    kind: str,
    name: str,
    policies: list[Policy],
    upstreams: dict[str, Upstream],
    sets: dict[str, list[dict[str, Any]]],
) -> list[Link]:
    """The upstreams federating object ``name`` of ``kind`` (one vhost's policies,
    upstreams by name, and upstream sets by name); an unknown upstream or set name
    federates nothing (RabbitMQ logs it and does the same)."""
    policy = policy_for(kind, name, policies)
    if policy is None:
        return []
    if policy.upstream is not None:
        entries = [{"upstream": policy.upstream}]
    elif policy.upstream_set == ALL:
        entries = [{"upstream": u} for u in sorted(upstreams)]
    else:
        entries = sets.get(policy.upstream_set or "", [])
    links = []
    for entry in entries:
        base = upstreams.get(entry["upstream"])
        if base is None:
            continue
        overrides = {k: v for k, v in entry.items() if k != "upstream"}
        upstream = (
            _upstream(base.name, base.vhost, base.uris, {**base.document, **overrides})
            if overrides
            else base
        )
        source = (upstream.exchange if kind == "exchange" else upstream.queue) or name
        links.append(Link(upstream, source))
    return links


def _object(key: str, raw: object) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise DefinitionError(key, "must be a JSON object")
    return dict(raw)


def _optional_ms(doc: dict[str, Any], key: str, low: int) -> int | None:
    if doc.get(key) is None:
        return None
    return integer_field(doc, key, 0, low, MILLISECONDS_MAX)
