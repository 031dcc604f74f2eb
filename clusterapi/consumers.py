"""The broker link: brokerd's websocket to the console (docs/protocol.md, "Console link").

One :class:`BrokerLinkConsumer` per connected broker. It checks the bearer
token before accepting (a refused handshake is an HTTP 403, logged and raised
as a ``link.refused`` alarm), then takes ``hello``, ``status`` and ``ack``
messages and answers with ``welcome``, ``resync`` and ``command``. Commands
reach it through the channel layer: the consumer joins the group
``broker.<id>`` after the hello and forwards every ``broker.command`` event.
Database work runs in Channels' database thread (``database_sync_to_async``),
the one Django runs sync views in: a page load holds the statuses up for its
render. A thread of the links' own was tried and measured worse (50 brokers x
1,000 queues with pages open in Chromium: the live overview's lag p50 9.2 s
against 0.6-2.1 s, a quarter of the statuses never shown): ingest fell further
behind beside the rendering threads than when renders and statuses take turns
on one thread (the cause is not settled: docs/benchmarks.md, eleventh session).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from clusterapi import alarms, commands, configs, ingest
from clusterapi.cluster import anotify_dashboard, broker_group, keep_in_group
from clusterapi.ingest import LinkProtocolError, LinkState
from clusterapi.models import Broker, Command

log = logging.getLogger(__name__)

#: websocket close code for a malformed message (docs/protocol.md)
CLOSE_MALFORMED = 4400
#: close code when the console fails on a message (the broker reconnects)
CLOSE_INTERNAL = 1011
#: refusals are written to the database at most this often per process
REFUSAL_RECORD_SECONDS = 10.0
_last_refusal_recorded = 0.0


def bearer_token(scope: dict[str, Any]) -> str | None:
    """The token of an ``Authorization: Bearer`` header, or None."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    return None


def token_accepted(token: str | None) -> bool:
    """Constant-time comparison with CONSOLE_BROKER_TOKEN; an empty setting accepts nobody."""
    expected = settings.CONSOLE_BROKER_TOKEN
    if not expected or token is None:
        return False
    return hmac.compare_digest(token.encode(), expected.encode())


def _record_refusal(peer: str, reason: str) -> None:
    alarms.raise_alarm(alarms.LINK_REFUSED, f"refused a broker link from {peer}: {reason}")


class BrokerLinkConsumer(AsyncJsonWebsocketConsumer):
    """One broker's link; see the module docstring."""

    link: LinkState | None = None
    group: str | None = None
    #: re-joins the broker's group while the link is open (memberships expire)
    member: asyncio.Task[None] | None = None
    #: the console closed this link (a malformed message, its own error): the broker
    #: is not known to be down, it reconnects (stale detection decides)
    closed_by_console: bool = False

    async def connect(self) -> None:
        token = bearer_token(self.scope)
        if not token_accepted(token):
            client = self.scope.get("client") or ("?", 0)
            peer = f"{client[0]}:{client[1]}"
            if not settings.CONSOLE_BROKER_TOKEN:
                reason = "CONSOLE_BROKER_TOKEN is not set, so no broker is accepted"
            elif token is None:
                reason = "no bearer token"
            else:
                reason = "wrong token"
            log.warning("broker link from %s refused: %s", peer, reason)
            await self._note_refusal(peer, reason)
            await self.close()  # before accept: the handshake is answered with HTTP 403
            return
        await self.accept()

    async def _note_refusal(self, peer: str, reason: str) -> None:
        global _last_refusal_recorded
        now = time.monotonic()
        if now - _last_refusal_recorded < REFUSAL_RECORD_SECONDS:
            return
        _last_refusal_recorded = now
        try:
            await database_sync_to_async(_record_refusal)(peer, reason)
            await anotify_dashboard("alarm")
        except Exception:
            log.exception("could not record the refused broker link")

    # -- incoming -------------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            if text_data is None:
                raise LinkProtocolError("binary frames are not part of the broker link")
            try:
                msg = json.loads(text_data)
            except ValueError:
                raise LinkProtocolError("a message must be UTF-8 JSON") from None
            kind = ingest.parse_envelope(msg)
            if kind == "hello":
                await self.on_hello(msg)
            elif self.link is None:
                raise LinkProtocolError(f"{kind} before hello")
            elif kind == "status":
                await self.on_status(msg)
            elif kind == "ack":
                await self.on_ack(msg)
            elif kind == "stopping":
                await self.on_stopping(msg)
            else:
                log.info("broker %s sent an unknown message type %r", self.link.name, kind)
        except LinkProtocolError as exc:
            name = self.link.name if self.link else self.scope.get("client")
            log.warning("broker link %s: malformed message: %s", name, exc)
            self.closed_by_console = True
            await self.close(code=CLOSE_MALFORMED, reason=_close_reason(str(exc)))
        except Exception:
            log.exception(
                "broker link %s: failed on a message", self.link.name if self.link else "?"
            )
            self.closed_by_console = True
            await self.close(code=CLOSE_INTERNAL, reason="console error")

    async def on_hello(self, msg: dict[str, Any]) -> None:
        if self.link is not None:
            raise LinkProtocolError("hello sent twice on one link")
        hello = ingest.parse_hello(msg)
        broker, _ = await database_sync_to_async(ingest.register_hello)(hello, self.channel_name)
        self.link = LinkState(
            broker.pk,
            broker.name,
            broker.broker_type,
            spid=broker.spid,
            running_config=(broker.config_version, broker.config_checksum),
            host=broker.host,
        )
        self.group = broker_group(broker.pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        self.member = asyncio.ensure_future(
            keep_in_group(self.channel_layer, self.group, self.channel_name)
        )
        version = await database_sync_to_async(configs.current)()
        await self.send_json(
            {"v": 1, "type": "welcome", "config_version": version.number if version else None}
        )
        await database_sync_to_async(_after_hello)(broker.pk)
        await anotify_dashboard("broker", broker.name)

    async def on_status(self, msg: dict[str, Any]) -> None:
        assert self.link is not None
        outcome = await database_sync_to_async(ingest.apply_status)(self.link, msg)
        if outcome.resync:
            await self.send_json({"v": 1, "type": "resync"})
        await anotify_dashboard("broker", self.link.name)
        if outcome.alarms_changed or outcome.state_changed:
            await anotify_dashboard("alarm", self.link.name)
        if outcome.config_changed:
            await anotify_dashboard("config", self.link.name)

    async def on_ack(self, msg: dict[str, Any]) -> None:
        assert self.link is not None
        command_id = msg.get("id")
        ok = msg.get("ok")
        result = msg.get("result")
        error = msg.get("error")
        if not isinstance(command_id, str):
            raise LinkProtocolError("ack.id must be a string")
        if not isinstance(ok, bool):
            raise LinkProtocolError("ack.ok must be true or false")
        if result is not None and not isinstance(result, dict):
            raise LinkProtocolError("ack.result must be an object or null")
        if error is not None and not isinstance(error, str):
            raise LinkProtocolError("ack.error must be a string or null")
        await database_sync_to_async(commands.acknowledge)(
            self.link.broker_id, command_id, ok, result, error
        )
        # an ack may have recorded what the broker runs: the next status is compared with
        # the stored row again, whatever this link last saw (acks are rare)
        self.link.running_config = ingest.UNKNOWN_RUNNING

    async def on_stopping(self, msg: dict[str, Any]) -> None:
        """A planned stop: recorded now, so the link closing next raises nothing."""
        assert self.link is not None
        spid, reason = ingest.parse_stopping(msg)
        if await database_sync_to_async(ingest.record_stopping)(self.link, spid, reason):
            log.info("broker %s stopping as planned (%s)", self.link.name, reason or "?")
            await anotify_dashboard("broker", self.link.name)

    # -- outgoing -------------------------------------------------------------------

    async def broker_command(self, event: dict[str, Any]) -> None:
        """A ``broker.command`` event from the channel layer: send it down the link."""
        await self.send_json(
            {
                "v": 1,
                "type": "command",
                "id": event["id"],
                "command": event["command"],
                "args": event.get("args") or {},
            }
        )

    async def disconnect(self, code: int) -> None:
        if self.member is not None:
            self.member.cancel()
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)
        if self.link is not None:
            outcome = await database_sync_to_async(ingest.link_closed)(
                self.link, self.channel_name, code, crash=not self.closed_by_console
            )
            log.info(
                "broker %s disconnected (code %s)%s",
                self.link.name,
                code,
                f": {outcome}" if outcome else "",
            )
            await anotify_dashboard("broker", self.link.name)
            if outcome == "down":
                await anotify_dashboard("alarm", self.link.name)


def _after_hello(broker_id: int) -> None:
    """Push the current configuration if the broker lacks it, and send what waited for it."""
    broker = Broker.objects.get(pk=broker_id)
    configs.reconcile(broker)
    for pk in Command.objects.filter(
        broker_id=broker_id, state__in=Command.OPEN_STATES
    ).values_list("pk", flat=True):
        commands.deliver(pk)


def _close_reason(text: str) -> str:
    """A close reason fits in 123 bytes of UTF-8."""
    data = text.encode()[:120]
    return data.decode("utf-8", errors="ignore")


async def refuse_websocket(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """ASGI app for websocket paths nobody serves: refuse the handshake (HTTP 403)."""
    message = await receive()
    if message["type"] == "websocket.connect":
        await send({"type": "websocket.close", "code": 1000})
