"""Versioned cluster configurations: validate, save, push, follow convergence.

A version is validated with brokerd's own rules (``brokerd.configdoc``), so a
document the console saves is one every broker can apply; it is stored
normalised with the checksum brokers ack with. Saving pushes ``config.apply``
to every known broker; a broker that was away gets the current version when
it says hello (:func:`reconcile`). Convergence is read from the per-broker
:class:`ConfigApplication` rows.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from brokerd.configdoc import ConfigDocumentError, document_checksum, validate_document
from clusterapi import alarms, audit, commands
from clusterapi.cluster import notify_dashboard
from clusterapi.errors import InvalidRequest
from clusterapi.models import Broker, Command, ConfigApplication, ConfigVersion

log = logging.getLogger(__name__)

COMMENT_MAX = 500


def validate(document: Any) -> tuple[dict[str, Any], str]:
    """The normalised document and its checksum, or InvalidRequest naming the bad key."""
    try:
        normalised = validate_document(document)
    except ConfigDocumentError as exc:
        raise InvalidRequest(str(exc)) from None
    return normalised, document_checksum(normalised)


def current() -> ConfigVersion | None:
    """The newest version: the one every broker should run."""
    return ConfigVersion.objects.order_by("-number").first()


def create_version(document: Any, user: Any, comment: str = "") -> ConfigVersion:
    """Validate and save a new version, then push it to every known broker.

    Role checks are the caller's (the API and dashboard allow operators only).
    """
    if not isinstance(comment, str):
        raise InvalidRequest("comment: must be text")
    if len(comment) > COMMENT_MAX:
        raise InvalidRequest(f"comment: at most {COMMENT_MAX} characters")
    normalised, checksum = validate(document)
    creator = audit.known_user(user)
    for attempt in range(5):
        try:
            with transaction.atomic():
                latest = ConfigVersion.objects.aggregate(n=Max("number"))["n"] or 0
                version = ConfigVersion.objects.create(
                    number=latest + 1,
                    document=normalised,
                    checksum=checksum,
                    comment=comment,
                    created_by=creator,
                )
                _supersede_older(version)
                audit.record(
                    user,
                    "config.push",
                    f"version {version.number}",
                    {"number": version.number, "checksum": checksum, "comment": comment},
                )
                for broker in Broker.objects.all():
                    push(broker, version, user)
                transaction.on_commit(lambda: notify_dashboard("config"))
            break
        except IntegrityError:
            if attempt == 4:
                raise
            log.info("configuration version number taken concurrently; retrying")
    log.info("configuration version %d saved (checksum %s)", version.number, checksum)
    return version


def _supersede_older(version: ConfigVersion) -> None:
    """Open ``config.apply`` commands and pending applications of older versions stop:
    a broker that gets them late must not go back to an older configuration."""
    reason = f"superseded by version {version.number}"
    now = timezone.now()
    Command.objects.filter(name=Command.CONFIG_APPLY, state__in=Command.OPEN_STATES).update(
        state=Command.STATE_FAILED, error=reason, finished_at=now
    )
    ConfigApplication.objects.filter(state=ConfigApplication.STATE_PENDING).exclude(
        version=version
    ).update(state=ConfigApplication.STATE_FAILED, error=reason)


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
    if broker.config_version == version.number and broker.config_checksum == version.checksum:
        ConfigApplication.objects.update_or_create(
            version=version,
            broker=broker,
            defaults={
                "state": ConfigApplication.STATE_ACKED,
                "checksum": version.checksum,
                "error": "",
            },
        )
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
        broker.config_version,
        version.number,
    )
    return push(broker, version, None)


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
    ConfigApplication.objects.update_or_create(
        version=version,
        broker=broker,
        defaults={"state": state, "checksum": checksum, "error": problem},
    )
    if ok:
        applied = result.get("config_version")
        Broker.objects.filter(pk=broker.pk).update(
            config_version=applied if isinstance(applied, int) else version.number,
            config_checksum=checksum,
        )
    if state == ConfigApplication.STATE_ACKED:
        if alarms.clear_alarm(alarms.CONFIG_FAILED, broker):
            notify_dashboard("alarm", broker.name)
    else:
        alarms.raise_alarm(
            alarms.CONFIG_FAILED, f"configuration version {version.number}: {problem}", broker
        )
        notify_dashboard("alarm", broker.name)
    notify_dashboard("config", broker.name)


def convergence(version: ConfigVersion) -> list[dict[str, Any]]:
    """Per known broker: whether it applied ``version`` (pending|acked|failed), with the
    checksum it acked and the error it gave."""
    applications = {a.broker_id: a for a in version.applications.all()}
    out = []
    for broker in Broker.objects.order_by("name"):
        application = applications.get(broker.pk)
        out.append(
            {
                "broker": broker.name,
                "state": application.state if application else ConfigApplication.STATE_PENDING,
                "checksum": application.checksum if application else "",
                "error": application.error if application else "",
            }
        )
    return out
