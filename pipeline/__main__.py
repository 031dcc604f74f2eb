"""``python -m pipeline generate|report ...``."""

from pipeline.cli import main

raise SystemExit(main())
