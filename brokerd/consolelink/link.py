"""The asyncio shell of the console link: one websocket, reconnect with backoff.

The broker works fully without a console, so nothing here may hold up AMQP
traffic: statuses are built on the event loop in one go (no awaits while
walking the model), a status is skipped rather than queued when the socket
still holds unsent data, and every failure ends in a logged reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
import time
from pathlib import Path
from typing import TYPE_CHECKING

import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI

from brokerd.consolelink import messages
from brokerd.consolelink.commands import ConsoleCommands
from brokerd.consolelink.session import ConsoleSession
from brokerd.consolelink.tls import ConsoleTLSError, client_context, describe_failure

if TYPE_CHECKING:
    from brokerd.consolelink.host import ConsoleHost

log = logging.getLogger("brokerd.console")

BACKOFF_MIN = 0.5
#: a console that refused this broker (HTTP 401/403, TLS, a bad URL) is asked again at
#: most this often: retrying does not heal it
BACKOFF_MAX = 15.0
#: a console that is not there (connection refused, timed out, closed) is tried again
#: at most this often (+25 % jitter): it is being restarted or deployed, and once it is
#: back its stale detection gives the brokers a few seconds to link again
#: (``BROKER_RECONNECT_GRACE``), not the tail of a long backoff
ABSENT_MAX = 2.0
#: a session that lasted this long resets the backoff
STABLE_AFTER = 5.0
OPEN_TIMEOUT = 10.0


def backoff_delays(
    minimum: float = BACKOFF_MIN, maximum: float = BACKOFF_MAX, rng: random.Random | None = None
):
    """Reconnect delays: ``minimum`` doubling to ``maximum``, each with +-25 % jitter
    so that ten brokers do not knock on a restarted console in step."""
    rng = rng or random.Random()
    delay = minimum
    while True:
        yield delay * rng.uniform(0.75, 1.25)
        delay = min(delay * 2, maximum)


class ConsoleLink:
    def __init__(self, host: ConsoleHost, url: str, token: str, cafile: Path | None = None) -> None:
        self.host = host
        self.url = url
        self.token = token
        #: wss:// only: the CA bundle that verifies the console (None: the system's)
        self.cafile = cafile
        # refuse a ws:// URL with a CA file, or an unusable CA file, before starting
        client_context(url, cafile)
        #: the TLS failure last logged at ERROR, until the link is up or fails otherwise
        self._tls_failure: str | None = None
        self.commands = ConsoleCommands(host)
        self.connected = False
        self.statuses_skipped = 0
        self._task: asyncio.Task[None] | None = None
        self._ws: ClientConnection | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def announce_stop(self, reason: str) -> None:
        """A planned stop: say so before anything closes, so the console records it
        as an event and does not take the closing link for a crash."""
        ws = self._ws
        if ws is None:
            return
        message = messages.stopping(self.host.spid, reason)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ws.send(messages.encode(message)), timeout=1.0)

    async def stop(self) -> None:
        """Close the websocket as "going away" (1001), then stop reconnecting."""
        ws = self._ws
        if ws is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.close(1001, "broker shutdown"), timeout=2.0)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        refused_delays = backoff_delays()
        absent_delays = backoff_delays(maximum=ABSENT_MAX)
        #: failures in a row of a console that is not there (logged once, then quietly)
        absent = 0
        while True:
            opened = None
            tls_failure: str | None = None
            away = False
            try:
                # read at every attempt: a console whose certificate was renewed under a
                # new CA is reached once the bundle is replaced, without a broker restart
                context = client_context(self.url, self.cafile)
                async with websockets.connect(
                    self.url,
                    additional_headers={"Authorization": f"Bearer {self.token}"},
                    open_timeout=OPEN_TIMEOUT,
                    max_size=messages.MAX_MESSAGE,
                    user_agent_header=f"brokerd/{self.host.spid}",
                    ssl=context,
                ) as ws:
                    opened = time.monotonic()
                    self._ws = ws
                    self.connected = True
                    self._tls_failure = None
                    log.info("console link up url=%s%s", self.url, tls_summary(ws))
                    await self._session(ws)
            except asyncio.CancelledError:
                raise
            except ssl.SSLError as exc:
                tls_failure = describe_failure(exc)
            except ConsoleTLSError as exc:
                tls_failure = str(exc)  # the CA file went bad since startup
            except InvalidStatus as exc:
                code = exc.response.status_code
                if code in (401, 403):
                    log.error(
                        "console refused this broker (HTTP %d): check --console-token "
                        "against the console's CONSOLE_BROKER_TOKEN",
                        code,
                    )
                else:
                    log.warning("console link refused url=%s: HTTP %d", self.url, code)
            except InvalidURI as exc:
                log.error("console URL %s is not usable: %s", self.url, exc)
            except (OSError, TimeoutError, InvalidHandshake, websockets.ConnectionClosed) as exc:
                away = True
                level = logging.WARNING if absent == 0 or opened is not None else logging.DEBUG
                log.log(
                    level,
                    "console link down url=%s: %s%s",
                    self.url,
                    str(exc) or type(exc).__name__,
                    "; retrying every few seconds" if level == logging.WARNING else "",
                )
            finally:
                self.connected = False
                self._ws = None
            self._report_tls(tls_failure)
            if opened is not None:
                absent = 0
                if time.monotonic() - opened >= STABLE_AFTER:
                    refused_delays = backoff_delays()
                    absent_delays = backoff_delays(maximum=ABSENT_MAX)
            if away:
                absent += 1
                delay = next(absent_delays)
            else:
                delay = next(refused_delays)
            log.log(
                logging.DEBUG if absent > 1 else logging.INFO,
                "console link retry in %.1fs",
                delay,
            )
            await asyncio.sleep(delay)

    def _report_tls(self, failure: str | None) -> None:
        """Log a TLS failure at ERROR once while it repeats. A wrong CA or host name
        does not heal by retrying, and the same error every 15 s forever would bury
        the rest of the log; a different failure, or one after the link was up or
        failed otherwise, is logged again."""
        if failure is None:
            self._tls_failure = None
            return
        if failure == self._tls_failure:
            log.debug("console link: %s url=%s (again)", failure, self.url)
            return
        self._tls_failure = failure
        hint = ""
        if failure.startswith("certificate verify failed"):
            source = f"--console-cafile {self.cafile}" if self.cafile else "the system CAs"
            hint = f"; the console's certificate must chain to {source} and name the URL's host"
        log.error("console link: %s url=%s%s", failure, self.url, hint)

    async def _session(self, ws: ClientConnection) -> None:
        session = ConsoleSession(self.host, self.commands)
        await ws.send(messages.encode(session.hello()))
        loop = asyncio.get_running_loop()
        sender = loop.create_task(self._statuses(ws, session))
        #: acks of commands that wait (cluster.forget, queues.grow|shrink), sent once resolved
        later: set[asyncio.Task[None]] = set()
        try:
            async for text in ws:
                try:
                    replies = session.receive(text)
                except messages.MalformedMessage as exc:
                    log.error("console sent a malformed message: %s; closing the link", exc)
                    await ws.close(messages.CLOSE_MALFORMED, str(exc)[:100])
                    return
                for reply in replies:
                    if isinstance(reply, dict):
                        await ws.send(messages.encode(reply))
                        continue
                    task = loop.create_task(self._answer_later(ws, reply))
                    later.add(task)
                    task.add_done_callback(later.discard)
            log.warning(
                "console closed the link code=%s reason=%s",
                ws.close_code,
                ws.close_reason or "-",
            )
        finally:
            for task in (sender, *later):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, websockets.ConnectionClosed):
                await sender

    async def _answer_later(self, ws: ClientConnection, answer: asyncio.Future[dict]) -> None:
        """Send a command's ack once it resolves. The command itself outlives this link
        (shielded): a console that reconnects and retries the id gets its ack."""
        reply = await asyncio.shield(answer)
        with contextlib.suppress(websockets.ConnectionClosed):
            await ws.send(messages.encode(reply))

    async def _statuses(self, ws: ClientConnection, session: ConsoleSession) -> None:
        """A status every interval; skipped (not queued) while the previous one is
        still unsent, so a slow console costs nothing but missing statuses."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                started = loop.time()
                transport = ws.transport
                if transport is not None and transport.get_write_buffer_size() > 0:
                    self.statuses_skipped += 1
                    log.warning(
                        "console is not keeping up: status skipped (%d so far)",
                        self.statuses_skipped,
                    )
                else:
                    await ws.send(messages.encode(session.status()))
                interval = self.host.status_interval
                await asyncio.sleep(max(0.0, interval - (loop.time() - started)))
        except (asyncio.CancelledError, websockets.ConnectionClosed):
            raise
        except Exception:
            # a bug while building a status must not leave a silent link behind
            log.exception("console status failed; closing the link")
            await ws.close(1011, "broker error")


def tls_summary(ws: ClientConnection) -> str:
    """`` tls=TLSv1.3`` for a verified wss:// link, nothing for ws://."""
    transport = ws.transport
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    return f" tls={ssl_object.version()}" if ssl_object is not None else ""
