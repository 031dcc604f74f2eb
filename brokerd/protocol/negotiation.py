"""The connection handshake and channel-0 methods, as a part of ``Connection``.

Start/start-ok (the password check is an event the shell answers, see
``handshake.LoginCheck``), tune, open with the cluster's admission,
update-secret and close. Split from ``connection.py`` by concern; the
state lives on the ``Connection``.
"""

from __future__ import annotations

import enum
import logging
from typing import TYPE_CHECKING, Any

from pamqp import commands
from pamqp.base import Frame as Method

from brokerd.model.errors import (
    ACCESS_REFUSED,
    COMMAND_INVALID,
    NOT_ALLOWED,
    AMQPError,
    ConnectionError_,
)
from brokerd.protocol.handshake import (
    EXTERNAL,
    LoginCheck,
    mechanisms,
    parse_credentials,
    start_properties,
)
from brokerd.wire import codec
from brokerd.wire.codec import FRAME_MIN_SIZE

if TYPE_CHECKING:
    from brokerd.protocol.connection import Connection

log = logging.getLogger("brokerd.connection")


class ConnectionState(enum.Enum):
    AWAIT_HEADER = "awaiting protocol header"
    AWAIT_START_OK = "starting"
    AWAIT_LOGIN = "checking credentials"
    AWAIT_TUNE_OK = "tuning"
    AWAIT_OPEN = "opening"
    AWAIT_ADMISSION = "waiting for the cluster"
    OPEN = "running"
    CLOSING = "closing"
    CLOSED = "closed"


class Negotiation:
    """Channel-0 behaviour of :class:`~brokerd.protocol.connection.Connection`."""

    def _send_start(self: Connection) -> None:
        props = start_properties(self.server_properties)
        offered = mechanisms(self.certificate_login)
        self.send_method(0, commands.Connection.Start(0, 9, props, offered, "en_US"))
        self.state = ConnectionState.AWAIT_START_OK

    def _connection_method(self: Connection, method: Method) -> None:
        state = self.state
        if state is ConnectionState.AWAIT_START_OK:
            if not isinstance(method, commands.Connection.StartOk):
                raise ConnectionError_(
                    COMMAND_INVALID, f"expected connection.start-ok, got {method.name}"
                )
            self._on_start_ok(method)
        elif state is ConnectionState.AWAIT_TUNE_OK:
            if not isinstance(method, commands.Connection.TuneOk):
                raise ConnectionError_(
                    COMMAND_INVALID, f"expected connection.tune-ok, got {method.name}"
                )
            self._on_tune_ok(method)
        elif state is ConnectionState.AWAIT_OPEN:
            if not isinstance(method, commands.Connection.Open):
                raise ConnectionError_(
                    COMMAND_INVALID, f"expected connection.open, got {method.name}"
                )
            self._on_open(method)
        elif isinstance(method, commands.Connection.Close):
            self._flush_confirms()  # acks of earlier publishes precede close-ok
            log.info(
                "client close conn=%d peer=%s code=%s text=%r",
                self.id,
                self.name,
                method.reply_code,
                method.reply_text,
            )
            self.send_method(0, commands.Connection.CloseOk())
            self._finish_close()
        elif isinstance(method, commands.Connection.CloseOk):
            raise ConnectionError_(COMMAND_INVALID, "connection.close-ok without connection.close")
        elif isinstance(method, commands.Connection.UpdateSecret) and state is ConnectionState.OPEN:
            self._check_login(
                LoginCheck("update-secret", self.user.name, method.new_secret or "", self.peer[0])
            )
        else:
            raise ConnectionError_(COMMAND_INVALID, f"unexpected method {method.name} on channel 0")

    def _on_start_ok(self: Connection, method: commands.Connection.StartOk) -> None:
        self.client_properties = method.client_properties or {}
        caps = self.client_properties.get("capabilities")
        self.capabilities = caps if isinstance(caps, dict) else {}
        username, password = parse_credentials(
            method.mechanism, method.response, self.certificate_login
        )
        self.state = ConnectionState.AWAIT_LOGIN
        self._check_login(LoginCheck("login", username, password, self.peer[0], method.mechanism))

    def _check_login(self: Connection, check: LoginCheck) -> None:
        """Hand a password check to the shell (or, with none, run it here)."""
        self.login = check
        if self.on_login is not None:
            self.on_login(check)
            return
        users = self.broker.users
        if check.mechanism == EXTERNAL:
            user, reason = users.identify(check.username, self.peer[0])
        else:
            user, reason = users.authenticate(check.username, check.password, self.peer[0])
        self.complete_login(check, user, reason)

    def complete_login(self: Connection, check: LoginCheck, user: Any, reason: str) -> None:
        """The answer to ``check``: the user, or None and why (logged, never sent)."""
        if check is not self.login or self.state is ConnectionState.CLOSED:
            return  # the connection went away, or timed out, meanwhile
        self.login = None
        try:
            if check.kind == "update-secret":
                self._secret_updated(user, reason)
            else:
                self._logged_in(check, user, reason)
        except AMQPError as exc:
            self.connection_error(exc.reply_code, exc.text)
        if self.state is not ConnectionState.CLOSED:
            self._resume()

    def _secret_updated(self: Connection, user: Any, reason: str) -> None:
        # RabbitMQ 3.10's internal backend keeps no credential state and accepts any new
        # secret (pika's acceptance tests rely on it); the user and its rights stay the same
        if user is None:
            log.warning(
                "update-secret conn=%d peer=%s user=%s: the new secret does not verify (%s); "
                "the connection keeps its user and permissions",
                self.id,
                self.name,
                self.user.name,
                reason,
            )
        self.send_method(0, commands.Connection.UpdateSecretOk())

    def _logged_in(self: Connection, check: LoginCheck, user: Any, reason: str) -> None:
        if user is None:
            log.warning(
                "login refused conn=%d peer=%s mechanism=%s reason=%s",
                self.id,
                self.name,
                check.mechanism,
                reason,
            )
            text = (
                f"Login was refused using authentication mechanism {check.mechanism}. "
                "For details see the broker logfile."
            )
            if self.hooks is not None:
                self.hooks.login_refused(self, reason)
            if self.capabilities.get("authentication_failure_close"):
                self.send_method(
                    0, commands.Connection.Close(ACCESS_REFUSED, f"ACCESS_REFUSED - {text}", 0, 0)
                )
            self.state = ConnectionState.CLOSED
            return
        self.user = user
        limits = self.broker.limits
        self.send_method(
            0, commands.Connection.Tune(limits.channel_max, limits.frame_max, limits.heartbeat)
        )
        self.state = ConnectionState.AWAIT_TUNE_OK

    def _on_tune_ok(self: Connection, method: commands.Connection.TuneOk) -> None:
        limits = self.broker.limits
        frame_max = method.frame_max or limits.frame_max
        if frame_max < FRAME_MIN_SIZE:
            raise ConnectionError_(
                NOT_ALLOWED, f"frame_max={frame_max} < {FRAME_MIN_SIZE} min size"
            )
        if frame_max > limits.frame_max:
            raise ConnectionError_(
                NOT_ALLOWED, f"frame_max={frame_max} > {limits.frame_max} max size"
            )
        channel_max = method.channel_max or limits.channel_max
        if channel_max > limits.channel_max:
            raise ConnectionError_(
                NOT_ALLOWED, f"channel_max={channel_max} > {limits.channel_max} max"
            )
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = method.heartbeat
        self.state = ConnectionState.AWAIT_OPEN

    def _on_open(self: Connection, method: commands.Connection.Open) -> None:
        name = method.virtual_host or "/"
        vhost = self.broker.vhosts.get(name)
        if vhost is None:
            raise ConnectionError_(NOT_ALLOWED, f"vhost {name} not found")  # RabbitMQ's wording
        if not self.broker.users.can_access_vhost(self.user.name, name):
            raise ConnectionError_(
                NOT_ALLOWED, f"access to vhost '{name}' refused for user '{self.user.name}'"
            )
        self.vhost = vhost
        self._try_admit()

    def _try_admit(self: Connection) -> None:
        """Ask the hooks whether this connection may start now."""
        decision = self.hooks.admit(self) if self.hooks is not None else None
        if decision is not None:
            if self._admission is None:
                log.info(
                    "open waiting conn=%d peer=%s reason=%s", self.id, self.name, decision.reason
                )
                self._admission_deadline = self.clock() + decision.timeout
            self._admission = decision
            self.state = ConnectionState.AWAIT_ADMISSION
            return
        self._admission = None
        # a link the cluster admitted (it checked the cluster user and vhost); anything
        # else claiming to be one in client properties is an ordinary client
        self.cluster_link = self.hooks is not None and isinstance(
            self.client_properties.get("rookery_link"), dict
        )
        if self.cluster_link:
            # a link carries what unblocks everyone: publishers blocked while it was
            # still opening (it looked like any client then) must not hold its lanes
            self.blocked_reason = None
        else:
            self.broker.open_connection(self.vhost.name, self.user.name)  # or 530
            self.counted = True
        known_hosts = self.hooks.known_hosts() if self.hooks is not None else ""
        self.write(codec.open_ok_frame(known_hosts))
        self.state = ConnectionState.OPEN
        name = self.vhost.name
        log.info(
            "open conn=%d peer=%s user=%s vhost=%s client=%s heartbeat=%d frame_max=%d",
            self.id,
            self.name,
            self.user.name,
            name,
            self.client_properties.get("product", "?"),
            self.heartbeat,
            self.frame_max,
        )

    def readmit(self: Connection) -> None:
        """The hooks' answer may have changed (a root appeared): try again."""
        if self.state is not ConnectionState.AWAIT_ADMISSION:
            return
        try:
            self._try_admit()
        except AMQPError as exc:
            self.connection_error(exc.reply_code, exc.text)
            return
        if self.state is ConnectionState.OPEN:
            self._resume()
