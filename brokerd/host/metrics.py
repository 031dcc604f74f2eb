"""One ``/metrics`` endpoint for a host of workers, each sample labelled ``worker``.

Each worker serves its own Prometheus exposition on a Unix socket in the host
directory (``DATA_DIR/host/worker-K.metrics``); the parent listens on
``--metrics-bind:--metrics-port`` and, for each scrape, asks every worker and
merges the answers: one ``# HELP`` and ``# TYPE`` per family, every family's
samples together (the text format wants them contiguous), each with
``worker="K"``. A worker that does not answer (restarting) is left out of that
scrape and counted in ``rookery_host_workers_unreachable``, so the endpoint
itself never fails for one worker's sake.

Plain threads: the parent runs no event loop, and a scrape is rare.
"""

from __future__ import annotations

import http.server
import logging
import socket
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("brokerd.host")

#: the longest a scrape waits for one worker (seconds)
WORKER_TIMEOUT = 2.0
#: the most a worker's exposition may hold (bytes): a bound on what the parent buffers
MAX_EXPOSITION = 32 * 1024 * 1024
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def label_sample(line: str, worker: int) -> str:
    """``name{a="b"} 1`` -> ``name{worker="K",a="b"} 1``; ``name 1`` -> ``name{worker="K"} 1``."""
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        rest = line[brace + 1 :]
        comma = "" if rest.startswith("}") else ","
        return f'{line[: brace + 1]}worker="{worker}"{comma}{rest}'
    if space == -1:
        return line
    return f'{line[:space]}{{worker="{worker}"}}{line[space:]}'


def merge_expositions(texts: dict[int, str]) -> str:
    """The workers' expositions as one, by family, every sample labelled by worker."""
    families: dict[str, list[str]] = {}
    headers: dict[str, list[str]] = {}
    for worker, text in sorted(texts.items()):
        family = ""
        for line in text.splitlines():
            if not line:
                continue
            if line.startswith("# "):
                parts = line.split(" ", 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    family = parts[2]
                    heads = headers.setdefault(family, [])
                    if not any(h.split(" ", 2)[1] == parts[1] for h in heads):
                        heads.append(line)
                    families.setdefault(family, [])
                continue
            families.setdefault(family, []).append(label_sample(line, worker))
    out: list[str] = []
    for family, samples in families.items():
        out += headers.get(family, [])
        out += samples
    return "\n".join(out) + "\n"


def scrape_worker(path: Path, timeout: float = WORKER_TIMEOUT) -> str | None:
    """One worker's exposition over its Unix socket, or None if it does not answer."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            sock.sendall(b"GET /metrics HTTP/1.0\r\nHost: worker\r\n\r\n")
            chunks: list[bytes] = []
            size = 0
            while chunk := sock.recv(1 << 16):
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_EXPOSITION:
                    return None
    except OSError:
        return None
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.0 200") and not head.startswith(b"HTTP/1.1 200"):
        return None
    return body.decode("utf-8", errors="replace")


class _Server(http.server.ThreadingHTTPServer):
    """The stdlib's threading HTTP server, on IPv6 when the address is one."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, handler)


class MetricsGateway:
    """The host's ``/metrics`` listener, in a thread of the supervising parent."""

    def __init__(self, bind: str, port: int, sockets: Callable[[], list[Path]]) -> None:
        self.sockets = sockets
        gateway = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404, "see /metrics")
                    return
                body = gateway.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return  # one line per scrape would drown the log

        self.httpd = _Server((bind, port), Handler)
        self.port = int(self.httpd.server_address[1])
        self._thread: threading.Thread | None = None

    def render(self) -> str:
        texts: dict[int, str] = {}
        unreachable = 0
        for index, path in enumerate(self.sockets()):
            text = scrape_worker(path)
            if text is None:
                unreachable += 1
            else:
                texts[index] = text
        merged = merge_expositions(texts)
        return merged + (
            "# HELP rookery_host_workers_unreachable Workers this scrape could not reach.\n"
            "# TYPE rookery_host_workers_unreachable gauge\n"
            f"rookery_host_workers_unreachable {unreachable}\n"
        )

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="metrics", daemon=True
        )
        self._thread.start()
        log.info("host metrics listening port=%d", self.port)

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
