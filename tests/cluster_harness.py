"""A loopback cluster of real brokerd processes: the one the cluster tests, the
console stack (tests/console_stack.py), the fault harness and the tools use.

    cluster = Cluster(tmp_path, primaries=3, secondaries=2)
    try:
        cluster.start_all()                   # oldest first, staggered: seniority is defined
        root = cluster.wait_until(cluster.settled_root)
        cluster.kill(0)                       # SIGKILL; pause()/resume() are SIGSTOP/SIGCONT
    finally:
        cluster.close()                       # SIGCONT the paused ones, then stop everything

Every server gets the same cluster file (``Cluster.file``) unless a test
passes another one to ``start``. Statuses are read over each server's
control socket with a short timeout, so a stopped or dead server is simply
missing from a sample. ``Sampler`` polls every answering server in the
background and records each sample, so a test can check a safety property
(never two roots with quorum) over the whole run, not just at the end.
"""

from __future__ import annotations

import contextlib
import functools
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from brokerd.model.auth import hash_password
from brokerd.server.control import request
from tests.brokerd_process import BrokerProcess, free_port
from tests.support.certs import Pki
from tests.support.eventually import eventually
from tests.support.netbed import NetBed
from tests.support.sampler import View, brief
from tests.support.slowlink import SlowLink

INTERVAL = 0.3
TIMEOUT = 1.0
OPEN_TIMEOUT = 5.0
SECRET = "cluster-secret-123"

#: what the ``make_cluster`` fixture (tests/integration/conftest.py) hands a test
MakeCluster = Callable[..., "Cluster"]
ROOT_EVENT = re.compile(r"^(\S+ \S+) WARNING brokerd\.cluster: root (taken|released) spid=(\S+)")


def write_cluster_file(
    path: Path,
    ports: Iterable[int | str],
    *,
    secret: str = SECRET,
    name: str = "test",
    interval: float = INTERVAL,
    timeout: float = TIMEOUT,
    open_timeout: float = OPEN_TIMEOUT,
    tls: str = "",
) -> Path:
    """The shared TOML file; ``ports`` may also hold whole ``host:port`` strings;
    ``tls`` is a ``[tls]`` table to append (links over mutual TLS)."""
    hosts = ", ".join(f'"{p}"' if isinstance(p, str) else f'"127.0.0.1:{p}"' for p in ports)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f'name = "{name}"\n'
        f'secret = "{secret}"\n'
        f"known_hosts = [{hosts}]\n"
        "[heartbeat]\n"
        f"interval = {interval}\n"
        f"timeout = {timeout}\n"
        f"open_timeout = {open_timeout}\n" + tls
    )
    return path


@dataclass
class Node:
    index: int
    kind: str
    port: int
    #: the data directory of every process of this node
    home: Path
    #: the AMQPS port (clusters whose links run over TLS: the known-host address)
    tls_port: int | None = None
    #: the common name of the certificate the cluster file gives that port (it stays
    #: with the port when ``start_all`` renumbers the nodes by seniority)
    tls_name: str | None = None
    process: BrokerProcess | None = None
    spid: str | None = None
    paused: bool = False
    #: its address: loopback, or on a network test bed its namespace's (``bed_slot``:
    #: which of the bed's namespaces; it stays with the node when ``start_all``
    #: renumbers the nodes by seniority)
    host: str = "127.0.0.1"
    bed_slot: int | None = None
    #: the proxy every other server's link to it passes through (``slow_links``)
    slow: SlowLink | None = None
    #: stopped and forgotten by the cluster for good (``brokerd ctl cluster forget``):
    #: never restarted, no fault's target; its log is kept
    retired: bool = False
    #: wall-clock times (time.time()) at which a process of this node was paused or ended
    paused_at: list[float] = field(default_factory=list)
    ended_at: dict[str, float] = field(default_factory=dict)

    @property
    def data_dir(self) -> Path:
        assert self.process is not None
        return self.process.data_dir

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()

    def answering(self) -> bool:
        return self.alive() and not self.paused


class Cluster:
    """``primaries`` known hosts (indexes 0..primaries-1) and ``secondaries`` after them."""

    @classmethod
    @contextlib.contextmanager
    def temporary(cls, prefix: str, *args: Any, **kwargs: Any) -> Iterator[Cluster]:
        """A cluster in a temporary directory (for tools), stopped and removed after."""
        base = Path(tempfile.mkdtemp(prefix=prefix))
        cluster = cls(base, *args, **kwargs)
        try:
            yield cluster
        finally:
            cluster.close()
            shutil.rmtree(base, ignore_errors=True)

    def __init__(
        self,
        base: Path,
        primaries: int = 3,
        secondaries: int = 0,
        *,
        interval: float = INTERVAL,
        timeout: float = TIMEOUT,
        open_timeout: float = OPEN_TIMEOUT,
        secret: str = SECRET,
        fault_injection: bool = True,
        tls: bool = False,
        netbed: NetBed | None = None,
        slow_links: bool = False,
    ) -> None:
        self.base = base
        #: each server in its own network namespace (tests/support/netbed.py), or None
        self.netbed = netbed
        self.base.mkdir(parents=True, exist_ok=True)
        self.interval = interval
        self.timeout = timeout
        self.fault_injection = fault_injection
        self.nodes = [
            Node(i, "primary" if i < primaries else "secondary", free_port(), base / f"n{i}")
            for i in range(primaries + secondaries)
        ]
        #: brokerd.toml for every server (None: RabbitMQ's defaults)
        self.config_file: Path | None = None
        if netbed is not None:
            if tls:
                raise ValueError("a test bed cluster runs plain links")
            for node in self.nodes:
                node.bed_slot = node.index
                node.host = netbed.address(node.index)
            # clients come from the bed's gateway, not from loopback: guest may too
            self.config_file = base / "brokerd.toml"
            self.config_file.write_text(
                '[[vhosts]]\nname = "/"\n\n[[users]]\nname = "guest"\n'
                f'password_hash = "{hash_password("guest")}"\n'
                'tags = ["administrator"]\nloopback_only = false\n\n'
                '[[permissions]]\nuser = "guest"\nvhost = "/"\n'
                'configure = ".*"\nwrite = ".*"\nread = ".*"\n'
            )
        #: links over mutual TLS: the cluster CA (tests/support/certs), else None
        self.pki: Pki | None = None
        tls_table = ""
        if tls:
            self.pki = Pki(base / "pki", name="cluster")
            tls_table = self._tls_table(self.pki)
        if slow_links:
            # the known hosts are proxies (tests/support/slowlink.py): every link to a
            # primary passes through its own, which the nemesis slows or stalls
            if tls:
                raise ValueError("slow links carry plain links")
            # on the test bed each proxy is in its server's namespace, on its address:
            # a cut drops the proxied links too, as it would on a real network
            for node in self.nodes[:primaries]:
                namespace = None
                if netbed is not None and node.bed_slot is not None:
                    namespace = netbed.namespace(node.bed_slot)
                node.slow = SlowLink((node.host, 0), (node.host, node.port), namespace).start()
        known = [
            f"{n.slow.address[0]}:{n.slow.address[1]}"
            if n.slow is not None
            else f"{n.host}:{n.tls_port or n.port}"
            for n in self.nodes[:primaries]
        ]
        self.file = write_cluster_file(
            base / "cluster.toml",
            known,
            secret=secret,
            interval=interval,
            timeout=timeout,
            open_timeout=open_timeout,
            tls=tls_table,
        )

    def _tls_table(self, pki: Pki) -> str:
        """Every node gets an AMQPS port and a certificate of its own; servers the
        table does not name (secondaries added later) use the default one."""
        default = pki.server("default")
        table = (
            '[tls]\nlinks = "required"\n'
            f'cafile = "{pki.cafile}"\ncertfile = "{default.certfile}"\n'
            f'keyfile = "{default.keyfile}"\n'
        )
        for node in self.nodes:
            node.tls_port = free_port()
            node.tls_name = f"n{node.index}"
            files = pki.issue(node.tls_name, "127.0.0.1", common_name=node.tls_name)
            table += (
                f'[tls.servers."127.0.0.1:{node.tls_port}"]\n'
                f'certfile = "{files.certfile}"\nkeyfile = "{files.keyfile}"\n'
            )
        return table

    @property
    def primary_ports(self) -> list[int]:
        """The primaries' AMQP ports, by index."""
        return [n.port for n in self.nodes if n.kind == "primary"]

    @property
    def ports(self) -> list[int]:
        """Every node's AMQP port, by index."""
        return [n.port for n in self.nodes]

    @property
    def endpoints(self) -> list[tuple[str, int]]:
        """Every node's AMQP address, (host, port), by index."""
        return [(n.host, n.port) for n in self.nodes]

    @property
    def primary_endpoints(self) -> list[tuple[str, int]]:
        return [(n.host, n.port) for n in self.nodes if n.kind == "primary"]

    def address(self, index: int) -> str:
        """A node's ``host:port``, as the cluster (known hosts, quorum groups) names it."""
        node = self.nodes[index]
        return f"{node.host}:{node.tls_port or node.port}"

    @property
    def servers(self) -> dict[int, BrokerProcess]:
        """The process of every node started so far, by index."""
        return {n.index: n.process for n in self.nodes if n.process is not None}

    # -- processes ---------------------------------------------------------------

    def add_secondary(self) -> int:
        """Room for one more secondary (not in known_hosts); returns its index."""
        index = len(self.nodes)
        node = Node(index, "secondary", free_port(), self.base / f"n{index}")
        if self.pki is not None:
            node.tls_port = free_port()
        self.nodes.append(node)
        return len(self.nodes) - 1

    def add_primary(self) -> int:
        """Room for one more primary, not in the cluster file's known hosts (it joins
        with ``--join`` or discovery); returns its index."""
        if self.netbed is not None:
            raise ValueError("a joining primary runs on loopback")
        index = len(self.nodes)
        node = Node(index, "primary", free_port(), self.base / f"n{index}")
        if self.pki is not None:  # links over TLS: the file's default certificate
            node.tls_port = free_port()
        self.nodes.append(node)
        return index

    def start(
        self, index: int, *, file: Path | None = None, extra: list[str] | None = None
    ) -> Node:
        """Start one server and wait until its control socket answers (its spid is known)."""
        self._spawn(index, file=file, extra=extra)
        return self._await(index)

    def _spawn(
        self, index: int, *, file: Path | None = None, extra: list[str] | None = None
    ) -> None:
        node = self.nodes[index]
        args = ["--cluster", str(file or self.file), "--type", node.kind]
        if self.fault_injection:
            args.append("--enable-fault-injection")
        if node.tls_port is not None:
            args += ["--tls-port", str(node.tls_port)]
        if self.config_file is not None:
            args += ["--config", str(self.config_file)]
        wrap = None
        if self.netbed is not None and node.bed_slot is not None:
            wrap = functools.partial(self.netbed.wrap, node.bed_slot)
        node.process = BrokerProcess(
            node.home,
            port=node.port,
            extra_args=[*args, *(extra or [])],
            host=node.host,
            wrap=wrap,
        )
        node.paused = False
        node.process.spawn()

    def _await(self, index: int) -> Node:
        node = self.nodes[index]
        assert node.process is not None
        node.process.wait_listening()
        view = self.wait_until(lambda: self.status(index), timeout=10, what=f"status of {index}")
        node.spid = view["spid"]
        return node

    def start_all(self, indexes: Iterable[int] | None = None, stagger: float = 0.15) -> None:
        """Start servers, oldest first: seniority follows the index.

        Servers never started before are spawned ``stagger`` apart without waiting
        for each other, so their imports overlap and a cluster is up in about half
        the time. A spid's start time is taken after the imports, so a younger
        process may overtake an older one: the nodes of one kind are then renumbered
        by seniority (each keeps its port and data directory), which is what a
        one-by-one start would have given.
        """
        wanted = list(indexes) if indexes is not None else list(range(len(self.nodes)))
        if len(wanted) < 2 or any(
            self.nodes[i].process is not None or self.nodes[i].home.exists() for i in wanted
        ):
            for index in wanted:
                self.start(index)
                time.sleep(stagger)
            return
        for index in wanted:
            self._spawn(index)
            time.sleep(stagger)
        for index in wanted:
            self._await(index)
        for kind in ("primary", "secondary"):
            slots = [i for i in wanted if self.nodes[i].kind == kind]
            eldest_first = sorted((self.nodes[i] for i in slots), key=lambda n: n.spid or "")
            for slot, node in zip(slots, eldest_first, strict=True):
                node.index = slot
                self.nodes[slot] = node

    def kill(self, index: int) -> float:
        """SIGKILL; returns the monotonic time of the kill."""
        node = self.nodes[index]
        assert node.process is not None and node.process.proc is not None
        node.process.proc.kill()
        killed = time.monotonic()
        node.ended_at[node.spid or ""] = time.time()
        node.process.proc.wait(5)
        node.paused = False
        return killed

    def pause(self, index: int) -> float:
        node = self.nodes[index]
        assert node.process is not None
        node.paused = True  # before the signal: samplers must skip it from now on
        node.process.signal(signal.SIGSTOP)
        node.paused_at.append(time.time())
        return time.monotonic()

    def resume(self, index: int) -> float:
        node = self.nodes[index]
        assert node.process is not None
        node.process.signal(signal.SIGCONT)
        node.paused = False
        return time.monotonic()

    def stop(self, index: int) -> int | None:
        node = self.nodes[index]
        if node.process is None:
            return None
        if node.paused and node.alive():
            node.process.signal(signal.SIGCONT)
            node.paused = False
        return node.process.stop()

    def close(self) -> None:
        """Resume every paused server, then stop them all (never raises)."""
        for node in self.nodes:
            if node.process is not None and node.alive():
                with contextlib.suppress(OSError):
                    node.process.signal(signal.SIGCONT)
            node.paused = False
        for node in self.nodes:
            if node.process is not None:
                try:
                    node.process.stop(timeout=5)
                except Exception:  # keep stopping the others
                    if node.process.proc is not None:
                        node.process.proc.kill()
        for node in self.nodes:
            if node.slow is not None:
                node.slow.close()

    # -- views -------------------------------------------------------------------

    def status(self, index: int, timeout: float = 0.5) -> View | None:
        """One server's ctl status, or None if it does not answer in time."""
        node = self.nodes[index]
        if not node.answering():
            return None
        try:
            reply = request(node.data_dir, "status", timeout=timeout)
        except (OSError, ValueError):
            return None
        return reply["result"] if reply.get("ok") else None

    def ctl(self, index: int, command: str, *args: str) -> dict[str, Any]:
        reply = request(self.nodes[index].data_dir, command, list(args), timeout=5)
        assert reply.get("ok"), f"ctl {command} {args} on {index}: {reply}"
        return reply["result"]

    def running(self) -> list[int]:
        return [n.index for n in self.nodes if n.alive()]

    def sample(self, indexes: Iterable[int] | None = None, timeout: float = 0.3) -> dict[int, View]:
        """Every answering server's view (paused, dead and silent ones are left out)."""
        out = {}
        for index in indexes if indexes is not None else self.running():
            view = self.status(index, timeout=timeout)
            if view is not None:
                out[index] = view
        return out

    def agreed_root(self, indexes: Iterable[int] | None = None) -> str | None:
        """The root every listed server (default: every running one) reports, all ready."""
        wanted = list(indexes) if indexes is not None else self.running()
        views = self.sample(wanted)
        if len(views) != len(wanted) or not views:
            return None
        roots = {v["root"] for v in views.values()}
        if len(roots) == 1 and all(v["ready"] for v in views.values()):
            return roots.pop()
        return None

    def settled_root(self, indexes: Iterable[int] | None = None) -> str | None:
        """Like ``agreed_root``, and every listed primary votes for it and sees a quorum.

        Right after formation the youngest primary may still be in its start
        window (abstaining), so the root's quorum rests on fewer votes than it
        seems; tests that then take a server away wait for this instead.
        """
        wanted = list(indexes) if indexes is not None else self.running()
        views = self.sample(wanted)
        if len(views) != len(wanted) or not views:
            return None
        roots = {v["root"] for v in views.values()}
        if len(roots) != 1 or not all(v["ready"] for v in views.values()):
            return None
        root = roots.pop()
        primaries = [v for v in views.values() if v["type"] == "primary"]
        if all(v["vote"] == root and v["quorum"] for v in primaries):
            return root
        return None

    def quiet_root(self, indexes: Iterable[int] | None = None) -> str | None:
        """Like ``settled_root``, and every listed primary holds all the root has:
        its state log and a whole copy of the root's replication stream.

        The election prefers the furthest log and copy before seniority, so a
        test that asserts the next senior takes over waits for this first: a
        primary one formation event behind the other would rightly lose.
        """
        wanted = list(indexes) if indexes is not None else self.running()
        root = self.settled_root(wanted)
        if root is None:
            return None
        views = self.sample(wanted)
        leader = [v for v in views.values() if v["spid"] == root]
        if len(views) != len(wanted) or len(leader) != 1:
            return None
        seq, term = leader[0]["state_seq"], leader[0]["state_term"]
        events = leader[0]["replication"]["seq"]
        for view in views.values():
            if view["type"] != "primary" or view is leader[0]:
                continue
            copies = view["copies"]
            if view["state_seq"] != seq or not copies["complete"]:
                return None
            if (copies["source"], copies["applied"]) != (root, events):
                return None
        # and every primary has heard so from the others (votes rank what the
        # last status said, not what the copy holds now)
        for view in views.values():
            for peer in view["peers"]:
                if peer["type"] != "primary" or not peer["active"] or peer["spid"] == root:
                    continue
                heard = (peer["state"], peer["copy"], peer["syncing"])
                if heard != ([root, term, seq], [root, events], False):
                    return None
        return root

    def root_intervals(self) -> dict[str, list[tuple[float, float]]]:
        """Each server's terms as root (wall clock), from its own log.

        ``root taken`` / ``root released`` are logged in the same step that
        changes the decision, with millisecond timestamps from the one clock
        all the servers share, so the terms are exact to the millisecond,
        unlike samples, whose answers are never quite simultaneous. A term
        ends at its release, at a kill, or at the first SIGSTOP within it (a
        frozen server acts on nothing; what it does after SIGCONT is checked
        by sampling); a term still running ends now.
        """
        now = time.time()
        terms: dict[str, list[tuple[float, float]]] = {}
        for node in self.nodes:
            if node.process is None:
                continue
            spans: list[tuple[str, float, float]] = []
            opened: dict[str, float] = {}
            for line in node.process.log_text().splitlines():
                match = ROOT_EVENT.match(line)
                if match is None:
                    continue
                at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                if match[2] == "taken":
                    opened[match[3]] = at
                elif match[3] in opened:
                    spans.append((match[3], opened.pop(match[3]), at))
            spans += [(spid, start, node.ended_at.get(spid, now)) for spid, start in opened.items()]
            for spid, start, end in spans:
                pauses = [p for p in node.paused_at if start <= p < end]
                terms.setdefault(spid, []).append((start, min([end, *pauses])))
        return terms

    def root_overlaps(self) -> list[tuple[str, str, float, float]]:
        """Pairs of terms of two servers that overlap by at least one millisecond."""
        terms = sorted(
            (start, end, spid)
            for spid, spans in self.root_intervals().items()
            for start, end in spans
        )
        overlaps = []
        for i, (_, end_a, spid_a) in enumerate(terms):
            for start_b, end_b, spid_b in terms[i + 1 :]:
                if spid_b != spid_a and start_b < end_a and min(end_a, end_b) - start_b >= 0.001:
                    overlaps.append((spid_a, spid_b, start_b, min(end_a, end_b)))
        return overlaps

    def spid(self, index: int) -> str:
        spid = self.nodes[index].spid
        assert spid is not None
        return spid

    def index_of(self, spid: str | None) -> int | None:
        return next((n.index for n in self.nodes if n.spid == spid), None)

    def root_index(self, timeout: float = 30.0) -> int:
        """The index of the root, once every running server agrees on it."""
        index = self.index_of(self.wait_until(self.settled_root, timeout, what="a settled root"))
        assert index is not None, "the settled root is not one of this cluster's servers"
        return index

    def start_settled(self, timeout: float = 30.0) -> int:
        """Start every server (oldest first) and wait for a settled root; its index."""
        self.start_all()
        return self.root_index(timeout)

    def followers(self, root: int) -> list[int]:
        """The primaries that are not ``root``, by index."""
        return [n.index for n in self.nodes if n.kind == "primary" and n.index != root]

    def describe(self) -> str:
        lines = []
        for index, view in self.sample().items():
            lines.append(f"  [{index}] {brief(view)}")
        for node in self.nodes:
            if node.process is None:
                continue
            tail = [
                line
                for line in node.process.log_text().splitlines()
                if " WARNING " in line or " ERROR " in line
            ][-6:]
            lines.append(f"  [{node.index}] log: " + "\n      ".join(tail))
        return "\n".join(lines)

    def wait_until(
        self,
        predicate: Callable[[], Any],
        timeout: float = 15.0,
        interval: float = 0.05,
        what: str = "condition",
    ) -> Any:
        """Poll until ``predicate()`` is truthy and return its value; fail with the views."""
        return eventually(
            predicate,
            timeout,
            what,
            interval=interval,
            # TypeError: a server not answering yet has no view to read (None)
            tolerate=(OSError, KeyError, ValueError, TypeError),
            explain=self.describe,
        )


@contextlib.contextmanager
def netbed_cluster(base: Path, primaries: int = 3, timeout: float = 1.0) -> Iterator[Cluster]:
    """``primaries`` servers, each in its own namespace on a network test bed, with a
    settled root; stopped, and the bed torn down, on the way out."""
    with NetBed(primaries) as bed:
        made = Cluster(base, primaries=primaries, timeout=timeout, netbed=bed)
        try:
            made.start_all()
            made.wait_until(made.settled_root, timeout=30, what="a settled root")
            yield made
        finally:
            made.close()
