"""Versioned cluster configurations: validate, save, push, push again.

A version is a complete document: every key it lacks means the broker's own
setting (its ``brokerd.toml`` and cluster file), never "what an earlier version
left", so a version means the same on every broker, restarted or not. It is
validated with brokerd's own rules (``brokerd.configdoc``) and stored
normalised with its checksum. There is one version per distinct document:
saving the current document again changes nothing, and saving the document of
an older version pushes that version again. The current version is the one
pushed last (``push_serial``); pushing sends ``config.apply`` to every broker
that is not down, and a broker that was away gets it when it says hello
(:func:`reconcile`). Whether brokers run it is what they report in every status
(:mod:`clusterapi.convergence`), not what they once acknowledged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from brokerd.configdoc import (
    DOCUMENT_KEYS,
    ConfigDocumentError,
    document_checksum,
    validate_document,
)
from clusterapi import alarms, audit, commands, convergence, passwords
from clusterapi.cluster import notify_dashboard
from clusterapi.errors import Conflict, InvalidDocument, InvalidRequest
from clusterapi.models import Broker, Command, ConfigApplication, ConfigVersion

log = logging.getLogger(__name__)

COMMENT_MAX = 500

#: what saving a document did
CREATED = "created"
UNCHANGED = "unchanged"
REPUSHED = "repushed"


@dataclass(frozen=True)
class Saved:
    """The version a save or push ended on, and what happened (created|unchanged|repushed)."""

    version: ConfigVersion
    outcome: str


def validate(document: Any) -> tuple[dict[str, Any], str]:
    """The normalised document and its checksum, or InvalidDocument naming the bad key.

    A user given without a password hash keeps the current version's for that name:
    hashes are write-only (``clusterapi.passwords``), so documents come back without."""
    latest = current()
    document = passwords.kept(document, latest.document if latest is not None else None)
    field = passwords.hidden_uri(document)
    if field is not None:
        raise InvalidDocument(
            f"{field}: the password is hidden ({passwords.REDACTED}) and no earlier version "
            "of this bridge has it: give it in full"
        )
    try:
        normalised = validate_document(document)
    except ConfigDocumentError as exc:
        raise InvalidDocument(str(exc)) from None
    return normalised, document_checksum(normalised)


def current() -> ConfigVersion | None:
    """The version every broker should run: the one pushed last."""
    return ConfigVersion.objects.current()


def derive(changes: Any) -> dict[str, Any]:
    """The current document with ``changes`` made: each top-level key given replaces
    that part, a key given as null is removed (back to the brokers' own setting).
    This is how a new version starts from the current one in the API."""
    if not isinstance(changes, dict):
        raise InvalidRequest("changes: must be an object of top-level keys")
    unknown = sorted(set(changes) - set(DOCUMENT_KEYS))
    if unknown:
        raise InvalidDocument(
            f"changes.{unknown[0]}: unknown key (known: {', '.join(DOCUMENT_KEYS)})"
        )
    version = current()
    document = dict(version.document) if version is not None else {}
    for key, value in changes.items():
        if value is None:
            document.pop(key, None)
        else:
            document[key] = value
    return document


def save(document: Any, user: Any, comment: str = "", base: int | None = None) -> Saved:
    """Make ``document`` the current configuration and push it where needed.

    A document equal to the current one changes nothing (``unchanged``); equal to an
    older version, that version is pushed again (``repushed``); otherwise it becomes
    a new version (``created``). ``base``, when given, must be the current version's
    number (the version the caller's edit started from), else :class:`Conflict`.
    Role checks are the caller's (the API and dashboard allow operators only).
    """
    if not isinstance(comment, str):
        raise InvalidRequest("comment: must be text")
    if len(comment) > COMMENT_MAX:
        raise InvalidRequest(f"comment: at most {COMMENT_MAX} characters")
    normalised, checksum = validate(document)
    for attempt in range(5):
        try:
            with transaction.atomic():
                latest = current()
                if base is not None and (latest.number if latest else None) != base:
                    now = f"version {latest.number}" if latest else "no version"
                    raise Conflict(
                        f"base: the current configuration is {now}, not version {base}; "
                        "start again from the current one"
                    )
                if latest is not None and latest.checksum == checksum:
                    return Saved(latest, UNCHANGED)
                same = ConfigVersion.objects.filter(checksum=checksum).order_by("-number").first()
                if same is not None:
                    _push_everywhere(same, user, comment)
                    return Saved(same, REPUSHED)
                number = (ConfigVersion.objects.aggregate(n=Max("number"))["n"] or 0) + 1
                version = ConfigVersion.objects.create(
                    number=number,
                    document=normalised,
                    checksum=checksum,
                    comment=comment,
                    created_by=audit.known_user(user),
                )
                _push_everywhere(version, user, comment, created=True)
            log.info("configuration version %d saved (checksum %s)", version.number, checksum)
            return Saved(version, CREATED)
        except IntegrityError:
            if attempt == 4:
                raise
            log.info("configuration version or push number taken concurrently; retrying")
    raise AssertionError("unreachable")


def repush(version: ConfigVersion, user: Any, comment: str = "") -> Saved:
    """Push ``version`` again to every broker that is not down, making it current:
    the way back to an older configuration, or to a broker that drifted."""
    if len(comment) > COMMENT_MAX:
        raise InvalidRequest(f"comment: at most {COMMENT_MAX} characters")
    for attempt in range(5):
        try:
            with transaction.atomic():
                _push_everywhere(version, user, comment)
            return Saved(version, REPUSHED)
        except IntegrityError:
            if attempt == 4:
                raise
    raise AssertionError("unreachable")


def _push_everywhere(
    version: ConfigVersion, user: Any, comment: str, created: bool = False
) -> None:
    """Give ``version`` the next push serial, stop older pushes, push to every broker
    that is up (a down one gets it on hello), audit. Inside the caller's transaction."""
    serial = (ConfigVersion.objects.aggregate(n=Max("push_serial"))["n"] or 0) + 1
    version.push_serial = serial
    version.pushed_at = timezone.now()
    version.save(update_fields=["push_serial", "pushed_at"])
    _supersede_older(version)
    audit.record(
        user,
        "config.push" if created else "config.repush",
        f"version {version.number}",
        {"number": version.number, "checksum": version.checksum, "comment": comment},
    )
    for broker in Broker.objects.active().exclude(state__in=Broker.NOT_RUNNING_STATES):
        push(broker, version, user)
    transaction.on_commit(lambda: notify_dashboard("config"))


def _supersede_older(version: ConfigVersion) -> None:
    """Open ``config.apply`` commands of earlier pushes stop, shown as superseded (not
    failed): a broker that gets one late must not go back to an older configuration."""
    reason = f"superseded by the push of version {version.number}"
    now = timezone.now()
    Command.objects.filter(name=Command.CONFIG_APPLY, state__in=Command.OPEN_STATES).update(
        state=Command.STATE_SUPERSEDED, error=reason, finished_at=now
    )
    ConfigApplication.objects.filter(state=ConfigApplication.STATE_PENDING).update(
        state=ConfigApplication.STATE_SUPERSEDED, error=reason
    )


def push(broker: Broker, version: ConfigVersion, user: Any) -> Command:
    """Send ``version`` to one broker: a pending application and a ``config.apply``."""
    ConfigApplication.objects.update_or_create(
        version=version,
        broker=broker,
        defaults={"state": ConfigApplication.STATE_PENDING, "checksum": "", "error": ""},
    )
    return commands.issue(broker, Command.CONFIG_APPLY, {"version": version.number}, user)


def reconcile(broker: Broker) -> Command | None:
    """After a broker's hello: push the current version unless it runs it already."""
    version = current()
    if version is None:
        return None
    if broker.config_checksum == version.checksum:
        convergence.check_drift(broker, version)
        return None
    waiting = Command.objects.filter(
        broker=broker,
        name=Command.CONFIG_APPLY,
        state__in=Command.OPEN_STATES,
        args__version=version.number,
    ).exists()
    if waiting:
        return None  # the delivery sweep sends it now that the broker is connected
    log.info(
        "broker %s runs configuration %s; pushing version %d",
        broker.name,
        broker.config_version or "of its own files",
        version.number,
    )
    return push(broker, version, None)


@commands.on_ack(Command.CONFIG_APPLY)
def record_ack(command: Command, ok: bool, result: Any, error: str | None) -> None:
    """A broker answered ``config.apply``: update its application row and alarms."""
    number = command.args.get("version")
    version = ConfigVersion.objects.filter(number=number).first()
    broker = command.broker
    if version is None:
        return
    result = result if isinstance(result, dict) else {}
    checksum = str(result.get("config_checksum") or "")[:64]
    if ok and checksum == version.checksum:
        state, problem = ConfigApplication.STATE_ACKED, ""
    elif ok:
        state = ConfigApplication.STATE_FAILED
        problem = f"the broker applied checksum {checksum or '(none)'}, expected {version.checksum}"
    else:
        state, problem = ConfigApplication.STATE_FAILED, error or "refused"
    if command.state != Command.STATE_SUPERSEDED:
        ConfigApplication.objects.update_or_create(
            version=version,
            broker=broker,
            defaults={"state": state, "checksum": checksum, "error": problem},
        )
    if ok:
        # what it runs now; its next status says the same (or what changed since)
        applied = result.get("config_version")
        Broker.objects.filter(pk=broker.pk).update(
            config_version=applied if isinstance(applied, int) else version.number,
            config_checksum=checksum,
        )
        broker.refresh_from_db(fields=["config_version", "config_checksum"])
    if state == ConfigApplication.STATE_ACKED:
        alarms.clear_alarm(alarms.CONFIG_FAILED, broker)
    elif command.state != Command.STATE_SUPERSEDED:
        alarms.raise_alarm(
            alarms.CONFIG_FAILED, f"configuration version {version.number}: {problem}", broker
        )
    convergence.check_drift(broker)
    notify_dashboard("alarm", broker.name)
    notify_dashboard("config", broker.name)
