"""Live pages: a websocket per open page, pushing its re-rendered fragments.

The page connects to ``/ws/dashboard/?page=<name>&<its query parameters>``
(htmx ws extension). The consumer joins the ``dashboard`` group; each
``dashboard.changed`` event (a status, a command, an alarm, a configuration)
marks the page dirty, and one task renders the page's fragments and sends them
as one HTML message, the ws extension swapping each by id. A burst of events
(every broker reports every heartbeat) costs one render: at most one every
``MIN_INTERVAL`` seconds per page.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.http import QueryDict
from django.template.loader import render_to_string

from clusterapi.cluster import DASHBOARD_GROUP, keep_in_group
from clusterapi.roles import is_operator
from console.dashboard.pages import PAGES, Page

log = logging.getLogger(__name__)

#: seconds between two renders of one page (a few updates per second at most)
MIN_INTERVAL = 0.3
#: close codes: not logged in; no such page
CLOSE_UNAUTHENTICATED = 4401
CLOSE_UNKNOWN_PAGE = 4404


#: a relative time's text ("3 s ago"): the page's script keeps it current by itself
_AGO_TEXT = re.compile(r'(<time [^>]*class="ago"[^>]*>)[^<]*(</time>)')


def _steady(fragment: str) -> str:
    """What a fragment shows apart from the passing of time (compared, not sent)."""
    return _AGO_TEXT.sub(r"\1\2", fragment)


def render_fragments(page: Page, params: QueryDict, can_operate: bool) -> list[str]:
    """The page's fragments, rendered: a live message carries those that changed."""
    context = page.context(params)
    context.update(can_operate=can_operate, live=True)
    return [render_to_string(name, context) for name in page.fragments]


class DashboardConsumer(AsyncWebsocketConsumer):
    """One open dashboard page (login required)."""

    page: Page | None = None
    params: QueryDict
    can_operate = False
    dirty = False
    last_sent = 0.0
    #: what each fragment last looked like on the page: an unchanged one is not sent
    #: again (swapping it would replace the elements a user is about to click)
    shown: list[str] | None = None
    flusher: asyncio.Task[None] | None = None
    #: re-joins the dashboard group while the page is open (memberships expire)
    member: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        params = QueryDict(self.scope.get("query_string", b"").decode("latin-1"))
        page = PAGES.get(params.get("page", ""))
        if page is None:
            await self.close(code=CLOSE_UNKNOWN_PAGE)
            return
        self.page, self.params = page, params
        # reads of their own, off the thread the brokers' statuses are written in: a
        # console back from a restart takes every broker's full status at once, and an
        # open page must not wait behind them to be live again (issue 45)
        self.can_operate = await database_sync_to_async(is_operator, thread_sensitive=False)(user)
        await self.channel_layer.group_add(DASHBOARD_GROUP, self.channel_name)
        self.member = asyncio.ensure_future(
            keep_in_group(self.channel_layer, DASHBOARD_GROUP, self.channel_name)
        )
        await self.accept()
        # Whatever changed between the page's GET and this connection shows at once.
        self.mark_dirty()

    async def disconnect(self, code: int) -> None:
        if self.member is not None:
            self.member.cancel()
        if self.page is not None:
            await self.channel_layer.group_discard(DASHBOARD_GROUP, self.channel_name)
        if self.flusher is not None:
            self.flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.flusher

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Pages send nothing; anything received is ignored."""

    async def dashboard_changed(self, event: dict[str, Any]) -> None:
        self.mark_dirty()

    def mark_dirty(self) -> None:
        self.dirty = True
        if self.flusher is None or self.flusher.done():
            self.flusher = asyncio.ensure_future(self.flush())

    async def flush(self) -> None:
        """Render and send while dirty, never sooner than ``MIN_INTERVAL`` after the last."""
        assert self.page is not None
        while self.dirty:
            wait = self.last_sent + MIN_INTERVAL - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self.dirty = False
            try:
                fragments = await database_sync_to_async(render_fragments, thread_sensitive=False)(
                    self.page, self.params, self.can_operate
                )
            except Exception:
                log.exception("live page %s: render failed", self.page.name)
                continue
            seen = [_steady(f) for f in fragments]
            shown = self.shown or [""] * len(fragments)
            html = "".join(
                new for new, now, was in zip(fragments, seen, shown, strict=True) if now != was
            )
            self.shown = seen
            if html:
                self.last_sent = time.monotonic()
                await self.send(text_data=html)
