"""Entry point of ``python -m brokerd.bench`` (see ``--help``)."""

from brokerd.bench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
