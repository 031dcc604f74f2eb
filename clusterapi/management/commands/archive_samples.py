"""``manage.py archive_samples``: the archive pass by hand (what beat runs hourly)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from clusterapi import archive


class Command(BaseCommand):
    help = "Move heartbeat and queue samples older than ARCHIVE_AFTER minutes into the lake."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=float,
            default=None,
            metavar="MINUTES",
            help="archive samples older than this many minutes (default: ARCHIVE_AFTER)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            cutoff = archive.archive_cutoff(minutes=options["older_than"])
            result = archive.archive_samples(cutoff)
        except (OSError, ValueError) as exc:
            raise CommandError(f"archive failed: {exc}") from exc
        self.stdout.write(json.dumps(result.as_dict(), indent=2))
