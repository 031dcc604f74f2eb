"""Federation on one server: upstreams, upstream sets and policies, and one link per
federated object and upstream.

Definitions are RabbitMQ's (``bridges.upstreams``), kept per vhost in
``DATA_DIR/federation.json`` (mode 0600: upstream URIs carry passwords) and
set with ``brokerd ctl federation`` as ``rabbitmqctl set_parameter
federation-upstream`` and ``set_policy`` set them there. Every
``RECOMPUTE_EVERY`` seconds (and at once after a change) the links that should
run are derived from the policies and this broker's exchanges and queues, and
``reconcile`` starts and stops runners to match: an exchange declared after
its policy is federated within that time, one deleted stops its links.

In a cluster the links run on the root alone (``runs_here``), so each runs on
one server and moves with the root; its upstream keeps what was in flight
(unacknowledged) and delivers it again, flagged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from brokerd.bridges.definitions import DefinitionError
from brokerd.bridges.federated import ExchangeLink, FederationLink, QueueLink
from brokerd.bridges.federation import EXCHANGE, QUEUE, BindingKey, LinkSpec
from brokerd.bridges.runner import LocalBroker
from brokerd.bridges.service import (
    BridgeError,
    Rates,
    down_alarm,
    wait_stopped,
    write_private,
)
from brokerd.bridges.upstreams import (
    Policy,
    Upstream,
    links_for,
    parse_policy,
    parse_upstream,
    parse_upstream_set,
)
from brokerd.bridges.uri import parse_uris, redact

log = logging.getLogger("brokerd.bridges.federation")

FILE_NAME = "federation.json"
#: the three kinds of definition, as RabbitMQ names them
UPSTREAMS = "federation-upstream"
UPSTREAM_SETS = "federation-upstream-set"
POLICIES = "policy"
KINDS = (UPSTREAMS, UPSTREAM_SETS, POLICIES)
#: definitions of each kind per vhost, and links one server runs, at most
DEFINITIONS_MAX = 256
LINKS_MAX = 256
#: seconds between derivations of the links from policies and objects
RECOMPUTE_EVERY = 1.0


class FederationError(BridgeError):
    """A refused request (``field`` names the key at fault)."""


class Objects:
    """What the service reads of the broker (the server's glue fills it in)."""

    def __init__(
        self,
        exchanges: Callable[[str], list[str]],
        queues: Callable[[str], list[str]],
        keys: Callable[[str, str], set[BindingKey]],
        demand: Callable[[str, str], tuple[int, int]],
    ) -> None:
        #: a vhost's exchanges that may be federated (not the default, not internal)
        self.exchanges = exchanges
        #: a vhost's queues that may be federated (not exclusive)
        self.queues = queues
        #: an exchange's binding keys here
        self.keys = keys
        #: a queue's (consumers, ready messages) here
        self.demand = demand


class FederationService:
    """Definitions, the links they call for, and their runners."""

    def __init__(
        self,
        path: Path,
        *,
        node: str,
        downstream: str,
        local: Callable[[], LocalBroker | None],
        objects: Objects,
    ) -> None:
        self.path = path
        self.node = node
        #: this broker's name as its upstreams' x-federation-upstream exchanges know it
        self.downstream = downstream
        self.local = local
        self.objects = objects
        #: raw definitions as given: vhost -> kind -> name -> value (``ctl`` saved them)
        self.raw: dict[str, dict[str, dict[str, Any]]] = {}
        #: the configuration document's (None: it has no federation parts, ``raw`` rules)
        self.document: dict[str, dict[str, dict[str, Any]]] | None = None
        #: ``ctl federation set`` and ``delete`` refused (a cluster: the document rules)
        self.refuse_ctl: str | None = None
        self.upstreams: dict[str, dict[str, Upstream]] = {}
        self.sets: dict[str, dict[str, list[dict[str, Any]]]] = {}
        self.policies: dict[str, list[Policy]] = {}
        #: links run here now (a cluster: only the root runs them)
        self.runs_here: Callable[[], bool] = lambda: True
        self.runners: dict[tuple[str, str, str, str], FederationLink] = {}
        self.tasks: dict[tuple[str, str, str, str], asyncio.Task[None]] = {}
        self._computed = 0.0
        self._closed = False
        self.retired_forwarded = 0
        self._rates = Rates()

    # -- definitions --------------------------------------------------------------------

    def start(self) -> None:
        """Load what was saved; a definition that no longer parses is logged and left
        out, never fatal."""
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            raw = {}
        except (OSError, ValueError) as exc:
            log.error("federation file %s unreadable (%s): no links", self.path, exc)
            raw = {}
        self._load(raw if isinstance(raw, dict) else {})
        self.tick(force=True)

    def _load(self, raw: dict[str, Any]) -> None:
        """Parse ``raw`` (vhost -> kind -> name -> value) into the definitions in force;
        one that does not parse is logged and left out."""
        self.raw, self.upstreams, self.sets, self.policies = {}, {}, {}, {}
        for vhost, kinds in raw.items():
            for kind, named in kinds.items() if isinstance(kinds, dict) else ():
                for name, value in named.items() if isinstance(named, dict) else ():
                    try:
                        self._put(vhost, kind, name, value)
                    except (DefinitionError, FederationError) as exc:
                        why = redact(str(exc))
                        log.error("%s %s (vhost %s) left out: %s", kind, name, vhost, why)

    def configure(
        self, upstreams: list[dict[str, Any]] | None, policies: list[dict[str, Any]] | None
    ) -> None:
        """The configuration document's ``federation_upstreams`` and ``policies`` parts
        (``configdoc`` validated them); both None: it has neither, and what ``ctl``
        saved rules again."""
        if upstreams is None and policies is None:
            if self.document is not None:
                self.document = None
                self.start()
            return
        raw: dict[str, dict[str, dict[str, Any]]] = {}
        for entry in upstreams or ():
            kind = entry.get("component", UPSTREAMS)
            raw.setdefault(entry["vhost"], {}).setdefault(kind, {})[entry["name"]] = entry["value"]
        for entry in policies or ():
            value = {k: v for k, v in entry.items() if k not in ("name", "vhost")}
            raw.setdefault(entry["vhost"], {}).setdefault(POLICIES, {})[entry["name"]] = value
        self.document = raw
        self._load(raw)
        self.tick(force=True)

    def _put(self, vhost: str, kind: str, name: str, value: Any) -> None:
        if kind == UPSTREAMS:
            upstream = parse_upstream(name, value, vhost)
            self.upstreams.setdefault(vhost, {})[name] = upstream
        elif kind == UPSTREAM_SETS:
            self.sets.setdefault(vhost, {})[name] = parse_upstream_set(name, value)[1]
        elif kind == POLICIES:
            policy = parse_policy(name, value, vhost)
            others = [p for p in self.policies.get(vhost, []) if p.name != name]
            self.policies[vhost] = [*others, policy]
        else:
            raise FederationError(f"unknown kind '{kind}' (known: {', '.join(KINDS)})", "kind")
        self.raw.setdefault(vhost, {}).setdefault(kind, {})[name] = value

    def _drop(self, vhost: str, kind: str, name: str) -> None:
        named = self.raw.get(vhost, {}).get(kind, {})
        if name not in named:
            raise FederationError(f"no {kind} '{name}' in vhost '{vhost}'")
        del named[name]
        if kind == UPSTREAMS:
            self.upstreams.get(vhost, {}).pop(name, None)
        elif kind == UPSTREAM_SETS:
            self.sets.get(vhost, {}).pop(name, None)
        else:
            self.policies[vhost] = [p for p in self.policies.get(vhost, []) if p.name != name]

    async def set(self, kind: str, name: str, value: object, vhost: str = "/") -> dict[str, Any]:
        """Create or replace one definition; the links follow at once."""
        self._ctl_allowed()
        if kind not in KINDS:
            raise FederationError(f"unknown kind '{kind}' (known: {', '.join(KINDS)})", "kind")
        named = self.raw.get(vhost, {}).get(kind, {})
        if name not in named and len(named) >= DEFINITIONS_MAX:
            raise FederationError(f"at most {DEFINITIONS_MAX} of kind {kind} in one vhost")
        try:
            self._put(vhost, kind, name, value)
        except DefinitionError as exc:
            raise FederationError(redact(str(exc)), exc.field) from None
        self._save()
        await self._settle()
        return {"kind": kind, "name": name, "vhost": vhost, "value": self._public(kind, value)}

    async def delete(self, kind: str, name: str, vhost: str = "/") -> dict[str, Any]:
        self._ctl_allowed()
        self._drop(vhost, kind, name)
        self._save()
        await self._settle()
        return {"kind": kind, "name": name, "vhost": vhost, "deleted": True}

    def _ctl_allowed(self) -> None:
        if self.document is not None:
            raise FederationError(
                "federation comes from the console's configuration document here: change it"
                " there (the console or the REST API)"
            )
        if self.refuse_ctl is not None:
            raise FederationError(self.refuse_ctl)

    def _save(self) -> None:
        write_private(self.path, self.raw)

    @staticmethod
    def _public(kind: str, value: Any) -> Any:
        """A definition as anyone may see it: upstream URIs without passwords."""
        if kind != UPSTREAMS or not isinstance(value, dict) or "uri" not in value:
            return value
        uris = [u.redacted for u in parse_uris(value["uri"], "uri")]
        return {**value, "uri": uris if isinstance(value["uri"], list) else uris[0]}

    def list(self) -> list[dict[str, Any]]:
        return [
            {"kind": kind, "name": name, "vhost": vhost, "value": self._public(kind, value)}
            for vhost, kinds in sorted(self.raw.items())
            for kind in KINDS
            for name, value in sorted(kinds.get(kind, {}).items())
        ]

    # -- links ----------------------------------------------------------------------------

    def wanted(self) -> dict[tuple[str, str, str, str], LinkSpec]:
        """The links the policies call for over this broker's objects now."""
        if self._closed or not self.runs_here():
            return {}
        out: dict[tuple[str, str, str, str], LinkSpec] = {}
        for vhost, policies in self.policies.items():
            if not policies:
                continue
            upstreams, sets = self.upstreams.get(vhost, {}), self.sets.get(vhost, {})
            for kind, names in (
                (EXCHANGE, self.objects.exchanges(vhost)),
                (QUEUE, self.objects.queues(vhost)),
            ):
                for name in names:
                    for link in links_for(kind, name, policies, upstreams, sets):
                        spec = LinkSpec(
                            kind, vhost, name, link.upstream, link.source, self.downstream
                        )
                        out[spec.key] = spec
        return out

    def tick(self, force: bool = False) -> None:
        """The server's tick: derive the links again (at most every RECOMPUTE_EVERY)."""
        now = time.monotonic()
        if not force and now - self._computed < RECOMPUTE_EVERY:
            return
        self._computed = now
        wanted = self.wanted()
        for key in [k for k, r in self.runners.items() if wanted.get(k) != r.spec]:
            self._stop(key)
        for key, spec in sorted(wanted.items()):
            if key in self.runners:
                continue
            if len(self.runners) >= LINKS_MAX:
                log.error("federation: more than %d links wanted; the rest wait", LINKS_MAX)
                break
            self._run(spec)

    def _run(self, spec: LinkSpec) -> None:
        local = self.local()
        runner: FederationLink
        if spec.kind == EXCHANGE:
            runner = ExchangeLink(
                spec,
                node=self.node,
                local=local,
                keys=lambda: self.objects.keys(spec.vhost, spec.name),
            )
        else:
            runner = QueueLink(
                spec,
                node=self.node,
                local=local,
                demand=lambda: self.objects.demand(spec.vhost, spec.name),
            )
        log.info(
            "federation link %s %s (vhost %s) from %s: starting",
            spec.kind,
            spec.name,
            spec.vhost,
            spec.upstream.name,
        )
        self.runners[spec.key] = runner
        self.tasks[spec.key] = asyncio.ensure_future(runner.run())

    def _stop(self, key: tuple[str, str, str, str]) -> asyncio.Task[None] | None:
        runner, task = self.runners.pop(key, None), self.tasks.pop(key, None)
        if runner is not None:
            runner.stop()
            self.retired_forwarded += runner.transfer.forwarded
            log.info("federation link %s %s (vhost %s) from %s: stopped", *key[1:3], key[0], key[3])
        return task

    async def _settle(self) -> None:
        """Derive and reconcile now, and let stopped runners finish."""
        before = set(self.tasks.values())
        self.tick(force=True)
        ended = [t for t in before if t not in self.tasks.values()]
        await self._wait(ended)

    @staticmethod
    async def _wait(tasks: list[asyncio.Task[None]]) -> None:
        for task in tasks:
            await wait_stopped(task)

    async def close(self) -> None:
        self._closed = True
        await self._wait([t for t in (self._stop(k) for k in list(self.runners)) if t is not None])

    async def restart(self) -> dict[str, Any]:
        """Every link anew (RabbitMQ's ``restart_federation_link`` for all)."""
        count = len(self.runners)
        await self._wait([t for t in (self._stop(k) for k in list(self.runners)) if t is not None])
        self.tick(force=True)
        return {"restarted": count}

    # -- what people see -------------------------------------------------------------------

    def status(self) -> list[dict[str, Any]]:
        """Each link's status row, with its rate."""
        return self._rates.rows(self.runners)

    def forwarded_total(self) -> int:
        running = sum(r.transfer.forwarded for r in self.runners.values())
        return self.retired_forwarded + running

    def alarm(self, now: float | None = None) -> dict[str, Any] | None:
        """``federation-down``: a link terminated, or down as long as a bridge may be
        (``BRIDGE_ALARM_AFTER``); it clears once they run again."""
        now = time.time() if now is None else now
        return down_alarm(
            "federation-down",
            self.runners,  # type: ignore[arg-type]
            now,
            lambda key: f"federation link of {key[1]} {key[2]} (vhost {key[0]}) from {key[3]}",
        )
