#!/usr/bin/env python
"""Django's command-line utility for the Rookery console."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    try:
        from django.core.management import execute_from_command_line
    except ImportError as exc:
        raise ImportError(
            "Couldn't import Django. Is it installed and is the virtual environment "
            "(.venv, made by 'make setup') active?"
        ) from exc
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
