"""``make run``'s settings, from the environment (deploy/quickstart.py's docstring lists
them): data directory, ports, Redis, the first administrator, the console's broker
token and TLS; where the run keeps its state files; and the checks that refuse a
bad value with what to do."""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from quickstart_supervisor import HOST

from console.environment import ascii_int

REPO = Path(__file__).resolve().parents[1]
BROKER_NAMES = ("primary1", "primary2", "primary3", "secondary")


class QuickstartError(Exception):
    """Something prevents the quickstart from running; the message says what to do."""


def _port(name: str, raw: str) -> int:
    try:
        port = ascii_int(raw)
    except ValueError:
        raise QuickstartError(f"{name}={raw!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise QuickstartError(f"{name}={raw!r} is not a port number (1-65535)")
    return port


@dataclass(frozen=True)
class QuickstartConfig:
    """What the environment asks for; see the module docstring."""

    data_dir: Path
    console_port: int
    broker_ports: tuple[int, ...]
    redis_port: int
    redis_url: str | None
    admin_user: str
    admin_password: str | None
    broker_token: str | None
    celery_loglevel: str
    #: ROOKERY_TLS=1: everything over TLS with a throwaway CA in DATA_DIR/tls
    tls: bool = False

    @classmethod
    def from_env(cls, environ: dict[str, str] | os._Environ[str]) -> QuickstartConfig:
        def get(name: str, default: str = "") -> str:
            return environ.get(name, "").strip() or default

        data_dir = Path(get("DATA_DIR", "var")).expanduser()
        if not data_dir.is_absolute():
            data_dir = REPO / data_dir
        raw_ports = get("ROOKERY_BROKER_PORTS", "5701,5702,5703,5704")
        broker_ports = tuple(
            _port("ROOKERY_BROKER_PORTS", p.strip()) for p in raw_ports.split(",") if p.strip()
        )
        if len(broker_ports) != len(BROKER_NAMES):
            raise QuickstartError(
                f"ROOKERY_BROKER_PORTS={raw_ports!r}: give {len(BROKER_NAMES)} ports "
                "(three primaries, then the secondary)"
            )
        config = cls(
            data_dir=data_dir.resolve(),
            console_port=_port("ROOKERY_CONSOLE_PORT", get("ROOKERY_CONSOLE_PORT", "8000")),
            broker_ports=broker_ports,
            redis_port=_port("ROOKERY_REDIS_PORT", get("ROOKERY_REDIS_PORT", "6390")),
            redis_url=get("REDIS_URL") or None,
            admin_user=get("ROOKERY_ADMIN_USER", "admin"),
            admin_password=environ.get("ROOKERY_ADMIN_PASSWORD") or None,
            broker_token=get("CONSOLE_BROKER_TOKEN") or None,
            celery_loglevel=get("ROOKERY_CELERY_LOGLEVEL", "WARNING").upper(),
            tls=get("ROOKERY_TLS", "0").lower() in ("1", "true", "yes", "on"),
        )
        ports = config.listen_ports()
        if len(set(ports.values())) != len(ports):
            raise QuickstartError(f"the ports must all differ: {ports}")
        return config

    def listen_ports(self) -> dict[str, int]:
        """Every port this run listens on, by the process that owns it."""
        ports = {"console": self.console_port}
        ports.update(zip(BROKER_NAMES, self.broker_ports, strict=True))
        if self.redis_url is None:
            ports["redis"] = self.redis_port
        return ports

    @property
    def console_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{HOST}:{self.console_port}/"

    @property
    def tls_dir(self) -> Path:
        return self.data_dir / "tls"

    @property
    def password_file(self) -> Path:
        return self.data_dir / "admin-password"

    @property
    def token_file(self) -> Path:
        return self.data_dir / "console-broker-token"

    @property
    def cluster_file(self) -> Path:
        return self.data_dir / "cluster.toml"

    @property
    def control_socket(self) -> Path:
        """Where ``ctl`` reaches the running quickstart (``quickstart_control``)."""
        return self.data_dir / "quickstart.sock"

    def ctl_command(self) -> str:
        """The command line an operator runs, from the checkout, to reach this run."""
        python = Path(sys.executable)
        shown = os.path.relpath(python, REPO) if python.is_relative_to(REPO) else str(python)
        command = f"{shlex.quote(shown)} deploy/quickstart.py ctl"
        if self.data_dir != (REPO / "var").resolve():
            command = f"DATA_DIR={shlex.quote(str(self.data_dir))} {command}"
        return command
