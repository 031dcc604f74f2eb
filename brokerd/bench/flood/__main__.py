"""Entry point of ``python -m brokerd.bench.flood`` (see ``--help``)."""

from brokerd.bench.flood.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
