"""Write a CA and a loopback server certificate for a comparison broker's TLS port.

    python -m tests.compat.make_certs DIR

The same certificates ``run_compat --tls`` makes for brokerd
(``tests.support.certs.Pki``: trustme, server certificate for 127.0.0.1, ::1
and localhost), as PEM files in DIR, for RabbitMQ's ``ssl_options``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.support.certs import Pki


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    pki = Pki(Path(args[0]).resolve(), name="rookery-compat")
    server = pki.server()
    for file in (pki.cafile, server.certfile, server.keyfile):
        file.chmod(0o644)  # a broker running as another user must read them
    print(f"cacertfile = {pki.cafile}")
    print(f"certfile = {server.certfile}")
    print(f"keyfile = {server.keyfile}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
